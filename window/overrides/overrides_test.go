package overrides

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/flashgate/flashgate/window"
	"github.com/flashgate/flashgate/window/testclock"
)

func TestCheck(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	file := Rule{Limit: window.Limit{Requests: 100, Window: time.Minute}}
	shadowRule := Rule{Limit: file.Limit, Shadow: true}
	o := func(m Mode, n int, w time.Duration, d time.Duration) *Override {
		return &Override{Target: Target{Domain: "shop", Rule: "coupon"}, Mode: m, Requests: n, Window: w, Set: now, Until: now.Add(d)}
	}
	raised := func(ov *Override) *Override { ov.AllowRaise = true; return ov }
	for name, tc := range map[string]struct {
		o     *Override
		r     Rule
		want  string // "" for none
		raise bool   // the error wraps ErrRaise
	}{
		"cut":                   {o: o(ModeLimit, 10, 0, time.Minute), r: file},
		"cut, longer window":    {o: o(ModeLimit, 100, time.Hour, time.Minute), r: file},
		"same":                  {o: o(ModeLimit, 100, 0, time.Minute), r: file},
		"at the maximum":        {o: o(ModeLimit, 10, 0, MaxDuration), r: file},
		"raise":                 {o: o(ModeLimit, 101, 0, time.Minute), r: file, want: "allow-raise", raise: true},
		"raise by a window":     {o: o(ModeLimit, 100, time.Second, time.Minute), r: file, want: "allow-raise", raise: true},
		"raise allowed":         {o: raised(o(ModeLimit, 1000, 0, time.Minute)), r: file},
		"dry run above":         {o: o(ModeDryRun, 1000, 0, time.Minute), r: file},
		"shadow":                {o: o(ModeShadow, 0, 0, time.Minute), r: file, want: "allow-raise", raise: true},
		"shadow allowed":        {o: raised(o(ModeShadow, 0, 0, time.Minute)), r: file},
		"shadow of a shadow":    {o: raised(o(ModeShadow, 0, 0, time.Minute)), r: shadowRule, want: "shadow mode already"},
		"enforce":               {o: o(ModeEnforce, 0, 0, time.Minute), r: shadowRule},
		"enforce an enforced":   {o: o(ModeEnforce, 0, 0, time.Minute), r: file, want: "enforced already"},
		"too long":              {o: o(ModeLimit, 10, 0, MaxDuration+time.Second), r: file, want: "maximum of 24h"},
		"ended":                 {o: o(ModeLimit, 10, 0, 0), r: file, want: "positive"},
		"no requests":           {o: o(ModeLimit, 0, 0, time.Minute), r: file, want: "at least 1"},
		"window beyond the max": {o: o(ModeLimit, 1, 8*24*time.Hour, time.Minute), r: file, want: "at most"},
		"no rule":               {o: &Override{Mode: ModeEnforce, Set: now, Until: now.Add(time.Minute)}, r: shadowRule, want: "rule"},
		"unknown mode":          {o: o(Mode(9), 1, 0, time.Minute), r: file, want: "unknown override mode"},
	} {
		err := tc.o.Check(tc.r, now)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: %v, want none", name, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: %v, want one saying %q", name, err, tc.want)
		case tc.raise != errors.Is(err, ErrRaise):
			t.Errorf("%s: %v: wraps ErrRaise %v, want %v", name, err, errors.Is(err, ErrRaise), tc.raise)
		}
	}
	long := o(ModeLimit, 1, 0, time.Minute)
	long.Reason = strings.Repeat("x", MaxReason+1)
	if err := long.Check(file, now); err == nil {
		t.Error("a reason beyond MaxReason accepted")
	}
}

func TestApply(t *testing.T) {
	file := window.Limit{Requests: 100, Window: time.Minute, Buckets: 6}
	for name, tc := range map[string]struct {
		o                   *Override
		shadow, shadowAll   bool
		want                window.Limit
		wantShadow, changed bool
	}{
		"cut, the rule's window": {o: &Override{Mode: ModeLimit, Requests: 2}, want: window.Limit{Requests: 2, Window: time.Minute, Buckets: 6}, changed: true},
		"cut, a window":          {o: &Override{Mode: ModeLimit, Requests: 2, Window: time.Hour}, want: window.Limit{Requests: 2, Window: time.Hour, Buckets: 6}, changed: true},
		// The file came below the override since: the file's stands.
		"file below":   {o: &Override{Mode: ModeLimit, Requests: 200}, want: file},
		"raise":        {o: &Override{Mode: ModeLimit, Requests: 200, AllowRaise: true}, want: window.Limit{Requests: 200, Window: time.Minute, Buckets: 6}, changed: true},
		"shadow":       {o: &Override{Mode: ModeShadow}, want: file, wantShadow: true},
		"enforce":      {o: &Override{Mode: ModeEnforce}, shadow: true, want: file},
		"--shadow":     {o: &Override{Mode: ModeEnforce}, shadow: true, shadowAll: true, want: file, wantShadow: true},
		"dry run":      {o: &Override{Mode: ModeDryRun, Requests: 2}, want: file},
		"dry, shadow":  {o: &Override{Mode: ModeDryRun, Requests: 2}, shadow: true, want: file, wantShadow: true},
		"invalid kept": {o: &Override{Mode: ModeLimit, Requests: 0}, want: file},
	} {
		l, sh, changed := tc.o.Apply(file, tc.shadow, tc.shadowAll)
		if l != tc.want || sh != tc.wantShadow || changed != tc.changed {
			t.Errorf("%s: Apply = %v, %v, %v; want %v, %v, %v", name, l, sh, changed, tc.want, tc.wantShadow, tc.changed)
		}
	}
	dry := Override{Mode: ModeDryRun, Requests: 2}
	if l, ok := dry.DryRun(file); !ok || l.Requests != 2 || l.Window != time.Minute {
		t.Errorf("DryRun = %v, %v", l, ok)
	}
	if _, ok := (&Override{Mode: ModeLimit, Requests: 2}).DryRun(file); ok {
		t.Error("DryRun of a limit override: ok")
	}
}

func TestBook(t *testing.T) {
	clock := testclock.New()
	now := clock.Now()
	b := NewBook(clock.Now)
	a := &Override{Target: Target{"shop", "a"}, Mode: ModeLimit, Requests: 1, Set: now, Until: now.Add(time.Minute)}
	c := &Override{Target: Target{"shop", "c"}, Mode: ModeShadow, Set: now, Until: now.Add(time.Hour)}
	if got := b.Lookup("shop", "a"); got != nil {
		t.Fatalf("empty book: Lookup = %v", got)
	}
	set, gone, _ := b.Replace([]*Override{a, c})
	if len(set) != 2 || len(gone) != 0 || b.Lookup("shop", "a") != a || b.Lookup("other", "a") != nil {
		t.Fatalf("Replace: set %v, gone %v", set, gone)
	}
	// The same list again (another sidecar's nudge): nothing changes, the
	// pointers (and their memos) stay.
	same := a.Clone()
	if set, gone, _ := b.Replace([]*Override{same, c}); len(set) != 0 || len(gone) != 0 || b.Lookup("shop", "a") != a {
		t.Fatalf("Replace by the same: set %v, gone %v", set, gone)
	}
	// A clear: c goes.
	if set, gone, _ := b.Replace([]*Override{a}); len(set) != 0 || len(gone) != 1 || gone[0] != c {
		t.Fatalf("Replace after a clear: set %v, gone %v", set, gone)
	}
	// Redis lost the list: a is kept, to be written back.
	restore, set, gone, _ := b.Reconcile(nil, nil, true)
	if len(restore) != 1 || restore[0] != a || len(set) != 0 || len(gone) != 0 || b.Lookup("shop", "a") != a {
		t.Fatalf("Reconcile lost: restore %v, set %v, gone %v", restore, set, gone)
	}
	// Not lost, Redis lacks it (a failover to a replica that missed the
	// set): kept and written back too, well inside its horizon.
	if restore, _, gone, _ := b.Reconcile(nil, nil, false); len(restore) != 1 || restore[0] != a || len(gone) != 0 || b.Lookup("shop", "a") != a {
		t.Fatalf("Reconcile: restore %v, gone %v", restore, gone)
	}
	// Redis's entry outranks it: the list is the truth.
	if restore, _, gone, _ := b.Reconcile(nil, map[Target]int64{a.Target: 1}, false); len(restore) != 0 || len(gone) != 1 || b.Lookup("shop", "a") != nil {
		t.Fatalf("Reconcile under a newer entry: restore %v, gone %v", restore, gone)
	}
	// An override ends by itself, the list unread.
	b.Replace([]*Override{a})
	clock.Advance(time.Minute)
	if b.Lookup("shop", "a") != nil || len(b.List()) != 0 {
		t.Fatal("an override in force at its end")
	}
	// Ended ones are neither set nor gone.
	if set, gone, _ := b.Replace(nil); len(set) != 0 || len(gone) != 0 {
		t.Fatalf("ended: set %v, gone %v", set, gone)
	}
	// Within ClockSlack of its horizon, one Redis lacks (List pruned it)
	// is written back only if Redis lost its list.
	b.Replace([]*Override{a})
	clock.Advance(a.Horizon().Add(-ClockSlack / 2).Sub(clock.Now()))
	if restore, _, _, _ := b.Reconcile([]*Override{a}, nil, false); len(restore) != 0 {
		t.Fatalf("near its horizon, held: restore %v", restore)
	}
	if restore, _, _, _ := b.Reconcile(nil, nil, true); len(restore) != 1 {
		t.Fatalf("near its horizon, lost: restore %v", restore)
	}
	if restore, _, _, _ := b.Reconcile(nil, nil, false); len(restore) != 0 {
		t.Fatalf("near its horizon, pruned: restore %v", restore)
	}
}

// TestVerifyRevision: a revision above MaxRev (Redis's now in ms plus
// ClockSlack) is skipped; one at it is not.
func TestVerifyRevision(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	o := &Override{Target: Target{"shop", "coupon"}, Mode: ModeLimit, Requests: 1, Set: now, Until: now.Add(time.Hour)}
	for _, tc := range []struct {
		rev  int64
		want string
	}{{0, ""}, {now.UnixMilli(), ""}, {MaxRev(now), ""}, {MaxRev(now) + 1, SkipRevision}, {9_000_000_000_000_000, SkipRevision}} {
		o.Rev = tc.rev
		if got, err := o.Verify(now); got != tc.want {
			t.Errorf("rev %d: Verify = %q (%v), want %q", tc.rev, got, err, tc.want)
		}
	}
}

func TestBookBound(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	b := NewBook(func() time.Time { return now })
	list := make([]*Override, MaxInForce+5)
	for i := range list {
		list[i] = &Override{Target: Target{"d", strings.Repeat("r", 1+i%7) + string(rune('a'+i%26)) + time.Duration(i).String()}, Mode: ModeShadow,
			Set: now, Until: now.Add(time.Duration(i+1) * time.Second)}
	}
	b.Replace(list)
	if n := len(b.List()); n != MaxInForce {
		t.Fatalf("%d in force, want the bound %d", n, MaxInForce)
	}
	if b.Lookup("d", list[0].Rule) == nil || b.Lookup("d", list[len(list)-1].Rule) != nil {
		t.Fatal("the bound keeps the soonest to end")
	}
}

// TestBookRevisions: when Redis lost the list, the Book's entry and the
// stored one of a rule meet and the higher revision wins: a clear's
// tombstone outranks an older override, and a newer override an older
// tombstone; an entry is kept until its horizon, ended or not.
func TestBookRevisions(t *testing.T) {
	clock := testclock.New()
	now := clock.Now()
	target := Target{"shop", "coupon"}
	set := func(rev int64) *Override {
		return &Override{Rev: rev, Target: target, Mode: ModeLimit, Requests: 1, Set: now, Until: now.Add(time.Hour)}
	}
	cleared := func(rev int64) *Override { return &Override{Rev: rev, Target: target, Cleared: true, Set: now} }

	b := NewBook(clock.Now)
	b.Replace([]*Override{cleared(5)})
	restore, _, gone, _ := b.Reconcile([]*Override{set(3)}, nil, true)
	if len(restore) != 1 || !restore[0].Cleared || len(gone) != 0 || b.Lookup("shop", "coupon") != nil {
		t.Fatalf("a tombstone over an older override: restore %v, gone %v", restore, gone)
	}

	b = NewBook(clock.Now)
	b.Replace([]*Override{set(3)})
	restore, _, gone, _ = b.Reconcile([]*Override{cleared(5)}, nil, false)
	if len(restore) != 0 || len(gone) != 1 || b.Lookup("shop", "coupon") != nil {
		t.Fatalf("an override under a newer tombstone: restore %v, gone %v", restore, gone)
	}
	restore, set7, _, _ := b.Reconcile([]*Override{set(7)}, nil, false)
	if len(restore) != 0 || len(set7) != 1 || b.Lookup("shop", "coupon") == nil {
		t.Fatalf("a newer override over a tombstone: restore %v, set %v", restore, set7)
	}

	// Redis holds an older entry than the Book (a failover to a replica
	// that missed the newest), lost or not: the Book's is written back,
	// even over one Redis holds but this sidecar skipped.
	if restore, _, _, _ := b.Reconcile([]*Override{set(6)}, nil, false); len(restore) != 1 || restore[0].Rev != 7 {
		t.Fatalf("over an older stored entry: restore %v", restore)
	}
	if restore, _, _, _ := b.Reconcile(nil, map[Target]int64{target: 6}, false); len(restore) != 1 || restore[0].Rev != 7 {
		t.Fatalf("over an older skipped entry: restore %v", restore)
	}
	if restore, _, _, _ := b.Reconcile(nil, map[Target]int64{target: 8}, false); len(restore) != 0 || b.Lookup("shop", "coupon") != nil {
		t.Fatalf("under a newer skipped entry: restore %v", restore)
	}
	b.Replace([]*Override{set(7)})

	// Ended, it is still written back until its horizon.
	clock.Advance(2 * time.Hour)
	if restore, _, _, _ := b.Reconcile(nil, nil, true); len(restore) != 1 || restore[0].Rev != 7 || b.Lookup("shop", "coupon") != nil {
		t.Fatalf("an ended override within its horizon: restore %v", restore)
	}
	clock.Advance(MaxDuration)
	if restore, _, _, _ := b.Reconcile(nil, nil, true); len(restore) != 0 {
		t.Fatalf("past its horizon: restore %v", restore)
	}
}

// TestBookOffset: the Book ends overrides on the fleet's clock, its own
// plus the offset.
func TestBookOffset(t *testing.T) {
	clock := testclock.New()
	now := clock.Now()
	b := NewBook(clock.Now)
	b.Replace([]*Override{{Target: Target{"shop", "a"}, Mode: ModeShadow, AllowRaise: true, Set: now, Until: now.Add(time.Minute)}})
	if b.Lookup("shop", "a") == nil {
		t.Fatal("not in force")
	}
	b.SetOffset(time.Minute)
	if b.Lookup("shop", "a") != nil || !b.Now().Equal(now.Add(time.Minute)) {
		t.Fatal("in force past its end on the fleet's clock")
	}
	b.SetOffset(-time.Hour)
	clock.Advance(time.Hour)
	if b.Lookup("shop", "a") == nil {
		t.Fatal("ended by the sidecar's clock, ahead of the fleet's")
	}
}
