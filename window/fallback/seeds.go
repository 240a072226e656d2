package fallback

import (
	"math"
	"math/bits"
	"sync"
)

// seedTable holds a [Fallback]'s seeds (see the package doc): for each key,
// how much of its limit the store last reported used and until when that
// may still be live, in buckets of seedWays entries (a cache line each)
// indexed by the key's hash, each bucket under a striped lock.
type seedTable struct {
	buckets []seedBucket
	mask    uint64
	locks   [seedLocks]sync.Mutex
}

// seedWays is the entries of a bucket; seedLocks the lock stripes.
const (
	seedWays  = 4
	seedLocks = 256
)

// Tags: 0 marks an unused entry and 1 the shared entry; keys' tags are ≥ 2.
const (
	seedEmpty  = 0
	seedShared = 1
)

// seedFull is the share of a key Redis reported at or over its limit.
const seedFull = math.MaxUint32

type seedBucket [seedWays]seedEntry

type seedEntry struct {
	tag   uint32
	share uint32 // used share of the limit, 32-bit fixed point rounded up; seedFull: all of it
	until int64  // UnixNano: the seed holds while now < until
}

// newSeedTable returns a table of at least n entries.
func newSeedTable(n int) *seedTable {
	size := uint64(1) << bits.Len64(uint64(max(n/seedWays, 1)-1))
	return &seedTable{buckets: make([]seedBucket, size), mask: size - 1}
}

// bucketTag returns the bucket and the tag of the key of hash h.
func (t *seedTable) bucketTag(h uint64) (uint64, uint32) {
	tag := uint32(h >> 32)
	if tag <= seedShared {
		tag += 2
	}
	return h & t.mask, tag
}

// shareOfLimit is count of limit as a share, rounded up (limit ≥ 1).
func shareOfLimit(count, limit int) uint32 {
	if count >= limit {
		return seedFull
	}
	if count <= 0 {
		return 0
	}
	hi, lo := bits.Mul64(uint64(count), 1<<32) // count < limit < 2^32: no overflow of hi
	q, r := bits.Div64(hi, lo, uint64(limit))
	if r != 0 {
		q++
	}
	return uint32(q)
}

// countOfShare is share at limit: the count it was made from at the same
// limit (floor, as share was rounded up by less than 1/limit), the
// proportional count at another.
func countOfShare(share uint32, limit int) int {
	if share == seedFull {
		return limit
	}
	return int((uint64(share) * uint64(limit)) >> 32)
}

// store records count of limit for the key of hash h until until. A count
// that is not informative (it leaves the allowance at the share) is stored
// only over a live seed the key holds on its own.
func (t *seedTable) store(h uint64, count, limit int, until, now int64, informative bool) {
	i, tag := t.bucketTag(h)
	share := shareOfLimit(count, limit)
	mu := &t.locks[i%seedLocks]
	mu.Lock()
	defer mu.Unlock()
	b := &t.buckets[i]
	free := -1
	for w := range b {
		e := &b[w]
		if e.tag == tag && now < e.until {
			e.share, e.until = share, until // its own seed: the newer count
			return
		}
		if free < 0 && (e.tag == seedEmpty || now >= e.until) {
			free = w // unused or expired (a shared entry too)
		}
	}
	if !informative {
		return
	}
	if free >= 0 {
		b[free] = seedEntry{tag: tag, share: share, until: until}
		return
	}
	// Every entry holds another key's live seed: merge into the shared
	// entry, making the one soonest to expire the shared entry if none is.
	s := 0
	for w := range b {
		if b[w].tag == seedShared {
			s = w
			break
		}
		if b[w].until < b[s].until {
			s = w
		}
	}
	e := &b[s]
	e.tag, e.share, e.until = seedShared, max(e.share, share), max(e.until, until)
}

// load returns the seed live at now for the key of hash h and limit limit:
// the count Redis reported (or, from a shared entry, the larger share at
// this limit) and its expiry, or ok false.
func (t *seedTable) load(h uint64, limit int, now int64) (seen int, until int64, ok bool) {
	i, tag := t.bucketTag(h)
	mu := &t.locks[i%seedLocks]
	mu.Lock()
	b := t.buckets[i]
	mu.Unlock()
	shared := -1
	for w := range b {
		if now >= b[w].until {
			continue
		}
		if b[w].tag == tag {
			return countOfShare(b[w].share, limit), b[w].until, true
		}
		if b[w].tag == seedShared {
			shared = w
		}
	}
	if shared < 0 {
		return 0, 0, false
	}
	return countOfShare(b[shared].share, limit), b[shared].until, true
}
