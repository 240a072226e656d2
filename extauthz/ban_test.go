package extauthz

import (
	"testing"
	"time"

	"github.com/flashgate/flashgate/enforce"
	"github.com/flashgate/flashgate/window"
	"github.com/flashgate/flashgate/window/guard"
)

// TestPenaltyBoxOnlyWhenAsked: with serve's penalty box (5 denials in 10s
// → 5m) and the built-in example, a user bursting on coupon_per_uid (no
// ban:) is admitted again once its 1s window reopens, burst after burst;
// a device bursting on coupon_per_device (ban: {}) is banned for 5m.
func TestPenaltyBoxOnlyWhenAsked(t *testing.T) {
	var g *guard.Guard
	e := newEnv(t, nil, func(o *enforce.Options) {
		var err error
		if g, err = guard.NewGuard(o.Limiter, guard.GuardOptions{Now: o.Now, Ban: window.DefaultBan}); err != nil {
			t.Fatal(err)
		}
		o.Limiter = g
	})
	t.Cleanup(g.Close)
	user := req{path: "/api/coupon/a", headers: uid("u1")}
	for round := range 5 {
		for range 30 {
			e.check(user)
		}
		e.clock.Advance(time.Second)
		if a := e.check(user); !a.allowed {
			t.Fatalf("round %d: after the window: %v (retry-after %s), want allowed", round, a.code, a.headers["retry-after"])
		}
	}
	if n := e.counter("local_denials", "banned"); n != 0 {
		t.Fatalf("a rule without ban: %v local ban refusals, want 0", n)
	}

	device := req{path: "/api/coupon/a", headers: map[string]string{"x-device-fp": "d1"}}
	for range 30 {
		e.check(device)
	}
	e.clock.Advance(time.Second)
	a := e.check(device)
	if a.allowed || a.headers["retry-after"] != "299" {
		t.Fatalf("a banned device past its window: allowed %v, retry-after %q; want refused, 299", a.allowed, a.headers["retry-after"])
	}
	if n := e.counter("local_denials", "banned"); n < 1 {
		t.Fatalf("a rule with ban: {}: %v local ban refusals, want some", n)
	}
}
