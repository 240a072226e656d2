package windowtest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/flashgate/flashgate/window"
)

// resetCases are conformanceCases of Decision.Reset and HitReport.Reset: an
// admission's time until its window's oldest counted admission leaves. Like
// the retry-after cases they bracket the instants of the admissions and of
// the decision (see checkLeave).
var resetCases = []conformanceCase{
	{name: "reset: the whole window on a fresh key, until the oldest admission leaves on one with entries", run: func(t *testing.T, st Store, k window.Keys) bool {
		lim := st.Limiter
		const w = 300 * time.Millisecond
		var rep window.HitReport
		h := Hit(k.Key("uid", "u1"), 3, w)
		h.Tag = reportTo{&rep}
		d, first := timedDecide(t, lim, h)
		if !d.Allowed || d.Reset != w || rep.Reset != w {
			t.Fatalf("a fresh key = %+v, its hit %+v; want allowed with reset %s", d, rep, w)
		}
		time.Sleep(50 * time.Millisecond)
		d, at := timedDecide(t, lim, h)
		if !at.before(first.start.Add(w)) {
			return false // the first admission may have left
		}
		if !d.Allowed || d.Count != 2 {
			t.Fatalf("second = %+v, want allowed with count 2", d)
		}
		checkLeave(t, "second (until the first leaves)", "reset", d.Reset, first, at, w)
		if rep.Reset != d.Reset {
			t.Fatalf("the hit reports reset %s, the decision %s", rep.Reset, d.Reset)
		}
		return true
	}},
	{name: "reset: once the oldest admission left, until the next one leaves", run: func(t *testing.T, st Store, k window.Keys) bool {
		lim := st.Limiter
		const w = 300 * time.Millisecond
		// A key full before the trim (limit 2) and one with room anyway
		// (limit 3), each alone and beside a fresh key of a higher limit,
		// which leaves it binding.
		for _, tc := range []struct {
			name   string
			limit  int
			beside bool
		}{{"full", 2, false}, {"room", 3, false}, {"full, two keys", 2, true}, {"room, two keys", 3, true}} {
			h := Hit(k.Key("uid", tc.name), tc.limit, w)
			_, first := timedDecide(t, lim, h)
			time.Sleep(100 * time.Millisecond)
			_, second := timedDecide(t, lim, h)
			sleepUntil(first.end.Add(w + time.Millisecond))
			hits := []window.Hit{h}
			if tc.beside {
				hits = []window.Hit{Hit(k.Key("ip", tc.name), 100, w), h}
			}
			d, at := timedDecide(t, lim, hits...)
			if !at.before(second.start.Add(w)) {
				return false // the second admission may have left
			}
			if !d.Allowed || d.Index != len(hits)-1 || d.Count != 2 {
				t.Fatalf("%s: after the first left = %+v, want allowed on hit %d with count 2", tc.name, d, len(hits)-1)
			}
			checkLeave(t, tc.name+": after the first left (until the second leaves)", "reset", d.Reset, second, at, w)
		}
		return true
	}},
	{name: "reset: bucketed, until the oldest counted sub-window leaves", run: func(t *testing.T, st Store, k window.Keys) bool {
		lim := st.Limiter
		const w, width = time.Second, 500 * time.Millisecond
		h := Bucketed(k.Key("uid", "u1"), 5, w, 2)
		b0 := nextSubWindow(width)
		d, a := timedDecide(t, lim, h)
		if !a.before(b0.Add(width)) {
			return false // not in the sub-window it started in
		}
		end := interval{b0.Add(width), b0.Add(width)} // the first sub-window's end
		if !d.Allowed {
			t.Fatalf("first = %+v, want allowed", d)
		}
		checkLeave(t, "a fresh bucketed key (until its sub-window leaves)", "reset", d.Reset, end, a, w)
		sleepUntil(end.end.Add(10 * time.Millisecond))
		d, b := timedDecide(t, lim, h)
		if !b.before(end.end.Add(w)) {
			return false // the first sub-window may have left
		}
		if !d.Allowed || d.Count != 2 {
			t.Fatalf("second = %+v, want allowed with count 2", d)
		}
		checkLeave(t, "in the next sub-window (until the first leaves)", "reset", d.Reset, end, b, w)
		return true
	}},
	{name: "reset: several keys, the binding hit's, each hit its own", run: func(t *testing.T, st Store, k window.Keys) bool {
		lim := st.Limiter
		const w, width = 10 * time.Second, 2 * time.Second
		var rf, ru, rb, r1, r2 window.HitReport
		fresh, used, bk := Hit(k.Key("ip", "1.2.3.4"), 50, w), Hit(k.Key("uid", "u1"), 3, 2*w), Bucketed(k.Key("fp", "f1"), 40, w, 5)
		_, first := timedDecide(t, lim, used)
		fresh.Tag, used.Tag, bk.Tag = reportTo{&rf}, reportTo{&ru}, reportTo{&rb}
		d, at := timedDecide(t, lim, fresh, used, bk)
		sub := at.start.Truncate(width).Add(width)
		if !at.end.Before(sub) {
			return false // the bucketed key's sub-window is not known
		}
		if !d.Allowed || d.Index != 1 || d.Remaining != 1 {
			t.Fatalf("decision %+v, want allowed on hit 1 with 1 remaining", d)
		}
		checkLeave(t, "the binding hit (until its first admission leaves)", "reset", d.Reset, first, at, 2*w)
		if ru.Reset != d.Reset || rf.Reset != w {
			t.Fatalf("hits report resets %s (fresh) and %s (binding), want %s and the decision's %s", rf.Reset, ru.Reset, w, d.Reset)
		}
		checkLeave(t, "the fresh bucketed hit (until its sub-window leaves)", "reset", rb.Reset, interval{sub, sub}, at, w)
		// The same key twice: each hit reports the key's reset (per-slot
		// mode decides them one after the other, within the decision).
		for i, key := range []string{used.Key, k.Key("uid", "fresh")} {
			h1, h2 := Hit(key, 3, 2*w), Hit(key, 3, 2*w)
			h1.Tag, h2.Tag = reportTo{&r1}, reportTo{&r2}
			d, x := timedDecide(t, lim, h1, h2)
			if !d.Allowed || d.Index != 0 || d.Reset != r1.Reset {
				t.Fatalf("%s twice = %+v, want allowed on hit 0 with hit 0's reset %s", key, d, r1.Reset)
			}
			oldest := first
			if i == 1 {
				oldest = x // the request started the key
				if r1.Reset != 2*w {
					t.Fatalf("a fresh key twice: hit 0's reset %s, want %s", r1.Reset, 2*w)
				}
			}
			checkLeave(t, key+" twice, hit 0", "reset", r1.Reset, oldest, x, 2*w)
			checkLeave(t, key+" twice, hit 1", "reset", r2.Reset, oldest, x, 2*w)
		}
		return true
	}},
	{name: "reset: a retried admission on a full key counts from its first attempt", redisOnly: true, run: func(t *testing.T, st Store, k window.Keys) bool {
		const w, width = 10 * time.Second, 5 * time.Second
		for _, tc := range []struct {
			name string
			hits []window.Hit
		}{
			{"exact", []window.Hit{Hit(k.Key("uid", "exact"), 1, w)}},
			{"bucketed", []window.Hit{Bucketed(k.Key("uid", "bucketed"), 1, w, 2)}},
			{"two keys", []window.Hit{Hit(k.Key("ip", "two"), 1, w), Bucketed(k.Key("uid", "two"), 1, w, 2)}},
		} {
			reps := make([]window.HitReport, len(tc.hits))
			for j := range tc.hits {
				tc.hits[j].Tag = reportTo{&reps[j]}
			}
			member := st.Member()
			var entry, sub interval // the first attempt; the end of its sub-window
			for i := range 3 {
				d, at := timedDecideAs(t, st, tc.hits, member)
				if i == 0 {
					entry = at
					end := at.start.Truncate(width).Add(width)
					if !at.end.Before(end) {
						return false // the bucketed key's sub-window is not known
					}
					sub = interval{end, end}
				}
				if !d.Allowed || d.Count != 1 || d.Reset != reps[d.Index].Reset {
					t.Fatalf("%s: attempt %d = %+v, want allowed with count 1 and its binding hit's reset", tc.name, i+1, d)
				}
				for j, h := range tc.hits {
					oldest := entry
					if h.Limit.Buckets > 0 {
						oldest = sub
					}
					checkLeave(t, fmt.Sprintf("%s: attempt %d, hit %d", tc.name, i+1, j), "reset", reps[j].Reset, oldest, at, w)
				}
			}
		}
		return true
	}},
	{name: "reset: 0 for a denial and each of its hits, and for an admission bound by a full shadow hit", run: func(t *testing.T, st Store, k window.Keys) bool {
		lim := st.Limiter
		const w = 10 * time.Second
		var rf, ro window.HitReport
		full, other := Hit(k.Key("uid", "u1"), 1, w), Hit(k.Key("ip", "1.2.3.4"), 5, w)
		MustAllow(t, lim, "fill", full)
		MustAllow(t, lim, "other", other)
		full.Tag, other.Tag = reportTo{&rf}, reportTo{&ro}
		d := MustDeny(t, lim, "a full key", other, full)
		if d.Reset != 0 || !ro.Known || ro.Over || ro.Reset != 0 || !rf.Over || rf.Reset != 0 {
			t.Fatalf("denial %+v, its hits %+v and %+v; want reset 0 for each", d, ro, rf)
		}
		sh := Hit(k.Key("fp", "f1"), 1, w)
		sh.Shadow = true
		MustAllow(t, lim, "shadow", sh)
		other.Tag = nil
		if d := MustAllow(t, lim, "bound by a full shadow hit", other, sh); !d.Shadowed || d.Index != 1 || d.Reset != 0 {
			t.Fatalf("admission %+v, want shadowed, bound at 1 with reset 0", d)
		}
		return true
	}},
}

// timedDecideAs decides hits as the request of member and brackets the
// instant of the decision.
func timedDecideAs(t *testing.T, st Store, hits []window.Hit, member string) (window.Decision, interval) {
	t.Helper()
	start := time.Now()
	d, err := st.DecideAs(context.Background(), hits, member)
	if err != nil {
		t.Fatalf("DecideAs: %v", err)
	}
	return d, interval{start: start, end: time.Now()}
}
