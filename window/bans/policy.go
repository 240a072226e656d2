package bans

import (
	"sync/atomic"
	"time"

	"github.com/flashgate/flashgate/window"
)

// RenewEvery is the least time between two renewals of a ban in force, by a
// sidecar's count and by the fleet's alike: a hammered key's ban moves at
// most once per RenewEvery.
const RenewEvery = time.Second

// Due reports whether a ban ending at cur is to be (re)set to end at until,
// at now (all Unix instants in one unit; RenewEvery is given in it): no ban
// is in force, or the one in force ends more than renew before until.
func Due(cur, until, now, renew int64) bool { return cur <= now || cur < until-renew }

// Holds reports whether a ban earned under limit earned still applies to a
// hit of limit l whose rule's box is ban, after a reload: a box turned off
// or a higher rate lifts it; a tighter rule keeps it. A ban earned under no
// known limit (the zero Limit: learnt from the fleet) holds.
func Holds(ban window.Ban, earned, l window.Limit) bool {
	if !ban.Enabled() {
		return false
	}
	// l's rate above earned's, in floats: the products of nanoseconds and
	// counts can overflow an int64.
	return float64(l.Requests)*float64(earned.Window) <= float64(earned.Requests)*float64(l.Window)
}

// Tally is one key's denials toward its penalty box and the key's ban,
// updated in place with atomics so that concurrent checks share it. Its
// instants are Unix nanoseconds. The zero value holds no denial and no ban.
type Tally struct {
	until   atomic.Int64 // banned before this
	start   atomic.Int64 // start of the current count
	denials atomic.Int64
}

// Begin starts the count at now.
func (t *Tally) Begin(now int64) { t.start.Store(now) }

// Until returns when the key's ban ends (0 or past: none).
func (t *Tally) Until() int64 { return t.until.Load() }

// Ban bans the key until until, replacing a ban in force, later or not.
func (t *Tally) Ban(until int64) { t.until.Store(until) }

// Deny counts one denial at now under ban (enabled); it reports whether
// that raised or renewed the ban, which then ends at now + ban.Duration and
// the count starts again.
func (t *Tally) Deny(ban window.Ban, now int64) bool {
	if start := t.start.Load(); now-start > int64(ban.Window) {
		if t.start.CompareAndSwap(start, now) {
			t.denials.Store(0)
		}
	}
	if t.denials.Add(1) <= int64(ban.Threshold) {
		return false
	}
	until := now + int64(ban.Duration)
	if !Due(t.until.Load(), until, now, int64(RenewEvery)) {
		return false
	}
	t.until.Store(until)
	t.denials.Store(0)
	t.start.Store(now)
	return true
}

// Lift ends the ban and forgets the denials counted, starting a new count
// at now.
func (t *Tally) Lift(now int64) {
	t.until.Store(0)
	t.denials.Store(0)
	t.start.Store(now)
}

// Carry copies from's ban, and its count too if count.
func (t *Tally) Carry(from *Tally, count bool) {
	t.until.Store(from.until.Load())
	if count {
		t.start.Store(from.start.Load())
		t.denials.Store(from.denials.Load())
	}
}
