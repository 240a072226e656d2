package window

import (
	"math"
	"math/bits"
	"sync"
)

// seedTable holds a [Fallback]'s seeds (see [Fallback.Observe]): for each
// key, the count Redis last reported and until when it may still be live.
// It is a fixed array of slots indexed by the key's hash, so recording a
// seed, which a sidecar alone in its fleet does on every decision Redis
// makes, costs a hash and a short striped lock: no map, no allocation, no
// sweep. A slot holds one key's seed, told apart from other keys' by a tag
// (other bits of the hash). When two keys' seeds are live in one slot at
// once they share it: the larger count and the later expiry hold for both
// until it expires. A collision can only make a key's local allowance
// smaller, never larger.
type seedTable struct {
	slots []seedSlot
	mask  uint64
	locks [seedLocks]sync.Mutex
}

// seedLocks is the number of lock stripes over a seedTable's slots.
const seedLocks = 256

// seedShared marks a slot whose seed two or more keys share.
const seedShared = 1 << 31

type seedSlot struct {
	tag   uint32 // 0: never used; seedShared: shared; else the key's tag
	seen  int32  // the count Redis reported
	until int64  // UnixNano: the seed holds while now < until
}

// newSeedTable returns a table of at least n slots (a power of two).
func newSeedTable(n int) *seedTable {
	size := uint64(1) << bits.Len64(uint64(max(n, 2)-1))
	return &seedTable{slots: make([]seedSlot, size), mask: size - 1}
}

// slotTag returns the slot index and the tag (never 0 nor seedShared) of
// the key of hash h.
func (t *seedTable) slotTag(h uint64) (uint64, uint32) {
	return h & t.mask, uint32(h>>33) | 1
}

// store records count for the key of hash h until until. A count that is
// not informative (it leaves the allowance at the share) is stored only
// over a seed the key already holds on its own.
func (t *seedTable) store(h uint64, count int, until, now int64, informative bool) {
	i, tag := t.slotTag(h)
	seen := int32(min(count, math.MaxInt32))
	mu := &t.locks[i%seedLocks]
	mu.Lock()
	s := &t.slots[i]
	switch {
	case s.tag == tag && now < s.until:
		s.seen, s.until = seen, until // the key's own seed: the newer count
	case !informative:
	case now >= s.until:
		*s = seedSlot{tag: tag, seen: seen, until: until}
	default:
		// Another key's live seed: share the slot, the stricter of the two.
		s.tag, s.seen, s.until = seedShared, max(s.seen, seen), max(s.until, until)
	}
	mu.Unlock()
}

// load returns the seed live at now for the key of hash h: its count and
// expiry, or ok false.
func (t *seedTable) load(h uint64, now int64) (seen int, until int64, ok bool) {
	i, tag := t.slotTag(h)
	mu := &t.locks[i%seedLocks]
	mu.Lock()
	s := t.slots[i]
	mu.Unlock()
	if now >= s.until || s.tag != tag && s.tag != seedShared {
		return 0, 0, false
	}
	return int(s.seen), s.until, true
}
