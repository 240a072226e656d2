package e2e

import (
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/flashgate/flashgate/window/redistest"
	"github.com/redis/go-redis/v9"
)

// TestExactAcrossSidecars: three sidecars share one Redis, 32 callers each
// hammer one key limited to 20 per 500ms. The union of every timestamp the
// key's sorted set held (polled every ~20ms, since entries age out) must
// never put more than 20 entries in any 200ms span, and the limit must be
// reached.
func TestExactAcrossSidecars(t *testing.T) {
	const (
		limit   = 20
		window  = 500 * time.Millisecond
		callers = 32
		run     = 3 * time.Second
		prefix  = "e2eexact"
	)
	rs := redistest.Start(t)
	var procs []*proc
	for range 3 {
		procs = append(procs, startFlashgate(t,
			"--backend", "redis", "--redis-addr", rs.Addr(), "--key-prefix", prefix,
			"--config", "testdata/exact.yaml", "--ban-duration", "0",
			// Redis decides: a generous budget and no local fallback, so a
			// slow round trip under -race cannot admit on its own.
			"--redis-timeout", "1s", "--failure-mode", "deny"))
	}
	rc := redisClient(t, rs.Addr())

	stop := make(chan struct{})
	var tl tally
	var wgs []*sync.WaitGroup
	for _, p := range procs {
		wgs = append(wgs, load(p, callers, stop, &tl, func(w, i int) req { return coupon("hot", "10.0.0.1") }, nil))
	}

	// Poll the key's sorted set and union member → score.
	// The poller starts with the load, and every gap between polls counts:
	// a gap as long as the window could miss entries.
	seen := map[string]float64{}
	var key string
	var polls, maxGap int
	var lastPoll time.Time
	readSet := func() {
		zs, err := rc.ZRangeWithScores(bg(), key, 0, -1).Result()
		if err != nil && err != redis.Nil {
			t.Fatalf("ZRANGE %s: %v", key, err)
		}
		for _, z := range zs {
			seen[z.Member.(string)] = z.Score
		}
	}
	deadline := time.Now().Add(run)
	for time.Now().Before(deadline) {
		if !lastPoll.IsZero() {
			maxGap = max(maxGap, int(time.Since(lastPoll)/time.Millisecond))
		}
		lastPoll = time.Now()
		if key == "" {
			keys, err := scanKeys(bg(), rc, prefix+":*")
			if err != nil {
				t.Fatalf("SCAN: %v", err)
			}
			if len(keys) > 1 {
				t.Fatalf("one user on one rule made %d keys: %q", len(keys), keys)
			}
			if len(keys) == 1 {
				key = keys[0]
			}
		}
		if key != "" {
			readSet()
			polls++
		}
		time.Sleep(20 * time.Millisecond)
	}
	close(stop)
	for _, wg := range wgs {
		wg.Wait()
	}
	// A last poll for what was admitted while the callers stopped.
	if key != "" {
		readSet()
		if !lastPoll.IsZero() {
			maxGap = max(maxGap, int(time.Since(lastPoll)/time.Millisecond))
		}
	}
	t.Logf("key %s; %s; %d polls, longest gap %dms; %d distinct entries seen", key, &tl, polls, maxGap, len(seen))
	if n := tl.errors.Load(); n > 0 {
		t.Errorf("%d checks failed, first: %v", n, tl.Errs())
	}
	if key == "" {
		t.Fatalf("no key under prefix %s appeared in Redis", prefix)
	}
	complete := maxGap < int(window/time.Millisecond)
	if !complete {
		t.Logf("warning: a poll gap of %dms ≥ the window may have missed entries", maxGap)
	}

	scores := make([]float64, 0, len(seen))
	for _, s := range seen {
		scores = append(scores, s)
	}
	sort.Float64s(scores)
	winUS := float64(window / time.Microsecond)
	// Every span [s, s+window) holds at most limit entries iff entries limit
	// apart are at least window apart.
	var violations int
	for i := 0; i+limit < len(scores); i++ {
		if d := scores[i+limit] - scores[i]; d < winUS {
			if violations < 5 {
				t.Errorf("entries %d and %d are %.0fµs apart: %d entries in less than %s", i, i+limit, d, limit+1, window)
			}
			violations++
		}
	}
	if violations > 0 {
		t.Errorf("%d windows over the limit of %d per %s", violations, limit, window)
	}
	// The limit is reached: some window holds exactly limit entries.
	full := false
	for i := 0; i+limit-1 < len(scores); i++ {
		if scores[i+limit-1]-scores[i] < winUS {
			full = true
			break
		}
	}
	if !full {
		t.Errorf("no %s span held %d entries: the limit was never reached (%d entries)", window, limit, len(scores))
	}
	// Every admission is in Redis (a timed-out script may add entries that
	// were answered by the failure mode, never the other way round).
	if a := tl.allowed.Load(); complete && a > int64(len(seen)) {
		t.Errorf("%d checks were admitted but Redis only ever held %d entries", a, len(seen))
	}
	if len(scores) > 0 {
		span := time.Duration(scores[len(scores)-1]-scores[0]) * time.Microsecond
		maxAdmits := int64(limit) * (int64(span/window) + 1)
		if a := tl.allowed.Load(); a > maxAdmits {
			t.Errorf("%d admissions over %s; at most %d fit", a, span, maxAdmits)
		}
	}
}
