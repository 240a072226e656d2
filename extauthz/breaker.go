package extauthz

import (
	"sync"
	"sync/atomic"
	"time"
)

// BreakerOptions configures the circuit breaker in front of the backend.
//
// After Failures consecutive backend errors or timeouts the breaker opens:
// for Cooldown every check goes straight to its failure mode without calling
// the backend, so calls do not pile onto a failing or slow Redis. Then one
// check is let through as a probe: success closes the breaker, failure opens
// it for another Cooldown. While the probe is in flight, other checks still
// take the failure mode.
type BreakerOptions struct {
	// Failures is the number of consecutive errors that opens the breaker;
	// 0 means 5, a negative value disables the breaker.
	Failures int
	// Cooldown is how long the breaker stays open; 0 means DefaultBreakerCooldown.
	Cooldown time.Duration
}

// DefaultBreakerCooldown is how long an open breaker holds calls off before
// it lets one probe through. Short, so that a restarted Redis is used again
// within a fraction of a second; a failed probe costs one call per cooldown.
const DefaultBreakerCooldown = 250 * time.Millisecond

// breaker is the circuit breaker of [BreakerOptions]. Its fast path (closed,
// healthy) touches only atomics.
type breaker struct {
	threshold int32
	cooldown  time.Duration
	now       func() time.Time

	failures atomic.Int32 // consecutive failures
	open     atomic.Bool  // openUntil is set

	// mu guards the fields below.
	mu        sync.Mutex
	openUntil time.Time
	probing   bool
	probeSeq  uint64 // number of the latest probe handed out
}

func newBreaker(o BreakerOptions, now func() time.Time) *breaker {
	b := &breaker{threshold: int32(o.Failures), cooldown: o.Cooldown, now: now}
	if o.Failures == 0 {
		b.threshold = 5
	}
	if b.cooldown <= 0 {
		b.cooldown = DefaultBreakerCooldown
	}
	return b
}

// allow reports whether a call may go to the backend now and, when that
// call is the half-open probe, its non-zero probe number. A probe must be
// settled: by record, or by release when the call ended without telling
// anything of the backend.
func (b *breaker) allow() (ok bool, probe uint64) {
	if b.threshold < 0 || !b.open.Load() {
		return true, 0
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.open.Load() {
		return true, 0
	}
	if b.probing || b.now().Before(b.openUntil) {
		return false, 0
	}
	b.probing = true
	b.probeSeq++
	return true, b.probeSeq
}

// release gives probe back without an outcome (the local cache answered, or
// the caller gave up), so the next call can probe. A stale probe number (the
// breaker moved on since) releases nothing.
func (b *breaker) release(probe uint64) {
	b.mu.Lock()
	if b.probing && b.probeSeq == probe {
		b.probing = false
	}
	b.mu.Unlock()
}

// record reports the outcome of a call allow let through.
func (b *breaker) record(ok bool) {
	if b.threshold < 0 {
		return
	}
	if ok {
		if b.failures.Load() == 0 && !b.open.Load() {
			return
		}
		b.mu.Lock()
		b.failures.Store(0)
		b.open.Store(false)
		b.probing = false
		b.mu.Unlock()
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	n := b.failures.Add(1)
	if b.probing || n >= b.threshold {
		b.openUntil = b.now().Add(b.cooldown)
		b.open.Store(true)
		b.probing = false
	}
}
