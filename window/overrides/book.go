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
// its Until on, whether or not the fleet's list is reachable.
//
// Ends are on the fleet's clock (Redis's): the Book runs on the sidecar's
// clock plus the offset its follower last measured ([Book.SetOffset]), so
// sidecars whose clocks disagree still end an override together.
//
// Beside the overrides in force the Book keeps, for each rule, the latest
// entry it saw (an ended override, or a clear's tombstone) until that
// entry's Horizon: when Redis loses the list, the sidecars write back what
// they know and the highest Rev wins, so a sidecar that missed a clear or
// a newer set cannot bring the older override back. Book is safe for
// concurrent use.
type Book struct {
	now    func() time.Time
	offset atomic.Int64 // the fleet's clock minus the sidecar's, in ns
	// cur holds each rule's latest entry: an override (in force or ended)
	// or a tombstone.
	cur  atomic.Pointer[map[Target]*Override]
	skip atomic.Pointer[func(Skip)]

	// mu serialises the replacements of cur.
	mu sync.Mutex
}

// Skip is an entry of the fleet's overrides that the sidecar does not
// apply: What names it (bounded, printable), Reason is one of the Skip
// constants, Err says why.
type Skip struct {
	What   string
	Reason string
	Err    error
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

// Now returns the fleet's time as the sidecar reckons it: its clock plus
// the offset.
func (b *Book) Now() time.Time { return b.now().Add(time.Duration(b.offset.Load())) }

// Local returns the sidecar's own clock, the one SetOffset's offset is
// measured against.
func (b *Book) Local() time.Time { return b.now() }

// SetOffset sets how far the fleet's clock is ahead of the sidecar's.
func (b *Book) SetOffset(d time.Duration) { b.offset.Store(int64(d)) }

// OnSkip makes fn hear of the entries the sidecar does not apply (see
// Skipped); set it before the Book is used.
func (b *Book) OnSkip(fn func(Skip)) { b.skip.Store(&fn) }

// Skipped reports an entry the sidecar does not apply to OnSkip's
// function: the follower's for an entry it read, the check path's for an
// override that would raise the file's limit.
func (b *Book) Skipped(s Skip) {
	if fn := b.skip.Load(); fn != nil {
		(*fn)(s)
	}
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
	if o == nil || o.Cleared || !o.InForce(b.Now()) {
		return nil
	}
	return o
}

// List returns the overrides in force, soonest to end first.
func (b *Book) List() []*Override {
	now := b.Now()
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

// Replace makes list (the fleet's entries: overrides and tombstones) the
// ones the Book knows, keeping at most MaxInForce overrides in force (the
// soonest to end) and as many other entries (the newest); it returns the
// overrides that took effect (new or changed), the ones in force that
// went, and the ones in force left out by the bound.
func (b *Book) Replace(list []*Override) (set, gone, over []*Override) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.replaceLocked(list)
}

func (b *Book) replaceLocked(list []*Override) (set, gone, over []*Override) {
	now := b.Now()
	old := *b.cur.Load()
	var live, marks []*Override
	for _, o := range list {
		switch {
		case o == nil:
		case o.InForce(now):
			live = append(live, o)
		case now.Before(o.Horizon()):
			marks = append(marks, o)
		}
	}
	Sort(live)
	slices.SortFunc(marks, func(a, c *Override) int { return cmp.Compare(c.Rev, a.Rev) })
	next := make(map[Target]*Override, min(len(live), MaxInForce)+min(len(marks), MaxInForce))
	// put keeps the higher revision of a rule's entries; it reports
	// whether the rule is new to next.
	put := func(o *Override) bool {
		have := next[o.Target]
		if have == nil || have.Rev < o.Rev {
			next[o.Target] = o
		}
		return have == nil
	}
	n := 0
	for _, o := range live {
		if n >= MaxInForce {
			over = append(over, o)
			continue
		}
		if put(o) {
			n++
		}
	}
	n = 0
	for _, o := range marks {
		if n < MaxInForce && put(o) {
			n++
		}
	}
	for t, o := range next {
		if !o.InForce(now) {
			continue
		}
		if prev := old[t]; prev != nil && Same(prev, o) {
			next[t] = prev // keeps its memo
			continue
		}
		set = append(set, o)
	}
	for t, o := range old {
		if o.InForce(now) && (next[t] == nil || !next[t].InForce(now)) {
			gone = append(gone, o)
		}
	}
	Sort(set)
	Sort(gone)
	b.cur.Store(&next)
	return set, gone, over
}

// Reconcile follows the fleet's entries stored; held is the revision of
// each rule's entry in Redis, whether stored holds it or it was skipped
// (nil: stored's). Each entry the Book holds within its Horizon that
// outranks Redis's for its rule (a higher Rev than held), or that Redis
// lacks, is kept and returned as restore, to be written back; elsewhere
// stored wins. Redis lacks an entry when it lost its list (lost: restarted
// empty, flushed, since the last reconcile), when it failed over to a
// replica that missed the rule's first set, or when the operator's List
// pruned it past its Horizon: so one Redis lacks while not lost is written
// back only until ClockSlack before its Horizon. A rule's entry leaves the
// fleet by a clear's tombstone, never by its field's absence. So a sidecar
// that saw a clear or a newer set prevails over one that missed it,
// whichever writes back first. set, gone and over are Replace's.
func (b *Book) Reconcile(stored []*Override, held map[Target]int64, lost bool) (restore, set, gone, over []*Override) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if held == nil {
		held = make(map[Target]int64, len(stored))
		for _, o := range stored {
			held[o.Target] = max(held[o.Target], o.Rev)
		}
	}
	now := b.Now()
	for t, o := range *b.cur.Load() {
		rev, ok := held[t]
		if now.Before(o.Horizon()) && (ok && rev < o.Rev || !ok && (lost || now.Before(o.Horizon().Add(-ClockSlack)))) {
			restore = append(restore, o)
		}
	}
	if len(restore) > 0 {
		stored = append(slices.Clip(stored), restore...)
	}
	set, gone, over = b.replaceLocked(stored)
	return restore, set, gone, over
}

// Same reports whether a and c are the same entry (one set, seen twice).
func Same(a, c *Override) bool {
	return a.Rev == c.Rev && a.Target == c.Target && a.Cleared == c.Cleared && a.Mode == c.Mode && a.Requests == c.Requests &&
		a.Window == c.Window && a.AllowRaise == c.AllowRaise && a.Set.Equal(c.Set) && a.Until.Equal(c.Until)
}
