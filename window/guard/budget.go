package guard

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/flashgate/flashgate/window"
)

// BudgetOptions configures a [Budget].
type BudgetOptions struct {
	// Min is the least time a call is given (--redis-timeout); required.
	Min time.Duration
	// Max is the most time a call is given, whatever the latency: it must
	// leave room, within Envoy's ext_authz timeout, for the failure mode and
	// the reply (--check-deadline less a reserve). Required, ≥ Min.
	Max time.Duration
	// Now is the clock that times the calls; nil means time.Now. A [Redis]
	// behind the Budget keeps the budget itself and times its calls on the
	// clock that sets their deadline.
	Now func() time.Time
}

// Budget is a [window.Limiter] decorator that gives each call a deadline that
// follows the backend's observed latency, as TCP's retransmission timeout
// follows the round-trip time (RFC 6298): smoothed latency plus four times
// its smoothed deviation, never below Min nor above Max. When Redis slows
// down, checks wait longer for it (up to Max) instead of timing out and
// taking their failure mode; when it is fast again the budget shrinks back
// to Min. A call that runs out of budget counts as having taken the whole
// budget, so a run of timeouts raises it. Before the first sample (a cold
// start) a call gets Max: with nothing known, the first burst is not cut
// short.
//
// A deadline already in ctx that is sooner is kept. Budget is safe for
// concurrent use; its estimate is updated with atomics (a racing update may
// be lost: it is a sample).
type Budget struct {
	next     window.Limiter
	now      func() time.Time
	min, max int64
	srtt     atomic.Int64 // smoothed latency, ns; 0 before the first sample
	rttvar   atomic.Int64 // smoothed mean deviation, ns
}

var _ window.Limiter = (*Budget)(nil)

// NewBudget returns a Budget in front of next.
func NewBudget(next window.Limiter, o BudgetOptions) (*Budget, error) {
	if next == nil {
		return nil, errors.New("budget: the limiter behind it is nil")
	}
	if o.Min <= 0 || o.Max < o.Min {
		return nil, fmt.Errorf("budget: min %s and max %s: want 0 < min ≤ max", o.Min, o.Max)
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return &Budget{next: next, now: o.Now, min: int64(o.Min), max: int64(o.Max)}, nil
}

// Current returns the deadline the next call gets.
func (b *Budget) Current() time.Duration {
	srtt := b.srtt.Load()
	if srtt == 0 {
		return time.Duration(b.max)
	}
	return time.Duration(min(max(srtt+4*b.rttvar.Load(), b.min), b.max))
}

// Decide implements [window.Limiter]: next's decision within the current budget.
func (b *Budget) Decide(ctx context.Context, hits []window.Hit) (window.Decision, error) {
	budget := b.Current()
	var (
		d     window.Decision
		took  time.Duration
		spent bool
		err   error
	)
	if dl, ok := b.next.(DeadlineLimiter); ok {
		// It keeps the deadline on its own clock: the call is timed on it.
		start := time.Now()
		d, err = dl.DecideBy(ctx, start.Add(budget), hits)
		took = time.Since(start)
		spent = err != nil && ctx.Err() == nil && took >= budget
	} else {
		start := b.now()
		d, spent, err = decideWithTimeout(ctx, b.next, hits, budget)
		took = b.now().Sub(start)
	}
	switch {
	case err == nil:
		b.observe(int64(took))
	case spent:
		// Out of budget (the caller is still waiting): as slow as the budget.
		b.observe(int64(max(took, budget)))
		if !errors.Is(err, context.DeadlineExceeded) {
			err = fmt.Errorf("%w (budget %s)", err, budget)
		} else {
			err = fmt.Errorf("no answer within the budget of %s: %w", budget, err)
		}
	}
	return d, err
}

// DeadlineLimiter is a [window.Limiter] that keeps a deadline without a
// context per call: DecideBy returns, at the latest about by (on the wall
// clock), the deadline's error. A [Budget] in front of one passes its
// budget as by.
type DeadlineLimiter interface {
	DecideBy(ctx context.Context, by time.Time, hits []window.Hit) (window.Decision, error)
}

// decideWithTimeout is next's decision with budget from now as a deadline
// in its context, and whether the budget ran out (the caller's own ctx
// still live).
func decideWithTimeout(ctx context.Context, next window.Limiter, hits []window.Hit, budget time.Duration) (window.Decision, bool, error) {
	cctx, cancel := context.WithTimeout(ctx, budget)
	defer cancel()
	d, err := next.Decide(cctx, hits)
	return d, err != nil && ctx.Err() == nil && cctx.Err() != nil, err
}

// observe folds one latency sample into the estimate (RFC 6298, 2.2–2.3).
func (b *Budget) observe(r int64) {
	srtt := b.srtt.Load()
	if srtt == 0 {
		b.srtt.Store(max(r, 1))
		b.rttvar.Store(r / 2)
		return
	}
	dev := srtt - r
	if dev < 0 {
		dev = -dev
	}
	v := b.rttvar.Load()
	b.rttvar.Store(v + (dev-v)/4)
	b.srtt.Store(max(srtt+(r-srtt)/8, 1))
}
