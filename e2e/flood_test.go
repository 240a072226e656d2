package e2e

import (
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashgate/flashgate/window/redistest"
)

// TestKeyCardinalityFlood floods flashgate (built-in example rules, Redis
// backend) with distinct x-uid values: half from one flooding address, half
// spread over 65,536 addresses. 100,000 users, capped at 20 s (under -race
// on two cores the cap binds first; the achieved count is logged); -long or
// FLASHGATE_E2E_LONG=1 sends 1,000,000 with a 10-minute cap, a benchmark
// rather than a test. Asserts: flashgate's RSS stays under rssBound, every
// Redis key is set to expire within the window (1 s) + 1 s of the flood's
// end (its PEXPIRETIME, not how soon a poll on a busy machine notices) and
// then goes, and the per-IP rule (100/s) still limits the flooding address:
// never more than 100 admissions provably within one second, and a denial
// for each request beyond 100 provably within one second.
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
	// The flooding address's answers, reduced to their instants (no
	// response kept: -long sends half a million).
	var floodMu sync.Mutex // guards floodAll, floodAllowed
	var floodAll, floodAllowed []answer
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
					a := p.Check(coupon(uid, "10.6.0.1"))
					v := flood.add(a)
					at := answer{Sent: a.Sent, Latency: a.Latency}
					floodMu.Lock()
					if v != vError {
						floodAll = append(floodAll, at)
					}
					if v == vAllowed {
						floodAllowed = append(floodAllowed, at)
					}
					floodMu.Unlock()
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
	floodMu.Lock()
	admitted, decided := provablyWithin(floodAllowed, time.Second), provablyWithin(floodAll, time.Second)
	floodMu.Unlock()
	t.Logf("flooding IP: at most %d admissions and %d decisions provably within one second", admitted, decided)
	if admitted > 100 {
		t.Errorf("the flooding IP got %d admissions within one second: the per-IP rule allows 100", admitted)
	}
	switch {
	case decided <= 100:
		t.Errorf("the flooding IP never had more than 100 requests (%d) provably within one second: the per-IP rule was not exercised", decided)
	case flood.denied.Load() < int64(decided-100):
		t.Errorf("the flooding IP had %d requests within one second but only %d denials in all", decided, flood.denied.Load())
	}

	// Every key is set to expire by the window (1s) + 1s after the flood's
	// end: its PEXPIRETIME, a fact of Redis, not of how soon a poll on a
	// busy machine notices. Every check was answered (so its script ran)
	// before end. No rule the flood hits asks for a penalty box, so no
	// fleet-wide ban (K!ban) or denial count (K!bc) may appear.
	rc := redisClient(t, rs.Addr())
	scanned, err := scanKeys(bg(), rc, prefix+":{*") // limit keys; the fleet heartbeat lives as long as flashgate
	if err != nil {
		t.Fatalf("SCAN: %v", err)
	}
	var keysAtEnd []string
	for _, k := range scanned {
		if banKey(k) {
			t.Errorf("%q: a penalty-box key, but neither rule the flood hits (uid, ip) asks for a ban", k)
			continue
		}
		keysAtEnd = append(keysAtEnd, k)
	}
	expireBy := end.Add(2 * time.Second).UnixMilli()
	var latest int64
	var late, forever []string
	for i := 0; i < len(keysAtEnd); i += 1000 {
		batch := keysAtEnd[i:min(i+1000, len(keysAtEnd))]
		pipe := rc.Pipeline()
		cmds := make([]*redis.Cmd, len(batch))
		for j, k := range batch {
			cmds[j] = pipe.Do(bg(), "PEXPIRETIME", k)
		}
		if _, err := pipe.Exec(bg()); err != nil && err != redis.Nil {
			t.Fatalf("PEXPIRETIME: %v", err)
		}
		for j, c := range cmds {
			at, err := c.Int64()
			switch {
			case err != nil:
				t.Fatalf("PEXPIRETIME %s: %v", batch[j], err)
			case at == -1:
				forever = append(forever, batch[j])
			case at > expireBy:
				late = append(late, batch[j])
			}
			latest = max(latest, at)
		}
	}
	if len(forever) > 0 {
		t.Errorf("%d keys never expire, first %q", len(forever), forever[0])
	}
	if len(late) > 0 {
		t.Errorf("%d keys expire later than the window (1s) + 1s after the flood's end (the latest %s after it), first %q",
			len(late), time.UnixMilli(latest).Sub(end), late[0])
	}
	// And they go.
	var left int
	took, ok := waitFor(10*time.Second, func() bool {
		keys, err := scanKeys(bg(), rc, prefix+":{*")
		left = 0
		for _, k := range keys {
			if !banKey(k) {
				left++
			}
		}
		return err == nil && left == 0
	})
	t.Logf("%d keys in Redis at the flood's end, the last set to expire %s after it; all gone %s after it (%s of polling)",
		len(keysAtEnd), time.UnixMilli(latest).Sub(end), time.Since(end), took)
	if !ok {
		t.Errorf("%d keys still in Redis %s after the flood's end", left, time.Since(end))
	}
}

// banKey tells whether k is a fleet-wide ban's key (K!ban) or a penalty
// box's denial count (K!bc).
func banKey(k string) bool {
	return strings.HasSuffix(k, "!ban") || strings.HasSuffix(k, "!bc")
}
