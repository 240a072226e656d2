package e2e

import (
	"fmt"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashgate/flashgate/window"
	"github.com/flashgate/flashgate/window/redistest"
)

// TestExactAcrossSidecarsCluster: three sidecars auto-pipelined on a
// Redis Cluster of three masters, 16 callers each hammering one user
// limited to 20 per second, every request also hitting its caller IP's key
// on another master. The union of the user key's entries (polled) never
// puts more than 20 in any 1 s span, the limit is reached, every admission
// is in Redis, and the IP keys hold no request the user's key denied (the
// admission on the IP's master is taken back: the IP's rule is bucketed,
// so its key records the requests' ids beside its counters).
func TestExactAcrossSidecarsCluster(t *testing.T) {
	const (
		limit   = 20
		win     = time.Second
		callers = 16
		run     = 4 * time.Second
		prefix  = "e2eclexact"
	)
	cl := redistest.StartCluster(t, 3)
	addrs := cl.Addrs()
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, DisableIdentity: true, Protocol: 2,
		ReadTimeout: 2 * time.Second, WriteTimeout: 2 * time.Second})
	t.Cleanup(func() { cc.Close() })
	keys, err := window.NewKeys(prefix)
	if err != nil {
		t.Fatal(err)
	}
	var procs []*proc
	for range 3 {
		procs = append(procs, startFlashgate(t,
			"--backend", "redis", "--redis-mode", "cluster", "--redis-addr", addrs[0]+","+addrs[1]+","+addrs[2],
			"--key-prefix", prefix, "--config", "testdata/exact_cluster.yaml", "--ban-duration", "0",
			"--redis-timeout", "1s", "--failure-mode", "deny"))
	}
	master := func(key string) string {
		m, err := cc.MasterForKey(bg(), key)
		if err != nil {
			t.Fatalf("MasterForKey: %v", err)
		}
		return m.Options().Addr
	}
	// The user's key, made by a first admission.
	if a := procs[0].Check(coupon("hot", "10.7.1.1")); a.Verdict() != vAllowed {
		t.Fatalf("the first request = %v, want allowed", a)
	}
	var uidKey string
	for _, a := range addrs {
		ks, err := scanKeys(bg(), redisClient(t, a), prefix+":{*}:coupon_per_uid:*")
		if err != nil {
			t.Fatal(err)
		}
		if len(ks) == 1 {
			uidKey = ks[0]
		}
	}
	if uidKey == "" {
		t.Fatal("no master holds the user's key after its first admission")
	}
	// Caller IPs whose keys are on another master than the user's.
	var ips []string
	for i := 1; len(ips) < 3; i++ {
		ip := fmt.Sprintf("10.7.0.%d", i)
		if master(keys.Key("per_ip", ip)) != master(uidKey) {
			ips = append(ips, ip)
		}
	}

	stop := make(chan struct{})
	var tl tally
	var wgs []*sync.WaitGroup
	loadStart := time.Now()
	for i, p := range procs {
		ip := ips[i]
		wgs = append(wgs, load(p, callers, stop, &tl, func(w, i int) req { return coupon("hot", ip) }, nil))
	}
	seen := map[string]float64{}
	var polls int
	var maxGap time.Duration
	lastSent := loadStart
	poll := func() {
		sent := time.Now()
		zs, err := cc.ZRangeWithScores(bg(), uidKey, 0, -1).Result()
		if err != nil && err != redis.Nil {
			t.Fatalf("ZRANGE %s: %v", uidKey, err)
		}
		for _, z := range zs {
			seen[z.Member.(string)] = z.Score
		}
		polls++
		maxGap = max(maxGap, time.Since(lastSent))
		lastSent = sent
	}
	for deadline := loadStart.Add(run); time.Now().Before(deadline); {
		poll()
		time.Sleep(20 * time.Millisecond)
	}
	close(stop)
	for _, wg := range wgs {
		wg.Wait()
	}
	loadEnd := time.Now()
	poll()
	t.Logf("key %s on %s, IPs on others; %s; %d polls, longest gap %s; %d distinct entries seen",
		uidKey, master(uidKey), &tl, polls, maxGap, len(seen))
	if n := tl.errors.Load(); n > 0 {
		t.Errorf("%d checks failed, first: %v", n, tl.Errs())
	}
	complete := maxGap < win
	if !complete {
		t.Logf("warning: a poll gap of %s ≥ the window may have missed entries", maxGap)
	}
	scores := make([]float64, 0, len(seen))
	for _, s := range seen {
		scores = append(scores, s)
	}
	sort.Float64s(scores)
	winUS := float64(win / time.Microsecond)
	violations := 0
	for i := 0; i+limit < len(scores); i++ {
		if d := scores[i+limit] - scores[i]; d < winUS {
			if violations < 5 {
				t.Errorf("entries %d and %d are %.0fµs apart: %d entries in less than %s", i, i+limit, d, limit+1, win)
			}
			violations++
		}
	}
	if violations > 0 {
		t.Errorf("%d windows over the limit of %d per %s", violations, limit, win)
	}
	full := false
	for i := 0; i+limit-1 < len(scores); i++ {
		if scores[i+limit-1]-scores[i] < winUS {
			full = true
			break
		}
	}
	if !full {
		t.Errorf("no %s span held %d entries: the limit was never reached (%d entries)", win, limit, len(scores))
	}
	if a := tl.allowed.Load(); complete && a > int64(len(seen)) {
		t.Errorf("%d checks were admitted but Redis only ever held %d entries", a, len(seen))
	}
	maxAdmits := int64(limit) * (int64(loadEnd.Sub(loadStart)/win) + 1)
	if a := tl.allowed.Load(); a > maxAdmits {
		t.Errorf("%d admissions over %s; at most %d fit", a, loadEnd.Sub(loadStart), maxAdmits)
	}
	// Every request the IP keys still hold was admitted by the user's key:
	// a denial there took back the IP's entry.
	if complete {
		for _, ip := range ips {
			// The IP's rule is bucketed (a large limit): its key holds
			// sub-window counters (scores up to 1e12) and the member ids
			// of the requests it admitted lately, scored by time.
			ms, err := cc.ZRangeByScore(bg(), keys.Key("per_ip", ip), &redis.ZRangeBy{Min: "(1000000000000", Max: "+inf"}).Result()
			if err != nil {
				t.Fatalf("ZRANGE the IP key of %s: %v", ip, err)
			}
			stray := 0
			for _, m := range ms {
				if _, ok := seen[m]; !ok {
					stray++
				}
			}
			if stray > 0 {
				t.Errorf("the IP key of %s holds %d of %d requests the user's key never held", ip, stray, len(ms))
			}
			if len(ms) == 0 && ip == ips[0] {
				t.Errorf("the IP key of %s is empty: the requests did not reach its master", ip)
			}
		}
	}
}
