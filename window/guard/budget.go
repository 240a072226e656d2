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
	// Now is the clock that times the calls; nil means time.Now. A
	// [DeadlineLimiter] behind the Budget keeps the deadline itself, and
	// its calls are timed on the wall clock that sets it.
	Now func() time.Time
}

// Budget is a [window.Limiter] decorator that gives each call a deadline
// following the limiter's observed latency, within [Min, Max] (see the
// package doc). A sooner deadline already in ctx is kept. It is safe for
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
