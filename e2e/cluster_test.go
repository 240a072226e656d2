package e2e

import (
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/flashgate/flashgate/window/redistest"
	"github.com/redis/go-redis/v9"
)

// burstConcurrent sends n requests built by mk from 4 goroutines and
// returns their tally and answers.
func burstConcurrent(p *proc, n int, mk func(i int) req) (*tally, []answer) {
	var tl tally
	as := make([]answer, n)
	var wg sync.WaitGroup
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < n; i += 4 {
				as[i] = p.Check(mk(i))
				tl.add(as[i])
			}
		}()
	}
	wg.Wait()
	return &tl, as
}

// TestRedisCluster: on a Redis Cluster of 3 masters, auto-pipelined per
// master (serve's default), the built-in example
// rules hold (5 per user, 10 per device, 100 per IP, keys spread over
// nodes; checked with the windows stretched to a minute so that the bursts
// fall in one window however slow the machine), and migrating the slot of a
// busy key to another master under load (CLUSTER SETSLOT
// IMPORTING/MIGRATING, MIGRATE, SETSLOT NODE: ASK then MOVED redirects)
// causes no gRPC error and no denial beyond the failure mode (deny), after
// which the per-IP rule (100/s) still holds on the moved slot.
func TestRedisCluster(t *testing.T) {
	const prefix = "e2ecluster"
	cl := redistest.StartCluster(t, 3)
	addrs := cl.Addrs()
	p := startFlashgate(t, "--backend", "redis", "--redis-mode", "cluster",
		"--redis-addr", addrs[0]+","+addrs[1]+","+addrs[2], "--key-prefix", prefix,
		"--redis-timeout", "250ms", "--failure-mode", "deny", "--ban-duration", "0")
	nodes := make([]*redis.Client, len(addrs))
	for i, a := range addrs {
		nodes[i] = redisClient(t, a)
	}

	t.Run("example rules", func(t *testing.T) {
		// Decisions, not latency: a generous budget keeps a slow round trip
		// under -race from being denied by the failure mode.
		const rulesPrefix = "e2eclusterrules"
		p := startFlashgate(t, "--backend", "redis", "--redis-mode", "cluster",
			"--redis-addr", addrs[0]+","+addrs[1]+","+addrs[2], "--key-prefix", rulesPrefix,
			"--config", exampleStretched(t, "1m"), "--redis-timeout", "2s", "--failure-mode", "deny", "--ban-duration", "0")
		if as := burst(p, freshUID("cl"), "10.9.0.1", 6); !limitedAt5(as) {
			t.Errorf("6 requests of one user: want 5 allowed then denied, got %v", as)
		} else {
			mustDenied(t, as[5], 5, "user's 6th")
		}
		var dev []answer
		for i := 0; i < 11; i++ {
			dev = append(dev, p.Check(req{Path: "/api/coupon/x", IP: fmt.Sprintf("10.9.1.%d", i+1),
				Headers: map[string]string{"x-uid": freshUID("dev"), "x-device-fp": "device-1"}}))
		}
		if count(dev[:10], vAllowed) != 10 {
			t.Errorf("one device, 10 users: want 10 allowed, got %v", dev[:10])
		}
		mustDenied(t, dev[10], 10, "device's 11th")
		tl, as := burstConcurrent(p, 110, func(int) req { return req{Path: "/", IP: "10.9.2.1"} })
		t.Logf("one IP, 110 requests in %s: %s", span(as), tl)
		if tl.errors.Load() > 0 {
			t.Errorf("errors: %v", tl.Errs())
		}
		if tl.allowed.Load() != 100 || tl.denied.Load() != 10 {
			t.Errorf("one IP, 110 requests: %d admitted, %d denied, want 100 and 10", tl.allowed.Load(), tl.denied.Load())
		}
		var spread []string
		for i, n := range nodes {
			keys, err := scanKeys(bg(), n, rulesPrefix+":{*")
			if err != nil {
				t.Fatal(err)
			}
			spread = append(spread, fmt.Sprintf("%s: %d", addrs[i], len(keys)))
		}
		t.Logf("keys per master: %v", spread)
	})

	t.Run("slot migration under load", func(t *testing.T) {
		const busyIP = "10.9.3.1"
		m0 := p.Metrics()
		stop := make(chan struct{})
		var busy, bg1 tally
		var wg sync.WaitGroup
		// The busy IP, paced at 50/s (under its limit of 100/s), each request
		// a fresh user: every one goes to Redis and must be admitted.
		wg.Add(1)
		go func() {
			defer wg.Done()
			tick := time.NewTicker(20 * time.Millisecond)
			defer tick.Stop()
			for {
				select {
				case <-stop:
					return
				case <-tick.C:
				}
				busy.add(p.Check(coupon(freshUID("busy"), busyIP)))
			}
		}()
		wgLoad := load(p, 4, stop, &bg1, func(w, i int) req {
			return coupon(freshUID("mig"), fmt.Sprintf("10.9.4.%d", i%200+1))
		}, nil)
		time.Sleep(500 * time.Millisecond)

		// Find the busy IP's key, its slot and its master: waiting for it,
		// since on a busy machine the first paced checks may still be on
		// their way (or answered by the failure mode, which writes none).
		var key string
		src := -1
		waitFor(10*time.Second, func() bool {
			for i, n := range nodes {
				keys, _ := scanKeys(bg(), n, prefix+":*:per_ip:"+busyIP)
				if len(keys) == 1 {
					key, src = keys[0], i
				}
			}
			return key != ""
		})
		if key == "" {
			close(stop)
			wg.Wait()
			wgLoad.Wait()
			t.Fatalf("no key for the busy IP on any master within 10s of load")
		}
		dst := (src + 1) % len(nodes)
		slot, err := nodes[src].ClusterKeySlot(bg(), key).Result()
		if err != nil {
			t.Fatal(err)
		}
		srcID, _ := nodes[src].Do(bg(), "CLUSTER", "MYID").Text()
		dstID, _ := nodes[dst].Do(bg(), "CLUSTER", "MYID").Text()
		dstHost, dstPort, _ := net.SplitHostPort(addrs[dst])
		step := func(what string, c *redis.Client, args ...any) {
			if err := c.Do(bg(), args...).Err(); err != nil {
				t.Errorf("%s: %v", what, err)
			}
		}
		began := time.Now()
		step("SETSLOT IMPORTING", nodes[dst], "CLUSTER", "SETSLOT", slot, "IMPORTING", srcID)
		step("SETSLOT MIGRATING", nodes[src], "CLUSTER", "SETSLOT", slot, "MIGRATING", dstID)
		time.Sleep(300 * time.Millisecond) // requests meet a migrating slot
		moved := 0
		for {
			keys, err := nodes[src].ClusterGetKeysInSlot(bg(), int(slot), 10).Result()
			if err != nil {
				t.Fatalf("GETKEYSINSLOT: %v", err)
			}
			if len(keys) == 0 {
				break
			}
			args := []any{"MIGRATE", dstHost, dstPort, "", 0, 5000, "KEYS"}
			for _, k := range keys {
				args = append(args, k)
			}
			step("MIGRATE", nodes[src], args...)
			moved += len(keys)
			time.Sleep(50 * time.Millisecond) // ASK redirects meanwhile
		}
		time.Sleep(300 * time.Millisecond)
		step("SETSLOT NODE (dst)", nodes[dst], "CLUSTER", "SETSLOT", slot, "NODE", dstID)
		step("SETSLOT NODE (src)", nodes[src], "CLUSTER", "SETSLOT", slot, "NODE", dstID)
		for i, n := range nodes {
			if i != src && i != dst {
				step("SETSLOT NODE (other)", n, "CLUSTER", "SETSLOT", slot, "NODE", dstID)
			}
		}
		t.Logf("moved slot %d (%d keys, the busy IP's %s) from %s to %s in %s", slot, moved, key, addrs[src], addrs[dst], time.Since(began))
		time.Sleep(time.Second) // MOVED redirects
		// The busy IP's key lives on its new master (waiting, not looking
		// once: each paced check renews it, but one that the failure mode
		// answered does not).
		if _, ok := waitFor(5*time.Second, func() bool {
			n, err := nodes[dst].Exists(bg(), key).Result()
			return err == nil && n == 1
		}); !ok {
			t.Errorf("the busy IP's key is not on its new master %s after the migration", addrs[dst])
		}
		close(stop)
		wg.Wait()
		wgLoad.Wait()

		m1 := p.Metrics()
		fm := m1.Value("flashgate_failure_mode_decisions_total") - m0.Value("flashgate_failure_mode_decisions_total")
		be := m1.Value("flashgate_backend_errors_total") - m0.Value("flashgate_backend_errors_total")
		t.Logf("busy IP: %s; other load: %s; backend errors +%v, failure-mode decisions +%v", &busy, &bg1, be, fm)
		for _, kind := range m1.LabelValues("flashgate_backend_errors_total", "kind") {
			if d := m1.Value("flashgate_backend_errors_total", "kind", kind) - m0.Value("flashgate_backend_errors_total", "kind", kind); d > 0 {
				t.Logf("backend errors {kind=%q}: +%v", kind, d)
			}
		}
		if n := busy.errors.Load() + bg1.errors.Load(); n > 0 {
			t.Errorf("%d checks failed with a gRPC error, first: %v %v", n, busy.Errs(), bg1.Errs())
		}
		if d := float64(busy.denied.Load() + bg1.denied.Load()); d > fm {
			t.Errorf("%v denials of first-time users under their limits, but only %v failure-mode decisions: denials beyond the failure mode", d, fm)
		}
		if busy.denied.Load() > 0 {
			t.Logf("note: %d of the busy IP's paced requests were denied by the failure mode during the migration", busy.denied.Load())
		}

		// The rules still hold on the moved slot. The paced checks ended
		// before wg.Wait returned: after a whole window more the busy IP's
		// window is empty, and the burst is all its key sees.
		time.Sleep(time.Second + 100*time.Millisecond)
		fm0 := p.Metrics().Value("flashgate_failure_mode_decisions_total")
		tl, as := burstConcurrent(p, 110, func(int) req { return coupon(freshUID("after"), busyIP) })
		fmBurst := p.Metrics().Value("flashgate_failure_mode_decisions_total") - fm0
		t.Logf("busy IP after the migration, 110 requests in %s: %s; %d provably within one second; failure-mode decisions +%v",
			span(as), tl, provablyWithin(as, time.Second), fmBurst)
		if tl.errors.Load() > 0 {
			t.Errorf("errors: %v", tl.Errs())
		}
		checkLimit(t, "busy IP after the migration", as, 100, time.Second, int(fmBurst))
	})
}

// TestRedisClusterMasterDown: with one master of three killed, serve
// (default breaker and failure mode local) keeps deciding in Redis the
// checks whose keys live on the other two: the failure mode answers about
// a third of fresh users' checks, not all of them, and no check fails.
func TestRedisClusterMasterDown(t *testing.T) {
	cl := redistest.StartCluster(t, 3)
	addrs := cl.Addrs()
	p := startFlashgate(t, "--backend", "redis", "--redis-mode", "cluster",
		"--redis-addr", addrs[0]+","+addrs[1]+","+addrs[2], "--key-prefix", "e2emasterdown",
		"--config", "testdata/uid.yaml", "--redis-timeout", "250ms", "--ban-duration", "0")
	if tl, _ := burstConcurrent(p, 40, func(i int) req { return coupon(freshUID("warm"), "10.8.0.1") }); tl.allowed.Load() != 40 {
		t.Fatalf("before the kill: %s, want 40 allowed", tl)
	}
	cl.Nodes()[2].Kill()
	const n = 300
	m0 := p.Metrics()
	tl, _ := burstConcurrent(p, n, func(i int) req { return coupon(freshUID("down"), "10.8.0.2") })
	fm := p.Metrics().Value("flashgate_failure_mode_decisions_total") - m0.Value("flashgate_failure_mode_decisions_total")
	t.Logf("one master of three down, %d fresh users: %s; failure-mode decisions %v", n, tl, fm)
	m1 := p.Metrics()
	for _, kind := range m1.LabelValues("flashgate_backend_errors_total", "kind") {
		if d := m1.Value("flashgate_backend_errors_total", "kind", kind) - m0.Value("flashgate_backend_errors_total", "kind", kind); d > 0 {
			t.Logf("backend errors {kind=%q}: +%v", kind, d)
		}
	}
	if tl.errors.Load() > 0 {
		t.Errorf("errors: %v", tl.Errs())
	}
	if tl.allowed.Load() != n {
		t.Errorf("%d of %d fresh users allowed, want all (Redis or the local failure mode)", tl.allowed.Load(), n)
	}
	// The dead master holds a third of the slots: about n/3 checks take
	// the failure mode. All of them would mean one master held every
	// check off.
	if fm < 1 || fm > 0.6*n {
		t.Errorf("%v of %d checks took the failure mode, want about a third (at least 1, at most %v)", fm, n, 0.6*n)
	}
}
