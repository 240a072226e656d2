package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/flashgate/flashgate/window/redistest"
)

// fillRedis writes about 2 MB into the Redis at addr, then limits it to
// 1 MB with maxmemory-policy noeviction: it answers reads and PINGs, and
// refuses every write with OOM.
func fillRedis(t *testing.T, addr string) {
	t.Helper()
	rc := redisClient(t, addr)
	value := strings.Repeat("x", 8<<10)
	for i := range 256 {
		if err := rc.Set(bg(), fmt.Sprintf("filler:%d", i), value, 0).Err(); err != nil {
			t.Fatalf("fill Redis: %v", err)
		}
	}
	for _, kv := range [][2]string{{"maxmemory-policy", "noeviction"}, {"maxmemory", "1mb"}} {
		if err := rc.ConfigSet(bg(), kv[0], kv[1]).Err(); err != nil {
			t.Fatalf("CONFIG SET %s %s: %v", kv[0], kv[1], err)
		}
	}
	if err := rc.Set(bg(), "filler:more", "x", 0).Err(); err == nil || !strings.Contains(err.Error(), "OOM") {
		t.Fatalf("a write to the full Redis: err = %v, want OOM", err)
	}
}

// TestWarmupBounded: a sidecar started while Redis refuses writes (full,
// noeviction) or is down turns SERVING after --warmup-timeout, answers by
// its failure mode, says so once and counts it, and keeps warming up: once
// Redis takes writes again, Redis decides.
func TestWarmupBounded(t *testing.T) {
	for _, tc := range []struct {
		name, mode string
		fault      func(t *testing.T, rs *redistest.Server)
		heal       func(t *testing.T, rs *redistest.Server)
	}{
		{
			name: "refusing writes", mode: "local",
			fault: func(t *testing.T, rs *redistest.Server) { fillRedis(t, rs.Addr()) },
			heal: func(t *testing.T, rs *redistest.Server) {
				if err := redisClient(t, rs.Addr()).ConfigSet(bg(), "maxmemory", "0").Err(); err != nil {
					t.Fatalf("CONFIG SET maxmemory 0: %v", err)
				}
			},
		},
		{
			name: "down", mode: "deny",
			fault: func(_ *testing.T, rs *redistest.Server) { rs.Kill() },
			heal:  func(_ *testing.T, rs *redistest.Server) { rs.Restart() },
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			prefix := "e2ewarm" + tc.mode
			rs := redistest.Start(t)
			tc.fault(t, rs)
			// startFlashgate waits for SERVING, which only the bound brings.
			p := startFlashgate(t, "--backend", "redis", "--redis-addr", rs.Addr(), "--key-prefix", prefix,
				"--config", "testdata/faults.yaml", "--ban-duration", "0", "--failure-mode", tc.mode,
				"--redis-timeout", "100ms", "--warmup-timeout", "1s")
			if code, err := p.Readyz(); err != nil || code != 200 {
				t.Errorf("/readyz after the warm-up bound: %d %v, want 200", code, err)
			}

			// The failure mode decides a user's requests. No heartbeat
			// answered, so local enforces the whole limit in this sidecar.
			as := burst(p, freshUID("warm"), "10.0.0.1", 8)
			switch tc.mode {
			case "local":
				if count(as[:5], vAllowed) != 5 || count(as[5:], vDenied) != 3 {
					t.Errorf("failure mode local: 8 requests of one user: want 5 allowed then 3 denied, got %v", as)
				}
			case "deny":
				if count(as, vDenied) != 8 {
					t.Errorf("failure mode deny: 8 requests of one user: want 8 denied, got %v", as)
				}
			}
			m := p.Metrics()
			if v := m.Value("flashgate_warmup_expired_total"); v != 1 {
				t.Errorf("flashgate_warmup_expired_total = %v, want 1", v)
			}
			if v := m.Value("flashgate_backend_warm"); v != 0 {
				t.Errorf("flashgate_backend_warm = %v while Redis fails, want 0", v)
			}
			if v := m.Value("flashgate_failure_mode_decisions_total", "mode", tc.mode); v < 3 {
				t.Errorf("flashgate_failure_mode_decisions_total{mode=%q} = %v, want ≥ 3", tc.mode, v)
			}
			const said = "redis warm-up did not finish within --warmup-timeout"
			if n := strings.Count(p.Output(), said); n != 1 {
				t.Errorf("%q logged %d times, want once", said, n)
			}

			// Redis takes writes again: the warm-up that went on completes,
			// and Redis decides.
			tc.heal(t, rs)
			if _, ok := waitFor(30*time.Second, func() bool { return p.Metrics().Value("flashgate_backend_warm") == 1 }); !ok {
				t.Fatalf("flashgate_backend_warm still 0 30s after Redis healed")
			}
			untilRedisDecides(t, p, rs.Addr(), prefix, 30*time.Second)
			if st, err := p.HealthStatus(); err != nil || st.String() != "SERVING" {
				t.Errorf("health after Redis healed: %v %v, want SERVING", st, err)
			}
		})
	}
}
