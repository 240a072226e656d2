package guard

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/flashgate/flashgate/window"
)

// Defaults of [BreakerOptions].
const (
	DefaultBreakerWindow       = time.Second
	DefaultBreakerMinCalls     = 20
	DefaultBreakerFailureRate  = 0.8
	DefaultBreakerConnFailures = 3
	DefaultBreakerCooldown     = 250 * time.Millisecond
)

// breakerBuckets is how many buckets the rate window is cut into.
const breakerBuckets = 10

// breakerSpread is how many of the window's buckets must have seen calls,
// FailureRate of them mostly failing, before the rate opens the breaker:
// the failures must be sustained across the window, not one burst (a
// pipelined batch whose reply came late fails every call in it at once).
const breakerSpread = 8

// BreakerOptions configures a [Breaker]. The zero value takes every default.
type BreakerOptions struct {
	// Window is the span over which the failure rate is measured; 0 means
	// DefaultBreakerWindow.
	Window time.Duration
	// MinCalls is how many calls Window must hold before the rate can open
	// the breaker, so that a few late replies on a quiet sidecar do not;
	// 0 means DefaultBreakerMinCalls.
	MinCalls int
	// FailureRate (0 < r ≤ 1) is the share of failed calls in Window that
	// opens the breaker; 0 means DefaultBreakerFailureRate.
	FailureRate float64
	// ConnFailures consecutive connection errors (refused, reset, closed:
	// Redis is down, not slow) open the breaker whatever the rate; 0 means
	// DefaultBreakerConnFailures.
	ConnFailures int
	// Cooldown is how long an open breaker holds calls off before one probe;
	// 0 means DefaultBreakerCooldown.
	Cooldown time.Duration
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// OnChange, if not nil, is told when the breaker opens (true, with the
	// error that opened it) and closes (false, nil). It runs with the
	// breaker's lock held: it must be quick and must not call the Breaker.
	OnChange func(open bool, cause error)
}

// Breaker is a circuit breaker in front of a [window.Limiter], opened by a
// sustained failure rate or by connection errors in a row (see the package
// doc). It is safe for concurrent use; its closed path touches only atomics.
type Breaker struct {
	next      window.Limiter
	now       func() time.Time
	bucketDur int64 // ns
	minCalls  int64
	rate      float64
	connFails int32
	cooldown  time.Duration
	onChange  func(open bool, cause error)

	buckets   [breakerBuckets]breakerBucket
	connRun   atomic.Int32 // consecutive connection errors
	open      atomic.Bool  // the fields under mu describe an open breaker
	opened    atomic.Int64 // times the breaker opened
	probeNext atomic.Uint64

	// mu guards the fields below.
	mu        sync.Mutex
	openUntil time.Time
	probing   uint64 // the probe in flight, 0 for none
}

type breakerBucket struct {
	epoch atomic.Int64 // bucket number (now / bucketDur) its counts are for
	calls atomic.Int64
	fails atomic.Int64
}

var _ window.Limiter = (*Breaker)(nil)

// NewBreaker returns a Breaker in front of next.
func NewBreaker(next window.Limiter, o BreakerOptions) (*Breaker, error) {
	if next == nil {
		return nil, errors.New("breaker: the limiter behind it is nil")
	}
	if o.Window < 0 || o.MinCalls < 0 || o.ConnFailures < 0 || o.Cooldown < 0 || o.FailureRate < 0 || o.FailureRate > 1 {
		return nil, fmt.Errorf("breaker: options %+v: durations and counts must not be negative, the rate must be within [0, 1]", o)
	}
	if o.Window == 0 {
		o.Window = DefaultBreakerWindow
	}
	if o.Window < breakerBuckets*time.Millisecond {
		return nil, fmt.Errorf("breaker: window %s: must be at least %s", o.Window, breakerBuckets*time.Millisecond)
	}
	if o.MinCalls == 0 {
		o.MinCalls = DefaultBreakerMinCalls
	}
	if o.FailureRate == 0 {
		o.FailureRate = DefaultBreakerFailureRate
	}
	if o.ConnFailures == 0 {
		o.ConnFailures = DefaultBreakerConnFailures
	}
	if o.Cooldown == 0 {
		o.Cooldown = DefaultBreakerCooldown
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return &Breaker{
		next: next, now: o.Now, bucketDur: int64(o.Window / breakerBuckets), minCalls: int64(o.MinCalls),
		rate: o.FailureRate, connFails: int32(o.ConnFailures), cooldown: o.Cooldown, onChange: o.OnChange,
	}, nil
}

// Open reports whether the breaker holds the backend off now (a probe may
// be in flight).
func (b *Breaker) Open() bool { return b.open.Load() }

// Opened returns how many times the breaker has opened.
func (b *Breaker) Opened() uint64 { return uint64(b.opened.Load()) }

// Reset closes the breaker and forgets its window: the backend was found
// answering by another path (the fallback's write-back rounds). A probe in
// flight is dropped. Safe for concurrent use.
func (b *Breaker) Reset() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.probing = 0
	b.resetLocked()
	if b.open.Load() {
		b.open.Store(false)
		if b.onChange != nil {
			b.onChange(false, nil)
		}
	}
}

// Decide implements [window.Limiter]: ErrBreakerOpen while open, else the
// backend's answer, recorded.
func (b *Breaker) Decide(ctx context.Context, hits []window.Hit) (window.Decision, error) {
	probe, ok := b.allow()
	if !ok {
		return window.Decision{}, window.ErrBreakerOpen
	}
	d, err := b.next.Decide(ctx, hits)
	b.record(ctx, err, probe)
	return d, err
}

// allow reports whether a call may go through and, for the half-open
// probe, its non-zero number.
func (b *Breaker) allow() (probe uint64, ok bool) {
	if !b.open.Load() {
		return 0, true
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.open.Load() {
		return 0, true
	}
	if b.probing != 0 || b.now().Before(b.openUntil) {
		return 0, false
	}
	b.probing = b.probeNext.Add(1)
	return b.probing, true
}

// record counts a call's outcome and opens or closes the breaker.
func (b *Breaker) record(ctx context.Context, err error, probe uint64) {
	kind := window.Classify(err)
	if kind == window.KindInvalidHit || kind == window.KindClosed || (err != nil && ctx.Err() != nil) {
		// Not the backend's doing: the caller gave up (its own deadline or
		// cancellation; the Budget's deadline lies behind the Breaker and is
		// not in ctx), passed a bad hit, or shut down.
		if probe != 0 {
			b.mu.Lock()
			if b.probing == probe {
				b.probing = 0
			}
			b.mu.Unlock()
		}
		return
	}
	if err == nil {
		b.connRun.Store(0)
		b.count(false)
		if probe != 0 || b.open.Load() {
			b.mu.Lock()
			if probe != 0 && b.probing == probe {
				b.open.Store(false)
				b.probing = 0
				b.resetLocked()
				if b.onChange != nil {
					b.onChange(false, nil)
				}
			}
			b.mu.Unlock()
		}
		return
	}
	calls, fails, active, failed := b.count(true)
	conn := kind == window.KindConnection && b.connRun.Add(1) >= b.connFails
	if kind != window.KindConnection {
		b.connRun.Store(0)
	}
	rate := calls >= b.minCalls && float64(fails) >= b.rate*float64(calls) &&
		active >= breakerSpread && float64(failed) >= b.rate*float64(active)
	if probe == 0 && !conn && !rate {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if probe != 0 && b.probing != probe {
		return // a stale probe: the breaker moved on
	}
	if probe == 0 && b.open.Load() {
		// A call let through before the breaker opened failed late: it
		// neither extends the cooldown nor cancels the probe in flight.
		return
	}
	if !b.open.Load() {
		b.opened.Add(1)
		if b.onChange != nil {
			b.onChange(true, err)
		}
	}
	b.openUntil = b.now().Add(b.cooldown)
	b.probing = 0
	b.open.Store(true)
}

// count adds one call (a failure if failed) to the current bucket and, for
// a failure, returns the calls and failures within the window, the buckets
// that saw calls and those where most calls failed.
func (b *Breaker) count(failed bool) (calls, fails int64, active, failedBuckets int) {
	epoch := b.now().UnixNano() / b.bucketDur
	bk := &b.buckets[epoch%breakerBuckets]
	if e := bk.epoch.Load(); e != epoch && bk.epoch.CompareAndSwap(e, epoch) {
		// A new bucket: forget the counts of breakerBuckets ago. A call
		// racing this reset may be lost; the rate is a sample.
		bk.calls.Store(0)
		bk.fails.Store(0)
	}
	bk.calls.Add(1)
	if !failed {
		return 0, 0, 0, 0
	}
	bk.fails.Add(1)
	for i := range b.buckets {
		o := &b.buckets[i]
		if e := o.epoch.Load(); e > epoch-breakerBuckets && e <= epoch {
			c, f := o.calls.Load(), o.fails.Load()
			calls += c
			fails += f
			if c > 0 {
				active++
			}
			if 2*f > c {
				failedBuckets++
			}
		}
	}
	return calls, fails, active, failedBuckets
}

// resetLocked forgets the window (a closed breaker starts afresh).
func (b *Breaker) resetLocked() {
	for i := range b.buckets {
		b.buckets[i].calls.Store(0)
		b.buckets[i].fails.Store(0)
	}
	b.connRun.Store(0)
}
