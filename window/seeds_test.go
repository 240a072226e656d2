package window

import (
	"testing"
	"time"
)

// TestSeedTable: a key's own seed is updated both ways and expires; a
// non-informative count is stored only over the key's own live seed; two
// keys live in one slot share the stricter seed (the larger count, the
// later expiry) and never read a looser one; an expired slot is free again.
func TestSeedTable(t *testing.T) {
	tab := newSeedTable(4)
	if len(tab.slots) != 4 {
		t.Fatalf("%d slots for 4 keys, want 4", len(tab.slots))
	}
	const sec = int64(time.Second)
	// Same slot (low bits 1), different tags (high bits).
	a, b, c := uint64(1)<<40|1, uint64(2)<<40|1, uint64(3)<<40|1
	other := uint64(1)<<40 | 2 // another slot

	seed := func(h uint64, now int64) (int, int64, bool) { return tab.load(h, now) }
	if _, _, ok := seed(a, 0); ok {
		t.Fatal("an empty table has a seed")
	}
	tab.store(a, 1, sec, 0, false)
	if _, _, ok := seed(a, 0); ok {
		t.Fatal("a non-informative count was stored for a key without a seed")
	}
	tab.store(a, 4, sec, 0, true)
	if n, until, ok := seed(a, 10); !ok || n != 4 || until != sec {
		t.Fatalf("a's seed = %d until %d (%v), want 4 until 1s", n, until, ok)
	}
	tab.store(a, 1, sec+5, 5, false) // its own seed: updated, even downwards
	if n, _, _ := seed(a, 10); n != 1 {
		t.Fatalf("a's seed after a count of 1 = %d, want 1", n)
	}
	if _, _, ok := seed(b, 10); ok {
		t.Fatal("b reads a's seed (another tag, same slot)")
	}
	if _, _, ok := seed(other, 10); ok {
		t.Fatal("another slot has a seed")
	}
	tab.store(b, 2, 2*sec, 10, false) // not informative, a's slot: dropped
	if n, _, _ := seed(a, 20); n != 1 {
		t.Fatalf("a's seed after b's non-informative count = %d, want 1", n)
	}
	tab.store(b, 3, 2*sec, 10, true) // shares the slot: max for both
	for _, h := range []uint64{a, b, c} {
		if n, until, ok := seed(h, 20); !ok || n != 3 || until != 2*sec {
			t.Fatalf("a shared slot reads %d until %d (%v) for %x, want 3 until 2s", n, until, ok, h)
		}
	}
	tab.store(a, 0, 2*sec, 30, true) // a shared slot only grows
	if n, _, _ := seed(b, 40); n != 3 {
		t.Fatalf("a shared seed fell to %d on one key's lower count, want 3", n)
	}
	if _, _, ok := seed(a, 2*sec); ok {
		t.Fatal("a seed is live at its expiry")
	}
	tab.store(c, 5, 3*sec, 2*sec, true) // the expired slot is c's alone
	if _, _, ok := seed(a, 2*sec+1); ok {
		t.Fatal("a reads c's seed after the shared one expired")
	}
	if n, _, ok := seed(c, 2*sec+1); !ok || n != 5 {
		t.Fatalf("c's seed = %d (%v), want 5", n, ok)
	}
}
