package guard

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flashgate/flashgate/window"
	"github.com/flashgate/flashgate/window/testclock"
)

// countingLimiter passes decisions to a real limiter and counts them, so a
// test can tell which requests reached the backend.
type countingLimiter struct {
	next  window.Limiter
	calls atomic.Int64
	err   error
}

func (c *countingLimiter) Decide(ctx context.Context, hits []window.Hit) (window.Decision, error) {
	c.calls.Add(1)
	if c.err != nil {
		return window.Decision{}, c.err
	}
	return c.next.Decide(ctx, hits)
}

func newTestGuard(t *testing.T, ban window.Ban) (*Guard, *countingLimiter, *testclock.Clock) {
	t.Helper()
	clock := testclock.New()
	backend := &countingLimiter{next: newTestMemory(t, clock, 0)}
	g, err := NewGuard(backend, GuardOptions{Now: clock.Now, Ban: ban})
	if err != nil {
		t.Fatalf("NewGuard: %v", err)
	}
	t.Cleanup(g.Close)
	return g, backend, clock
}

func TestGuardFullUntil(t *testing.T) {
	g, backend, clock := newTestGuard(t, window.Ban{})
	h := hit("k", 2, time.Second)
	// The backend's admissions pass with their reset: until the oldest
	// admission leaves.
	if d := mustDecide(t, g, h); !d.Allowed || d.Reset != time.Second {
		t.Fatalf("1st: %+v, want allowed with reset 1s", d)
	}
	clock.Advance(300 * time.Millisecond)
	if d := mustDecide(t, g, h); !d.Allowed || d.Reset != 700*time.Millisecond {
		t.Fatalf("2nd: %+v, want allowed with reset 700ms", d)
	}
	d := mustDecide(t, g, h) // the backend denies: full until 1000ms
	if d.Allowed || d.Source != window.SourceBackend || d.RetryAfter != 700*time.Millisecond {
		t.Fatalf("3rd: %+v, want backend denial, retry 700ms", d)
	}
	calls := backend.calls.Load()
	for range 10 {
		clock.Advance(50 * time.Millisecond)
		d := mustDecide(t, g, h)
		if d.Allowed || d.Source != window.SourceLocalFull || d.Reset != 0 {
			t.Fatalf("%+v: want a local full denial, reset 0", d)
		}
	}
	if d := mustDecide(t, g, h); d.RetryAfter != 200*time.Millisecond {
		t.Fatalf("retry after %s, want 200ms", d.RetryAfter)
	}
	if got := backend.calls.Load(); got != calls {
		t.Fatalf("backend called %d more times while the key was known full", got-calls)
	}
	clock.Advance(200 * time.Millisecond) // t=1000ms: the oldest entry ages out
	if d := mustDecide(t, g, h); !d.Allowed || d.Reset != 300*time.Millisecond {
		t.Fatalf("at the reopening instant: %+v, want allowed with reset 300ms (until the 2nd leaves)", d)
	}
	// Other keys and a changed limit are not affected.
	if d := mustDecide(t, g, hit("other", 2, time.Second)); !d.Allowed {
		t.Fatalf("other key: %+v", d)
	}
}

// TestGuardCostlyDenialNotFull: a request of cost 3 denied with 2 places
// left does not make the key "full": a single request still reaches the
// backend and is admitted, and a later costly one is denied there again.
func TestGuardCostlyDenialNotFull(t *testing.T) {
	g, backend, _ := newTestGuard(t, window.Ban{})
	h := hit("k", 5, time.Second)
	costly := h
	costly.Cost = 3
	mustDecide(t, g, costly) // 3 of 5
	if d := mustDecide(t, g, costly); d.Allowed || d.Source != window.SourceBackend {
		t.Fatalf("cost 3 with 2 left: %+v, want the backend's denial", d)
	}
	calls := backend.calls.Load()
	if d := mustDecide(t, g, h); !d.Allowed || d.Count != 4 {
		t.Fatalf("cost 1 with 2 left after a costly denial: %+v, want allowed by the backend with count 4", d)
	}
	if got := backend.calls.Load(); got != calls+1 {
		t.Fatalf("the single request reached the backend %d times, want once", got-calls)
	}
}

func TestGuardLimitChangeInvalidates(t *testing.T) {
	g, _, _ := newTestGuard(t, window.Ban{})
	h := hit("k", 1, time.Second)
	mustDecide(t, g, h)
	if d := mustDecide(t, g, h); d.Allowed {
		t.Fatal("2nd request allowed")
	}
	raised := hit("k", 3, time.Second)
	if d := mustDecide(t, g, raised); !d.Allowed || d.Source != window.SourceBackend {
		t.Fatalf("after the limit was raised: %+v, want allowed by the backend", d)
	}
}

func TestGuardPenaltyBox(t *testing.T) {
	ban := window.Ban{Threshold: 3, Window: 10 * time.Second, Duration: time.Minute}
	g, backend, clock := newTestGuard(t, ban)
	h := asking(hit("abuser", 1, 100*time.Millisecond))
	mustDecide(t, g, h)
	for i := range 3 { // 3 denials: at the threshold, not over it
		if d := mustDecide(t, g, h); d.Allowed {
			t.Fatalf("denial %d: allowed", i)
		}
	}
	clock.Advance(100 * time.Millisecond) // the window reopens...
	if d := mustDecide(t, g, h); !d.Allowed {
		t.Fatalf("not yet banned: %+v", d)
	}
	d := mustDecide(t, g, h) // 4th denial within 10s: banned
	if d.Allowed {
		t.Fatal("4th denial allowed")
	}
	clock.Advance(200 * time.Millisecond)
	calls := backend.calls.Load()
	d = mustDecide(t, g, h)
	if d.Allowed || d.Source != window.SourceLocalBanned {
		t.Fatalf("%+v: want banned", d)
	}
	if d.RetryAfter <= 59*time.Second || d.RetryAfter > time.Minute {
		t.Fatalf("banned retry after %s, want about 1m", d.RetryAfter)
	}
	if backend.calls.Load() != calls {
		t.Fatal("a banned key reached the backend")
	}
	clock.Advance(time.Minute)
	if d := mustDecide(t, g, h); !d.Allowed {
		t.Fatalf("after the ban: %+v, want allowed", d)
	}
}

func TestGuardBanOverrideAndDisabled(t *testing.T) {
	g, _, clock := newTestGuard(t, window.Ban{Threshold: 1, Window: time.Minute, Duration: time.Hour})
	h := hit("k", 1, 10*time.Millisecond)
	h.Tag = ruleBan{nil} // this rule asks for no box
	for range 20 {
		mustDecide(t, g, h)
		mustDecide(t, g, h)
		clock.Advance(10 * time.Millisecond)
	}
	if d := mustDecide(t, g, h); !d.Allowed {
		t.Fatalf("a rule with the box disabled was banned: %+v", d)
	}
}

func TestGuardShadowNeverLocal(t *testing.T) {
	g, backend, _ := newTestGuard(t, window.DefaultBan)
	h := hit("k", 1, time.Second)
	h.Shadow = true
	for range 10 {
		if d := mustDecide(t, g, h); !d.Allowed {
			t.Fatalf("shadow hit denied: %+v", d)
		}
	}
	if backend.calls.Load() != 10 {
		t.Fatalf("backend saw %d of 10 shadow requests", backend.calls.Load())
	}
}

func TestGuardErrors(t *testing.T) {
	if _, err := NewGuard(nil, GuardOptions{}); err == nil {
		t.Fatal("nil backend accepted")
	}
	if _, err := NewGuard(&countingLimiter{}, GuardOptions{Budget: 1000}); err == nil {
		t.Fatal("tiny budget accepted")
	}
	if _, err := NewGuard(&countingLimiter{}, GuardOptions{Ban: window.Ban{Duration: -1}}); err == nil {
		t.Fatal("negative ban accepted")
	}
	boom := errors.New("boom")
	g, err := NewGuard(&countingLimiter{err: boom}, GuardOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := g.Decide(context.Background(), []window.Hit{hit("k", 1, time.Second)}); !errors.Is(err, boom) {
		t.Fatalf("backend error not passed through: %v", err)
	}
	g.Close()
	// A closed guard still answers, from the backend.
	if _, err := g.Decide(context.Background(), []window.Hit{hit("k", 1, time.Second)}); !errors.Is(err, boom) {
		t.Fatalf("closed guard: %v", err)
	}
}

func TestGuardReloadLiftsBan(t *testing.T) {
	g, _, clock := newTestGuard(t, window.Ban{Threshold: 1, Window: time.Minute, Duration: time.Hour})
	h := asking(hit("nat-ip", 1, 10*time.Millisecond))
	mustDecide(t, g, h)
	for range 3 {
		mustDecide(t, g, h)
	}
	clock.Advance(20 * time.Millisecond)
	if d := mustDecide(t, g, h); d.Allowed || d.Source != window.SourceLocalBanned {
		t.Fatalf("%+v: want banned", d)
	}
	// A reload lowers the limit: the ban stays.
	lowered := asking(hit("nat-ip", 1, 20*time.Millisecond))
	if d := mustDecide(t, g, lowered); d.Allowed || d.Source != window.SourceLocalBanned {
		t.Fatalf("limit lowered: %+v, want still banned", d)
	}
	// A reload raises the limit: the ban earned under the old one is lifted.
	raised := asking(hit("nat-ip", 100, 10*time.Millisecond))
	if d := mustDecide(t, g, raised); !d.Allowed {
		t.Fatalf("limit raised: %+v, want allowed", d)
	}
	// A reload that disables the penalty box lifts it too.
	off := h
	off.Tag = ruleBan{nil}
	if d := mustDecide(t, g, off); d.Source != window.SourceBackend {
		t.Fatalf("penalty box disabled, yet the key is still refused locally: %+v", d)
	}
}

// TestGuardNoBanUnlessAsked: a key of a rule that asks for no penalty box
// (or a hit whose Tag names no rule) is never banned, however often it is
// denied: the next request after the window reopens is the store's.
func TestGuardNoBanUnlessAsked(t *testing.T) {
	g, _, clock := newTestGuard(t, window.Ban{Threshold: 1, Window: time.Minute, Duration: time.Hour})
	for name, h := range map[string]window.Hit{
		"untagged":  hit("a", 3, time.Second),
		"asks none": {Key: "b", Limit: window.Limit{Requests: 3, Window: time.Second}, Tag: ruleBan{nil}},
	} {
		for round := range 5 {
			for i := range 20 {
				if d := mustDecide(t, g, h); d.Source == window.SourceLocalBanned {
					t.Fatalf("%s: round %d, check %d: banned: %+v", name, round, i, d)
				}
			}
			clock.Advance(time.Second)
			if d := mustDecide(t, g, h); !d.Allowed {
				t.Fatalf("%s: round %d: after the window: %+v, want allowed", name, round, d)
			}
		}
	}
}

// TestGuardBanPastNanoseconds: a ban whose end lies past what Unix
// nanoseconds hold is enforced, not wrapped into the past.
func TestGuardBanPastNanoseconds(t *testing.T) {
	g, _, clock := newTestGuard(t, window.DefaultBan)
	h := asking(hit("k", 5, time.Second))
	g.Ban("k", time.Date(2319, 1, 1, 0, 0, 0, 0, time.UTC))
	clock.Advance(time.Hour)
	if d := mustDecide(t, g, h); d.Allowed || d.Source != window.SourceLocalBanned {
		t.Fatalf("a ban until 2319: %+v, want a ban refusal", d)
	}
}
