package lease

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashgate/flashgate/window"
	"github.com/flashgate/flashgate/window/redisstore"
	"github.com/flashgate/flashgate/window/redistest"
	"github.com/flashgate/flashgate/window/testclock"
)

// slowed is a wrapped limiter whose calls run before() first: a test moves
// the shared clock there, as a Redis call that returns late would.
type slowed struct {
	next   window.Limiter
	before func()
}

func (s slowed) Decide(ctx context.Context, hits []window.Hit) (window.Decision, error) {
	s.before()
	return s.next.Decide(ctx, hits)
}

// clockedSidecar is a sidecar whose holder and store (ClockLocal: the
// script's now) both read clk, so that a test steps Redis's time and the
// holder's together; wrap, if not nil, wraps the store the holder decides
// the other hits through.
func clockedSidecar(t *testing.T, addr string, clk *testclock.Clock, wrap func(window.Limiter) window.Limiter) *sidecar {
	t.Helper()
	return clockedSidecarVia(t, addr, clk, wrap, nil)
}

// clockedSidecarVia is clockedSidecar whose reservations go through via's
// Reserver (nil: the store's).
func clockedSidecarVia(t *testing.T, addr string, clk *testclock.Clock, wrap func(window.Limiter) window.Limiter, via func(Reserver) Reserver) *sidecar {
	t.Helper()
	c, err := redisstore.NewClient(redisstore.ClientConfig{Addrs: []string{addr}, Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	r, err := redisstore.New(c, redisstore.Options{Clock: redisstore.ClockLocal, Now: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	s := &sidecar{store: &recorder{Redis: r}}
	var next window.Limiter = r
	if wrap != nil {
		next = wrap(r)
	}
	var store Reserver = s.store
	if via != nil {
		store = via(s.store)
	}
	if s.h, err = New(next, Options{Store: store, Now: clk.Now}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.h.Close(); r.Close(); _ = c.Close() })
	return s
}

// decideAt decides hits on s and returns the admissions it made as spans
// at clk's instant when the decision returned (the clock stands still
// unless a test moves it).
func decideAt(t *testing.T, s *sidecar, clk *testclock.Clock, hits ...window.Hit) (window.Decision, []span) {
	t.Helper()
	d, err := s.h.Decide(context.Background(), hits)
	if err != nil {
		t.Fatalf("Decide: %v", err)
	}
	var out []span
	if d.Allowed {
		at := clk.Now()
		for range hits[0].Counted() {
			out = append(out, span{at, at})
		}
	}
	return d, out
}

// lateThenFill decides hits on a, whose call comes back 2d after its
// first leased hit's (hits[0]) lease began, as a late check; then, once
// that lease's slots (scored at d) have left the window, b reserves on
// hits[0]'s key what the window has room for. No window may hold more
// than the limit.
func lateThenFill(t *testing.T, a, b *sidecar, clk *testclock.Clock, d time.Duration, hits ...window.Hit) {
	t.Helper()
	dec, all := decideAt(t, a, clk, hits...)
	if !dec.Allowed {
		t.Fatalf("the late check was denied (%+v): the windows had room", dec)
	}
	lim := hits[0].Limit
	clk.Advance(lim.Window - d + d/10) // from 2d to past d + window
	fill := hits[0]
	fill.Cost = lim.Requests
	_, more := decideAt(t, b, clk, fill)
	checkInvariant(t, "a late check and another sidecar", append(all, more...), lim.Requests, lim.Window)
}

// TestHolderMixedCheckPastLeaseEnd: a check whose leased hit took a slot,
// and whose other hit's call came back after the lease ended, is admitted
// only from a lease running when the check is decided: another sidecar
// cannot then fit the limit in a window beside it.
func TestHolderMixedCheckPastLeaseEnd(t *testing.T) {
	t.Parallel()
	rs := redistest.Start(t)
	clk := testclock.New()
	lim := window.Limit{Requests: 2, Window: time.Second}
	const d = 100 * time.Millisecond
	a := clockedSidecar(t, rs.Addr(), clk, func(next window.Limiter) window.Limiter {
		return slowed{next: next, before: func() { clk.Advance(2 * d) }}
	})
	b := clockedSidecar(t, rs.Addr(), clk, nil)
	global := leasedHit("fg:{late}:g", lim, d)
	user := window.Hit{Key: "fg:{late}:u", Rule: "user", Limit: window.Limit{Requests: 5, Window: time.Second}}

	lateThenFill(t, a, b, clk, d, global, user)
}

// TestHolderMixedCheckPastLeaseEndRefunds: when the check's leased hit can
// no longer be admitted after its lease ended (the window filled in the
// meantime), the check is denied and what its other hit recorded is taken
// back.
func TestHolderMixedCheckPastLeaseEndRefunds(t *testing.T) {
	t.Parallel()
	rs := redistest.Start(t)
	rc := redis.NewClient(&redis.Options{Addr: rs.Addr()})
	t.Cleanup(func() { _ = rc.Close() })
	clk := testclock.New()
	lim := window.Limit{Requests: 2, Window: time.Second}
	const d = 100 * time.Millisecond
	global := leasedHit("fg:{late2}:g", lim, d)
	user := window.Hit{Key: "fg:{late2}:u", Rule: "user", Limit: window.Limit{Requests: 5, Window: time.Second}}
	var (
		a     *sidecar
		inner []span
		once  bool
	)
	a = clockedSidecar(t, rs.Addr(), clk, func(next window.Limiter) window.Limiter {
		return slowed{next: next, before: func() {
			if once {
				return
			}
			once = true
			// While the user hit's call is out, the lease ends and another
			// check of this sidecar takes the window's last slot.
			clk.Advance(2 * d)
			_, inner = decideAt(t, a, clk, global)
		}}
	})
	dec, outer := decideAt(t, a, clk, global, user)
	if len(inner) != 1 {
		t.Fatalf("the check in the meantime admitted %d, want 1", len(inner))
	}
	if dec.Allowed || dec.Index != 0 {
		t.Fatalf("the late check: %+v; want denied by the leased hit (the window is full)", dec)
	}
	if n := rc.ZCard(context.Background(), user.Key).Val(); n != 0 {
		t.Fatalf("the user key holds %d entries after the check was denied, want 0 (refunded)", n)
	}
	checkInvariant(t, "a late mixed check", append(outer, inner...), lim.Requests, lim.Window)
}

// slowReserve is a Reserver whose first reservation on key runs before()
// first, as a call that comes back late.
type slowReserve struct {
	Reserver
	key    string
	before func()
	done   bool
}

func (s *slowReserve) Lease(ctx context.Context, c redisstore.LeaseCall) (redisstore.Grant, error) {
	if c.Key == s.key && c.Want > 0 && !s.done {
		s.done = true
		s.before()
	}
	return s.Reserver.Lease(ctx, c)
}

// TestHolderTwoLeasedHitsPastLeaseEnd: a check with two leased hits whose
// second reservation comes back after the first hit's lease ended takes
// the first hit's slot again from a running lease: another sidecar cannot
// then fit the limit in a window beside it.
func TestHolderTwoLeasedHitsPastLeaseEnd(t *testing.T) {
	t.Parallel()
	rs := redistest.Start(t)
	clk := testclock.New()
	lim := window.Limit{Requests: 2, Window: time.Second}
	const d = 100 * time.Millisecond
	first, second := leasedHit("fg:{two}:g1", lim, d), leasedHit("fg:{two}:g2", lim, d)
	a := clockedSidecarVia(t, rs.Addr(), clk, nil, func(r Reserver) Reserver {
		return &slowReserve{Reserver: r, key: second.Key, before: func() { clk.Advance(2 * d) }}
	})
	b := clockedSidecar(t, rs.Addr(), clk, nil)
	lateThenFill(t, a, b, clk, d, first, second)
}
