package fallback

import (
	"testing"
	"time"

	"github.com/flashgate/flashgate/window"
)

// TestSeedShare: a count stored as a share of its limit comes back exactly
// at that limit, for every limit up to the largest.
func TestSeedShare(t *testing.T) {
	for _, limit := range []int{1, 2, 3, 5, 7, 10, 99, 1000, 65_537, 999_983, window.MaxRequests} {
		counts := []int{0, 1, 2, limit / 3, limit / 2, limit - 2, limit - 1, limit, limit + 5}
		for c := 0; c < min(limit, 2000); c++ {
			counts = append(counts, c)
		}
		for _, c := range counts {
			if c < 0 {
				continue
			}
			if got := countOfShare(shareOfLimit(c, limit), limit); got != min(c, limit) {
				t.Fatalf("count %d of %d comes back as %d", c, limit, got)
			}
		}
	}
	// At another limit, proportionally (rounded down from a share rounded up).
	if got := countOfShare(shareOfLimit(5, 10), 4); got != 2 {
		t.Fatalf("5 of 10 at a limit of 4 = %d, want 2", got)
	}
}

// TestSeedTable: a key's own seed is updated both ways and expires; a
// non-informative count is stored only over the key's own live seed; a
// bucket holds seedWays keys' own seeds, and a key that finds no room is
// merged into the bucket's shared entry (the larger share, the later
// expiry), which every key of the bucket without an entry of its own reads
// at its own limit: never a looser seed than its own.
func TestSeedTable(t *testing.T) {
	tab := newSeedTable(16)
	if len(tab.buckets) != 4 {
		t.Fatalf("%d buckets for 16 keys, want 4", len(tab.buckets))
	}
	const sec = int64(time.Second)
	key := func(tag uint64) uint64 { return tag<<32 | 1 } // bucket 1, tag
	load := func(h uint64, limit int, now int64) int {
		n, _, ok := tab.load(h, limit, now)
		if !ok {
			return -1
		}
		return n
	}
	a, b, c, d, e, f := key(10), key(11), key(12), key(13), key(14), key(15)

	tab.store(a, 1, 5, sec, 0, false)
	if n := load(a, 5, 0); n != -1 {
		t.Fatalf("a non-informative count was stored for a key without a seed: %d", n)
	}
	tab.store(a, 4, 5, sec, 0, true)
	if n := load(a, 5, 10); n != 4 {
		t.Fatalf("a's seed = %d, want 4", n)
	}
	tab.store(a, 1, 5, sec, 5, false) // its own seed: updated, even downwards
	if n := load(a, 5, 10); n != 1 {
		t.Fatalf("a's seed after a count of 1 = %d, want 1", n)
	}
	if n := load(b, 5, 10); n != -1 {
		t.Fatalf("b reads a seed (another tag, same bucket): %d", n)
	}
	if n := load(key(10)+2, 5, 10); n != -1 {
		t.Fatalf("another bucket reads a seed: %d", n)
	}
	// Fill the bucket: a (until 1s), b, c, d (later).
	tab.store(b, 30, 100, 3*sec, 10, true)
	tab.store(c, 2, 5, 3*sec, 10, true)
	tab.store(d, 2, 5, 3*sec, 10, true)
	if n := load(e, 5, 20); n != -1 {
		t.Fatalf("e reads a seed before any was shared: %d", n)
	}
	tab.store(e, 5, 10, 2*sec, 20, false) // no room, not informative: dropped
	if n := load(e, 10, 30); n != -1 {
		t.Fatalf("e's non-informative count was stored: %d", n)
	}
	tab.store(e, 5, 10, 2*sec, 20, true) // no room: merged with a's (soonest to expire)
	for _, tc := range []struct {
		name  string
		h     uint64
		limit int
		want  int
	}{
		{"e (merged, its own limit)", e, 10, 5},       // max(1/5, 5/10) = 0.5 of 10
		{"a (merged into)", a, 5, 2},                  // 0.5 of 5, above its own 1
		{"f (no seed, the bucket's shared)", f, 4, 2}, // 0.5 of 4
		{"b (its own)", b, 100, 30},
		{"c (its own)", c, 5, 2},
	} {
		if n := load(tc.h, tc.limit, 30); n != tc.want {
			t.Errorf("%s reads %d, want %d", tc.name, n, tc.want)
		}
	}
	if _, until, _ := tab.load(e, 10, 30); until != 2*sec {
		t.Errorf("the shared seed lasts until %d, want the later of the two (2s)", until)
	}
	tab.store(f, 9, 10, 2*sec, 40, true) // merged: the share only grows
	if n := load(e, 10, 50); n != 9 {
		t.Errorf("e reads %d after f's 9 of 10 was merged, want 9", n)
	}
	tab.store(e, 1, 10, 2*sec, 50, true) // still no room: the shared share stays
	if n := load(e, 10, 60); n != 9 {
		t.Errorf("a shared seed fell to %d on one key's lower count, want 9", n)
	}
	// At 2s the shared entry expires; its place is free for a key's own.
	if n := load(f, 10, 2*sec); n != -1 {
		t.Errorf("f reads %d from an expired shared entry", n)
	}
	tab.store(f, 3, 10, 4*sec, 2*sec, true)
	if n := load(f, 10, 2*sec+1); n != 3 {
		t.Errorf("f's own seed in the freed entry = %d, want 3", n)
	}
	if n := load(e, 10, 2*sec+1); n != -1 {
		t.Errorf("e reads %d from f's own entry", n)
	}
}
