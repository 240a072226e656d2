package bans

import (
	"testing"
	"time"

	"github.com/flashgate/flashgate/window"
)

func TestHolds(t *testing.T) {
	earned := window.Limit{Requests: 5, Window: time.Second}
	for name, tc := range map[string]struct {
		ban    window.Ban
		earned window.Limit
		now    window.Limit
		want   bool
	}{
		"same":          {window.DefaultBan, earned, earned, true},
		"tighter":       {window.DefaultBan, earned, window.Limit{Requests: 2, Window: time.Second}, true},
		"looser":        {window.DefaultBan, earned, window.Limit{Requests: 50, Window: time.Second}, false},
		"box off":       {window.Ban{}, earned, earned, false},
		"learnt, fleet": {window.DefaultBan, window.Limit{}, window.Limit{Requests: 50, Window: time.Second}, true},
	} {
		if got := Holds(tc.ban, tc.earned, tc.now); got != tc.want {
			t.Errorf("%s: Holds = %v, want %v", name, got, tc.want)
		}
	}
}

func TestTallyRaisesAndRenews(t *testing.T) {
	ban := window.Ban{Threshold: 2, Window: 10 * time.Second, Duration: time.Minute}
	var tl Tally
	now := int64(time.Hour)
	tl.Begin(now)
	if tl.Deny(ban, now) || tl.Deny(ban, now) {
		t.Fatal("banned at the threshold, want only above it")
	}
	if !tl.Deny(ban, now) || tl.Until() != now+int64(time.Minute) {
		t.Fatalf("above the threshold: until %d, want %d", tl.Until(), now+int64(time.Minute))
	}
	for range 3 { // denied on within the renewal second: unchanged
		if tl.Deny(ban, now+int64(RenewEvery)/2) {
			t.Fatal("renewed within RenewEvery")
		}
	}
	// Past it, the next denial (the count is above the threshold) renews.
	later := now + 2*int64(RenewEvery)
	if !tl.Deny(ban, later) || tl.Until() != later+int64(time.Minute) {
		t.Fatalf("renewal: until %d, want %d", tl.Until(), later+int64(time.Minute))
	}
	tl.Lift(later)
	if tl.Until() != 0 || tl.Deny(ban, later) {
		t.Fatal("after Lift: still banned, or the count kept")
	}
}

func TestBookReconcile(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	day, five := now.Add(24*time.Hour), now.Add(5*time.Minute)
	newBook := func() *Book {
		b := NewBook(10)
		b.Learn("a", day, now)
		b.Learn("b", day, now)
		return b
	}
	// The epoch held: the index is the truth; "b" was lifted meanwhile.
	restore, lift, learn := newBook().Reconcile([]Entry{{"a", day}, {"c", five}}, false, now)
	if len(restore) != 0 || len(lift) != 1 || lift[0].Key != "b" || len(learn) != 2 {
		t.Fatalf("same epoch: restore %v, lift %v, learn %v", restore, lift, learn)
	}
	// Redis lost the bans; a fresh count raised "a" for five minutes.
	restore, lift, learn = newBook().Reconcile([]Entry{{"a", five}}, true, now)
	if len(restore) != 2 || len(lift) != 0 || len(learn) != 0 {
		t.Fatalf("lost: restore %v, lift %v, learn %v; want a and b written back, nothing learnt", restore, lift, learn)
	}
	b := newBook()
	if held, ok := b.Outlasts("a", five, ByThreshold); !ok || !held.Equal(day) {
		t.Fatalf("a shorter count's ban: Outlasts = %v, %v; want the held day", held, ok)
	}
	if _, ok := b.Outlasts("a", five, ByHand); ok {
		t.Fatal("a ban by hand is outlasted, want it to replace the held one")
	}
	if known, apply := b.Learn("a", day, now); !known || apply {
		t.Fatalf("the ban in force learnt again: known %v, apply %v; want known, nothing to apply", known, apply)
	}
	if !b.Forget("a", now) || b.Forget("a", now) {
		t.Fatal("Forget: want true once, then false")
	}
}
