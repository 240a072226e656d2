// Package testclock is a settable clock for tests of code that takes an
// injected clock (window's Now options, extauthz's): Now returns the time the
// clock is at, Advance moves it. Safe for concurrent use.
package testclock

import (
	"sync"
	"time"
)

// Clock is a settable clock.
type Clock struct {
	mu sync.Mutex
	t  time.Time
}

// New returns a clock at a fixed instant (2023-11-14 22:13:20 UTC).
func New() *Clock { return &Clock{t: time.Unix(1_700_000_000, 0)} }

// Now returns the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

// Advance moves the clock by d.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}
