package extauthz

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/flashgate/flashgate/descriptors"
	"github.com/flashgate/flashgate/enforce"
	"github.com/flashgate/flashgate/window"
	"github.com/flashgate/flashgate/window/fallback"
	"github.com/flashgate/flashgate/window/guard"
	"github.com/flashgate/flashgate/window/redisstore"
	"github.com/flashgate/flashgate/window/redistest"
)

// TestRedisFailureModes runs the example rules on a real redis-server,
// kills it, checks each failure mode, restarts it and checks that checks go
// back to Redis once the breaker lets a probe through.
func TestRedisFailureModes(t *testing.T) {
	rs := redistest.Start(t)
	// Generous: a slow EVALSHA on a loaded CI box must not turn into a
	// failure-mode decision while Redis is up. The outage is a refused
	// connection, answered at once whatever the budget.
	const timeout = 500 * time.Millisecond
	client, err := redisstore.NewClient(redisstore.ClientConfig{Addrs: []string{rs.Addr()}, Timeout: timeout})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Close() })
	red, err := redisstore.New(client, redisstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := descriptors.ExampleConfig()
	if err != nil {
		t.Fatal(err)
	}

	modes := []enforce.FailureMode{enforce.FailureLocal, enforce.FailureAllow, enforce.FailureDeny}
	envs := map[enforce.FailureMode]*env{}
	for _, mode := range modes {
		mem, err := fallback.New(fallback.Options{})
		if err != nil {
			t.Fatal(err)
		}
		keys, err := window.NewKeys("t" + mode.String())
		if err != nil {
			t.Fatal(err)
		}
		reg := prometheus.NewRegistry()
		bud, err := guard.NewBudget(red, guard.BudgetOptions{Min: timeout, Max: timeout})
		if err != nil {
			t.Fatal(err)
		}
		br, err := guard.NewBreaker(bud, guard.BreakerOptions{Cooldown: 100 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		core, err := enforce.New(enforce.Options{Limiter: br, Fallback: mem, FailureMode: mode, Registerer: reg})
		if err != nil {
			t.Fatal(err)
		}
		s, err := NewServer(cfg, Options{Core: core, Keys: keys})
		if err != nil {
			t.Fatal(err)
		}
		envs[mode] = &env{t: t, srv: s, reg: reg}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	for _, mode := range modes {
		e := envs[mode]
		if err := red.Ping(ctx); err != nil {
			t.Fatalf("%s: %v", mode, err)
		}
		if got := e.run(req{path: "/api/coupon/a", headers: uid("up")}, 7); got != 5 {
			t.Errorf("%s, Redis up: allowed %d of 7, want 5", mode, got)
		}
	}

	rs.Kill()
	want := map[enforce.FailureMode]int{enforce.FailureLocal: 5, enforce.FailureAllow: 7, enforce.FailureDeny: 0}
	for _, mode := range modes {
		t.Run("down/"+mode.String(), func(t *testing.T) {
			e := envs[mode]
			e.t = t
			r := req{path: "/api/coupon/a", headers: uid("down")}
			allowed := 0
			for i := range 7 {
				start := time.Now()
				a := e.check(r)
				if took := time.Since(start); took > timeout+500*time.Millisecond {
					t.Errorf("check %d took %s with a %s budget", i, took, timeout)
				}
				if a.allowed {
					allowed++
				}
			}
			if allowed != want[mode] {
				t.Errorf("allowed %d of 7, want %d", allowed, want[mode])
			}
			if got := e.counter("failure_mode", mode.String()); got != 7 {
				t.Errorf("failure_mode{%s} = %v, want 7", mode, got)
			}
			var errs float64
			for _, k := range []string{window.KindConnection.String(), window.KindTimeout.String(), window.KindBreakerOpen.String(), window.KindOther.String()} {
				errs += e.counter("backend_errors", k)
			}
			if errs != 7 {
				t.Errorf("backend errors %v, want 7", errs)
			}
		})
	}

	rs.Restart()
	for _, mode := range modes {
		e := envs[mode]
		e.t = t
		// Once the breaker's probe succeeds, checks reach Redis again.
		deadline := time.Now().Add(5 * time.Second)
		for i := 0; ; i++ {
			before := e.counter("failure_mode", mode.String())
			e.check(req{path: "/", ip: fmt.Sprintf("192.0.2.%d", i%250)})
			if e.counter("failure_mode", mode.String()) == before {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: checks did not go back to Redis", mode)
			}
			time.Sleep(20 * time.Millisecond)
		}
		if got := e.run(req{path: "/api/coupon/a", headers: uid("back")}, 7); got != 5 {
			t.Errorf("%s, Redis back: allowed %d of 7, want 5", mode, got)
		}
	}
}
