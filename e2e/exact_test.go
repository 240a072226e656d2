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
// key's sorted set held (polled, since entries age out) must never put more
// than 20 entries in any 500ms span, and the limit must be reached.
//
// The timestamps are Redis's, so these checks hold however slow the
// machine. The poll is complete when no two successive ZRANGEs (from the
// load's start to the last one) are a window or more apart, measured from
// one's send to the next one's reply, the widest they can have run apart;
// only then does "every admission is in Redis" apply.
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
	// Nothing is admitted before loadStart: it counts as a poll of the
	// empty key.
	loadStart := time.Now()
	for _, p := range procs {
		wgs = append(wgs, load(p, callers, stop, &tl, func(w, i int) req { return coupon("hot", "10.0.0.1") }, nil))
	}

	// Poll the key's sorted set and union member → score.
	seen := map[string]float64{}
	var key string
	var polls int
	var maxGap time.Duration
	lastSent := loadStart
	// poll runs one SCAN (until the key is known) or ZRANGE; a poll that
	// finds no key sees every entry there is.
	poll := func() {
		sent := time.Now()
		if key == "" {
			keys, err := scanKeys(bg(), rc, prefix+":{*") // limit keys, not the fleet's heartbeat
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
			zs, err := rc.ZRangeWithScores(bg(), key, 0, -1).Result()
			if err != nil && err != redis.Nil {
				t.Fatalf("ZRANGE %s: %v", key, err)
			}
			for _, z := range zs {
				seen[z.Member.(string)] = z.Score
			}
			polls++
		}
		maxGap = max(maxGap, time.Since(lastSent))
		lastSent = sent
	}
	deadline := loadStart.Add(run)
	for time.Now().Before(deadline) {
		poll()
		time.Sleep(20 * time.Millisecond)
	}
	close(stop)
	for _, wg := range wgs {
		wg.Wait()
	}
	loadEnd := time.Now()
	// A last poll for what was admitted while the callers stopped.
	poll()
	t.Logf("key %s; %s; %d polls, longest gap %s; %d distinct entries seen", key, &tl, polls, maxGap, len(seen))
	if n := tl.errors.Load(); n > 0 {
		t.Errorf("%d checks failed, first: %v", n, tl.Errs())
	}
	if key == "" {
		t.Fatalf("no key under prefix %s appeared in Redis", prefix)
	}
	complete := maxGap < window
	if !complete {
		t.Logf("warning: a poll gap of %s ≥ the window may have missed entries", maxGap)
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
	// However many entries the polls missed: every admission happened
	// between loadStart and loadEnd, so at most limit per window of that.
	maxAdmits := int64(limit) * (int64(loadEnd.Sub(loadStart)/window) + 1)
	if a := tl.allowed.Load(); a > maxAdmits {
		t.Errorf("%d admissions over %s; at most %d fit", a, loadEnd.Sub(loadStart), maxAdmits)
	}
}
