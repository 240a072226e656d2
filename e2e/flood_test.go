package e2e

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flashgate/flashgate/window/redistest"
)

// TestKeyCardinalityFlood floods flashgate (built-in example rules, Redis
// backend) with distinct x-uid values: half from one flooding address, half
// spread over 65,536 addresses. 100,000 users, capped at 20 s (under -race
// on two cores the cap binds first; the achieved count is logged); -long or
// FLASHGATE_E2E_LONG=1 sends 1,000,000 with a 10-minute cap, a benchmark
// rather than a test. Asserts: flashgate's RSS stays under rssBound, every
// Redis key expires within the window (1 s) + 1 s of the flood's end, and
// the per-IP rule (100/s) still limits the flooding address.
func TestKeyCardinalityFlood(t *testing.T) {
	const prefix = "e2eflood"
	users, capTime := 100_000, 20*time.Second
	if long() {
		users, capTime = 1_000_000, 10*time.Minute
	}
	// rssBound: the documented bound on flashgate's RSS under the flood:
	// the Go runtime, gRPC buffers of 32 callers, the Redis pool and the
	// local caches' 32 MiB budget (--local-cache-size). A -race binary keeps
	// shadow memory for all of it, hence the wider bound.
	rssBound := int64(160 << 20)
	if raceEnabled {
		rssBound = 640 << 20
	}
	rs := redistest.Start(t)
	p := startFlashgate(t, "--backend", "redis", "--redis-addr", rs.Addr(), "--key-prefix", prefix,
		"--redis-timeout", "1s", "--failure-mode", "local", "--local-cache-size", "32MiB")
	rss0, _ := p.RSS()

	var next atomic.Int64
	var flood, spread tally
	stop := make(chan struct{})
	var wg sync.WaitGroup
	start := time.Now()
	for w := 0; w < 32; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				n := next.Add(1)
				if n > int64(users) {
					return
				}
				uid := fmt.Sprintf("flood-%d", n)
				if n%2 == 0 {
					flood.add(p.Check(coupon(uid, "10.6.0.1")))
				} else {
					spread.add(p.Check(coupon(uid, fmt.Sprintf("10.5.%d.%d", (n/2)%256, (n/512)%256))))
				}
			}
		}()
	}
	var peak int64
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			if rss, err := p.RSS(); err == nil {
				peak = max(peak, rss)
			}
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(capTime):
	}
	close(stop)
	wg.Wait()
	end := time.Now()
	<-sampled
	elapsed := end.Sub(start)
	sent := min(next.Load(), int64(users))
	t.Logf("%d distinct users in %s (%.0f/s); flooding IP: %s; spread: %s", sent, elapsed, float64(sent)/elapsed.Seconds(), &flood, &spread)
	t.Logf("flashgate RSS: %.1f MiB before, peak %.1f MiB (bound %d MiB)", float64(rss0)/(1<<20), float64(peak)/(1<<20), rssBound>>20)
	if n := flood.errors.Load() + spread.errors.Load(); n > 0 {
		t.Errorf("%d checks failed, first: %v %v", n, flood.Errs(), spread.Errs())
	}
	if peak > rssBound {
		t.Errorf("flashgate's RSS peaked at %.1f MiB, over the bound of %d MiB", float64(peak)/(1<<20), rssBound>>20)
	}
	if maxFlood := int64(100 * (int(elapsed/time.Second) + 1)); flood.allowed.Load() > maxFlood {
		t.Errorf("the flooding IP got %d admissions in %s: the per-IP rule (100/s) allows at most %d", flood.allowed.Load(), elapsed, maxFlood)
	}
	if flood.denied.Load() == 0 {
		t.Errorf("the flooding IP was never denied")
	}

	rc := redisClient(t, rs.Addr())
	keysAtEnd, _ := scanKeys(bg(), rc, prefix+":*")
	var left int
	took, ok := waitFor(5*time.Second, func() bool {
		keys, err := scanKeys(bg(), rc, prefix+":*")
		left = len(keys)
		return err == nil && left == 0
	})
	sinceEnd := time.Since(end)
	t.Logf("%d keys in Redis at the flood's end; all gone %s after it (%s of polling)", len(keysAtEnd), sinceEnd, took)
	if !ok {
		t.Errorf("%d keys still in Redis %s after the flood's end", left, sinceEnd)
	} else if sinceEnd > 2*time.Second+margin() {
		t.Errorf("the last key expired %s after the flood's end, want within window 1s + 1s", sinceEnd)
	}
}
