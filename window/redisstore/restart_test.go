package redisstore

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashgate/flashgate/window"
	"github.com/flashgate/flashgate/window/fallback"
	"github.com/flashgate/flashgate/window/redistest"
	"github.com/flashgate/flashgate/window/testclock"
)

// restarts counts the restarts a client reports, and passes them on to a
// fallback once one is set.
type restarts struct {
	n  atomic.Int64
	to atomic.Pointer[fallback.Fallback]
}

func (r *restarts) Restarted() {
	r.n.Add(1)
	if f := r.to.Load(); f != nil {
		f.Restarted()
	}
}

// TestRestartFoundOnNewConnection: after Redis restarts, the client's
// first connection to it fails with ErrRestarted (a connection error,
// not retried) and the listener is told once; no command reaches the
// restarted Redis before; the connections after pass. Sentinel mode's
// connections to the sentinel are not taken for a restart.
func TestRestartFoundOnNewConnection(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		cfg  func(master *redistest.Server) ClientConfig
	}{
		{"standalone", func(m *redistest.Server) ClientConfig { return ClientConfig{Addrs: []string{m.Addr()}} }},
		{"sentinel", func(m *redistest.Server) ClientConfig {
			return ClientConfig{Addrs: []string{redistest.StartSentinel(t, m, "fgmaster").Addr()}, MasterName: "fgmaster"}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			master := redistest.Start(t)
			cfg := tc.cfg(master)
			rs := &restarts{}
			cfg.Restarts = rs
			c := newTestClient(t, cfg)
			ctx := context.Background()
			for range 3 {
				if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
					t.Fatal(err)
				}
			}
			if n := rs.n.Load(); n != 0 {
				t.Fatalf("%d restarts reported before any", n)
			}
			master.Restart() // empty
			deadline := time.Now().Add(15 * time.Second)
			found := false
			for {
				err := c.Get(ctx, "k").Err()
				if err == nil || errors.Is(err, redis.Nil) {
					break
				}
				if errors.Is(err, ErrRestarted) {
					if k := window.Classify(err); k != window.KindConnection {
						t.Fatalf("ErrRestarted classified %v, want a connection error", k)
					}
					found = true
				}
				if time.Now().After(deadline) {
					t.Fatalf("Redis not back within 15s: %v", err)
				}
				time.Sleep(5 * time.Millisecond)
			}
			if !found {
				t.Fatal("a command reached the restarted Redis without ErrRestarted first")
			}
			for range 3 {
				if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
					t.Fatalf("after the restart was reported: %v", err)
				}
			}
			if n := rs.n.Load(); n != 1 {
				t.Fatalf("%d restarts reported, want 1", n)
			}
		})
	}
}

// TestWriteBackUnseenRestartSettles: a sidecar whose last answer from Redis
// said the key is full makes no call while Redis is killed and restarted
// empty (its checks were all refused above it), so no call of its fails.
// Its first checks after the return, all at once, are still not decided
// by the empty Redis: the new connection finds the restart, and the
// sidecar holds Redis off until it has found Redis back and its settle has
// passed, as after an outage it met; then Redis decides again. (A check
// whose answer it refused may have been counted by Redis: stricter.)
func TestWriteBackUnseenRestartSettles(t *testing.T) {
	s := redistest.Start(t)
	rs := &restarts{}
	c := newTestClient(t, ClientConfig{Addrs: []string{s.Addr()}, Restarts: rs})
	r := newTestRedis(t, c, Options{})
	clock := testclock.New()
	const settle = time.Second
	sc := newSidecar(t, r, r, fallback.Options{Now: clock.Now, Settle: settle})
	rs.to.Store(sc.f)
	const limit = 3
	h := hit(testKeys(t).Key("uid", "quiet"), limit, time.Minute)
	for i := range limit + 1 {
		if d, _ := sc.untilRedis(t, h); d.Allowed != (i < limit) {
			t.Fatalf("Redis's decision %d before the outage: %+v", i, d)
		}
	}
	s.Restart() // killed and restarted empty; no call in between

	const burst = 8
	var wg sync.WaitGroup
	byRedis := make([]bool, burst)
	for i := range burst {
		wg.Go(func() { _, byRedis[i], _ = sc.check(t, h) })
	}
	wg.Wait()
	for i, b := range byRedis {
		if b {
			t.Fatalf("check %d of the first %d after the return decided by the empty Redis", i, burst)
		}
	}
	deadline := time.Now().Add(15 * time.Second)
	for sc.f.WriteBack().Returns == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("Redis not found back within 15s: %+v", sc.f.WriteBack())
		}
		if d, byRedis, _ := sc.check(t, h); byRedis || d.Allowed {
			t.Fatalf("before Redis was found back: %+v, by Redis %v; want a local denial (the key was full)", d, byRedis)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if d, byRedis, err := sc.check(t, h); byRedis || d.Allowed || !errors.Is(err, fallback.ErrRestoring) {
		t.Fatalf("within the settle: %+v, by Redis %v, %v; want fallback.ErrRestoring and a local denial", d, byRedis, err)
	}
	if n := rs.n.Load(); n != 1 {
		t.Fatalf("%d restarts reported, want 1", n)
	}
	// A check of the burst whose connection error came after the return
	// was found begins another outage: stricter, and its settle too ends.
	deadline = time.Now().Add(15 * time.Second)
	for {
		clock.Advance(settle)
		if _, byRedis, _ := sc.check(t, h); byRedis {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no decision by Redis within 15s past the settle: %+v", sc.f.WriteBack())
		}
		time.Sleep(5 * time.Millisecond)
	}
}
