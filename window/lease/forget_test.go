package lease

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/flashgate/flashgate/window"
	"github.com/flashgate/flashgate/window/redisstore"
	"github.com/flashgate/flashgate/window/redistest"
	"github.com/flashgate/flashgate/window/testclock"
)

// keyCount is how many keys h remembers.
func keyCount(h *Holder) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.keys)
}

// TestHolderForgetsKeysItCannotLease: keys whose reservation never happens
// (the fleet's size unknown, the gate closed: a call that fails takes the
// same path) hold nothing, so that a flood of distinct keys through an
// outage leaves the holder's memory bounded.
func TestHolderForgetsKeysItCannotLease(t *testing.T) {
	t.Parallel()
	rs := redistest.Start(t)
	cases := map[string]Options{
		"size unknown": {Size: func() (int, bool) { return 0, false }},
		"gate closed":  {Gate: func([]window.Hit) error { return window.ErrBreakerOpen }},
	}
	for name, o := range cases {
		s := newSidecar(t, rs.Addr(), o)
		lim := window.Limit{Requests: 5, Window: time.Second}
		for i := range maxIdleKeys + maxIdleKeys/2 {
			if _, err := s.h.Decide(context.Background(), []window.Hit{leasedHit("fg:{f}:"+strconv.Itoa(i), lim, 50*time.Millisecond)}); err == nil {
				t.Fatalf("%s: a check was decided; want the reservation's failure", name)
			}
		}
		if n := keyCount(s.h); n > maxIdleKeys {
			t.Errorf("%s: the holder remembers %d keys after %d failed reservations; want at most %d", name, n, maxIdleKeys+maxIdleKeys/2, maxIdleKeys)
		}
	}
}

// lateReserve is a Reserver whose every reservation comes back after twice
// the lease's length on clk.
type lateReserve struct {
	Reserver
	clk *testclock.Clock
}

func (l lateReserve) Lease(ctx context.Context, c redisstore.LeaseCall) (redisstore.Grant, error) {
	if c.Want > 0 {
		l.clk.Advance(2 * c.For)
	}
	return l.Reserver.Lease(ctx, c)
}

// TestHolderLateGrantExpires: a grant that comes back after its lease's
// deadline is closed like any other: no lease stays open, its slots go
// back, and its key is forgotten.
func TestHolderLateGrantExpires(t *testing.T) {
	t.Parallel()
	rs := redistest.Start(t)
	clk := testclock.New()
	s := clockedSidecarVia(t, rs.Addr(), clk, nil, func(r Reserver) Reserver { return lateReserve{Reserver: r, clk: clk} })
	lim := window.Limit{Requests: 5, Window: time.Second}
	_, err := s.h.Decide(context.Background(), []window.Hit{leasedHit("fg:{late}:g", lim, 20*time.Millisecond)})
	if !errors.Is(err, errLate) {
		t.Fatalf("Decide with every grant late: %v, want errLate", err)
	}
	if !poll(10*time.Second, func() bool { return s.h.Stats().Held == 0 && keyCount(s.h) == 0 }) {
		t.Fatalf("after a late grant: %d leases held, %d keys remembered; want none", s.h.Stats().Held, keyCount(s.h))
	}
	if st := s.h.Stats(); st.Returned == 0 {
		t.Errorf("the late leases' unused slots were not returned: %+v", st)
	}
}
