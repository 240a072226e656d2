package extauthz

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flashgate/flashgate/window"
)

// switchable passes decisions to a real limiter until err is set.
type switchable struct {
	next  window.Limiter
	err   error
	calls atomic.Int64
}

func (s *switchable) Decide(ctx context.Context, hits []window.Hit) (window.Decision, error) {
	s.calls.Add(1)
	if s.err != nil {
		return window.Decision{}, s.err
	}
	return s.next.Decide(ctx, hits)
}

// TestBreakerBehindGuard: the Guard's knowledge holds while the breaker is
// open, and a probe the Guard answers locally does not wedge the breaker.
func TestBreakerBehindGuard(t *testing.T) {
	clk := newClock()
	mem, err := window.NewMemory(window.MemoryOptions{Now: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	backend := &switchable{next: mem}
	guard, err := window.NewGuard(backend, window.GuardOptions{Now: clk.Now, Ban: window.DefaultBan})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(guard.Close)
	e := newEnv(t, nil, func(o *Options) {
		o.Limiter = guard
		o.FailureMode = FailureAllow // an open breaker would admit everything
		o.Breaker = BreakerOptions{Failures: 3, Cooldown: time.Second}
		o.Now = clk.Now
	})
	e.clock = clk
	abuser := req{path: "/api/coupon/x", headers: uid("abuser")}
	for range 12 { // 5 admitted, then denials: banned after the 6th
		e.check(abuser)
		guard.Wait()
	}

	backend.err = errors.New("connection refused")
	for i := range 3 {
		e.check(req{path: "/api/coupon/x", headers: uid("user" + string(rune('a'+i)))})
	}
	calls := backend.calls.Load()
	if a := e.check(req{path: "/api/coupon/x", headers: uid("fresh")}); !a.allowed {
		t.Fatalf("breaker open, failure mode allow: a fresh user was denied: %+v", a)
	}
	if backend.calls.Load() != calls {
		t.Fatal("the breaker did not open after 3 failures")
	}
	wantDenied(t, e.check(abuser), "coupon_per_uid", 5) // the penalty box needs no Redis
	if got := e.counter("local_denials", "banned"); got < 1 {
		t.Errorf("local_denials{banned} = %v while the breaker was open", got)
	}

	// The cooldown ends; the first check is the banned abuser, answered by
	// the Guard without reaching the backend. That must not use up the probe.
	clk.Advance(time.Second)
	wantDenied(t, e.check(abuser), "coupon_per_uid", 5)
	backend.err = nil
	if a := e.check(req{path: "/api/coupon/x", headers: uid("after")}); !a.allowed {
		t.Fatalf("after recovery: %+v", a)
	}
	if backend.calls.Load() == calls {
		t.Fatal("no check reached the recovered backend: the probe was lost")
	}
	calls = backend.calls.Load()
	e.run(req{path: "/api/coupon/x", headers: uid("later")}, 3)
	if got := backend.calls.Load() - calls; got != 3 {
		t.Fatalf("%d of 3 checks reached the backend after the probe succeeded", got)
	}
}

// TestBreakerProbeCancelled: a probe whose check Envoy cancels is given back.
func TestBreakerProbeCancelled(t *testing.T) {
	clk := newClock()
	b := newBreaker(BreakerOptions{Failures: 1, Cooldown: time.Second}, clk.Now)
	if ok, probe := b.allow(); !ok || probe != 0 {
		t.Fatal("closed breaker refused, or handed out a probe")
	}
	b.record(false)
	if ok, _ := b.allow(); ok {
		t.Fatal("open breaker allowed a call")
	}
	clk.Advance(time.Second)
	ok, probe := b.allow()
	if !ok || probe == 0 {
		t.Fatalf("after the cooldown: ok %v probe %v, want a probe", ok, probe)
	}
	if ok, _ := b.allow(); ok {
		t.Fatal("a second call got through while the probe was out")
	}
	b.release(probe)
	ok, probe2 := b.allow()
	if !ok || probe2 == 0 || probe2 == probe {
		t.Fatal("a released probe was not handed out again under a new number")
	}
	// The first probe's late release must not free the second.
	b.release(probe)
	if ok, _ := b.allow(); ok {
		t.Fatal("a stale release freed the probe in flight")
	}
}
