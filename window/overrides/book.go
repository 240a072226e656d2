package overrides

import (
	"cmp"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Book is what a sidecar knows of the fleet's overrides: a snapshot that
// the check path reads without a lock ([Book.Lookup]) and that the
// follower of the fleet's list replaces whole ([Book.Replace],
// [Book.Reconcile]). An override ends by itself: Lookup ignores it from
// its Until on, whether or not the fleet's list is reachable. Book is safe
// for concurrent use.
type Book struct {
	now func() time.Time
	cur atomic.Pointer[map[Target]*Override]

	// mu serialises the replacements of cur.
	mu sync.Mutex
}

// NewBook returns an empty Book on clock now (nil: time.Now).
func NewBook(now func() time.Time) *Book {
	if now == nil {
		now = time.Now
	}
	b := &Book{now: now}
	b.cur.Store(&map[Target]*Override{})
	return b
}

// Lookup returns the override of the rule (domain, rule) in force, nil for
// none. It does not block and allocates nothing; it reads the clock only
// when the rule has an override.
func (b *Book) Lookup(domain, rule string) *Override {
	m := *b.cur.Load()
	if len(m) == 0 {
		return nil
	}
	o := m[Target{Domain: domain, Rule: rule}]
	if o == nil || !o.InForce(b.now()) {
		return nil
	}
	return o
}

// List returns the overrides in force, soonest to end first.
func (b *Book) List() []*Override {
	now := b.now()
	var out []*Override
	for _, o := range *b.cur.Load() {
		if o.InForce(now) {
			out = append(out, o)
		}
	}
	Sort(out)
	return out
}

// Sort orders overrides soonest to end first, then by target.
func Sort(list []*Override) {
	slices.SortFunc(list, func(a, c *Override) int {
		if n := a.Until.Compare(c.Until); n != 0 {
			return n
		}
		if n := cmp.Compare(a.Domain, c.Domain); n != 0 {
			return n
		}
		return cmp.Compare(a.Rule, c.Rule)
	})
}

// Replace makes list (the fleet's overrides) the ones in force, keeping
// at most MaxInForce of them (the soonest to end); it returns the ones
// that took effect (new or changed) and the ones in force that went.
func (b *Book) Replace(list []*Override) (set, gone []*Override) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.replaceLocked(list)
}

func (b *Book) replaceLocked(list []*Override) (set, gone []*Override) {
	now := b.now()
	old := *b.cur.Load()
	live := make([]*Override, 0, len(list))
	for _, o := range list {
		if o != nil && o.InForce(now) {
			live = append(live, o)
		}
	}
	Sort(live)
	next := make(map[Target]*Override, min(len(live), MaxInForce))
	for _, o := range live {
		if len(next) >= MaxInForce {
			break
		}
		if _, dup := next[o.Target]; dup {
			continue
		}
		if prev := old[o.Target]; prev != nil && Same(prev, o) {
			next[o.Target] = prev // keeps its memo
			continue
		}
		next[o.Target] = o
		set = append(set, o)
	}
	for t, o := range old {
		if next[t] == nil && o.InForce(now) {
			gone = append(gone, o)
		}
	}
	b.cur.Store(&next)
	return set, gone
}

// Reconcile follows the fleet's list stored. When lost (Redis lost its
// list since the last reconcile: restarted empty, flushed), the overrides
// held in force that stored lacks are kept and returned as restore, to be
// written back; otherwise stored is the truth and the ones it lacks were
// cleared. set and gone are Replace's.
func (b *Book) Reconcile(stored []*Override, lost bool) (restore, set, gone []*Override) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if lost {
		have := make(map[Target]bool, len(stored))
		for _, o := range stored {
			have[o.Target] = true
		}
		now := b.now()
		for t, o := range *b.cur.Load() {
			if !have[t] && o.InForce(now) {
				restore = append(restore, o)
			}
		}
		stored = append(slices.Clip(stored), restore...)
	}
	set, gone = b.replaceLocked(stored)
	return restore, set, gone
}

// Same reports whether a and c are the same override (one set, seen
// twice).
func Same(a, c *Override) bool {
	return a.Target == c.Target && a.Mode == c.Mode && a.Requests == c.Requests && a.Window == c.Window &&
		a.AllowRaise == c.AllowRaise && a.Set.Equal(c.Set) && a.Until.Equal(c.Until)
}
