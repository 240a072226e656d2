package extauthz

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/flashgate/flashgate/window"
)

// deadlineProbe passes decisions on and counts the calls whose context
// carried a deadline; instant is what it reports from Instant.
type deadlineProbe struct {
	next                window.Limiter
	instant             bool
	calls, withDeadline atomic.Int64
}

func (p *deadlineProbe) Decide(ctx context.Context, hits []window.Hit) (window.Decision, error) {
	p.calls.Add(1)
	if _, ok := ctx.Deadline(); ok {
		p.withDeadline.Add(1)
	}
	return p.next.Decide(ctx, hits)
}

func (p *deadlineProbe) Instant() bool { return p.instant }

// TestInstantLimiterNoDeadline: a limiter that never waits (Memory, a Guard
// over one) is called without a deadline; any other within the budget,
// directly or behind a Guard, detached or not.
func TestInstantLimiterNoDeadline(t *testing.T) {
	for _, instant := range []bool{true, false} {
		for _, guarded := range []bool{false, true} {
			for _, detach := range []bool{false, true} {
				t.Run(fmt.Sprintf("instant=%t/guard=%t/detach=%t", instant, guarded, detach), func(t *testing.T) {
					mem, err := window.NewMemory(window.MemoryOptions{})
					if err != nil {
						t.Fatal(err)
					}
					p := &deadlineProbe{next: mem, instant: instant}
					var lim window.Limiter = p
					if guarded {
						g, err := window.NewGuard(p, window.GuardOptions{})
						if err != nil {
							t.Fatal(err)
						}
						t.Cleanup(g.Close)
						if g.Instant() != instant {
							t.Fatalf("Guard.Instant() = %t over a limiter that says %t", g.Instant(), instant)
						}
						lim = g
					}
					e := newEnv(t, nil, func(o *Options) { o.Limiter, o.Detach = lim, detach })
					for i := range 6 { // the 6th is denied by the backend: Memory's answer either way
						a := e.check(req{path: "/api/coupon/x", headers: uid("u")})
						if a.allowed != (i < 5) {
							t.Fatalf("request %d: %+v", i+1, a)
						}
					}
					calls, with := p.calls.Load(), p.withDeadline.Load()
					if calls != 6 {
						t.Fatalf("the limiter was called %d times for 6 checks", calls)
					}
					if want := map[bool]int64{true: 0, false: calls}[instant]; with != want {
						t.Fatalf("%d of %d calls had a deadline, want %d", with, calls, want)
					}
				})
			}
		}
	}
}

// TestInstantFallbackNoDeadline: the fallback limiter of failure mode local
// gets FallbackTimeout unless it never waits.
func TestInstantFallbackNoDeadline(t *testing.T) {
	for _, instant := range []bool{true, false} {
		t.Run(fmt.Sprintf("instant=%t", instant), func(t *testing.T) {
			mem, err := window.NewMemory(window.MemoryOptions{})
			if err != nil {
				t.Fatal(err)
			}
			fb := &deadlineProbe{next: mem, instant: instant}
			down := &switchable{next: mem, err: errors.New("connection refused")}
			e := newEnv(t, nil, func(o *Options) { o.Limiter, o.Fallback = down, fb })
			for i := range 6 { // the fallback enforces the limit of 5
				if a := e.check(req{path: "/api/coupon/x", headers: uid("u")}); a.allowed != (i < 5) {
					t.Fatalf("request %d: %+v", i+1, a)
				}
			}
			calls, with := fb.calls.Load(), fb.withDeadline.Load()
			if calls == 0 {
				t.Fatal("the fallback was never called")
			}
			if want := map[bool]int64{true: 0, false: calls}[instant]; with != want {
				t.Fatalf("%d of %d fallback calls had a deadline, want %d", with, calls, want)
			}
		})
	}
}
