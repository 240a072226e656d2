package guard

import (
	"sync"
	"testing"
	"time"

	"github.com/flashgate/flashgate/window"
	"github.com/flashgate/flashgate/window/testclock"
)

// reports is a BanReporter that records what it is told.
type reports struct {
	mu   sync.Mutex
	keys []string
	bans []window.Ban
}

func (r *reports) Denied(key string, ban window.Ban) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.keys = append(r.keys, key)
	r.bans = append(r.bans, ban)
}

func (r *reports) count(key string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, k := range r.keys {
		if k == key {
			n++
		}
	}
	return n
}

func newReportingGuard(t *testing.T, ban window.Ban) (*Guard, *countingLimiter, *testclock.Clock, *reports) {
	t.Helper()
	clock := testclock.New()
	backend := &countingLimiter{next: newTestMemory(t, clock, 0)}
	rep := &reports{}
	g, err := NewGuard(backend, GuardOptions{Now: clock.Now, Ban: ban, Reporter: rep})
	if err != nil {
		t.Fatalf("NewGuard: %v", err)
	}
	t.Cleanup(g.Close)
	return g, backend, clock, rep
}

func TestGuardFleetBanAndLift(t *testing.T) {
	g, backend, clock, _ := newReportingGuard(t, window.DefaultBan)
	h := asking(hit("k", 5, time.Second))
	g.Ban("k", clock.Now().Add(time.Minute))
	for i := range 3 {
		d := mustDecide(t, g, h)
		if d.Allowed || d.Source != window.SourceLocalBanned || d.RetryAfter != time.Minute-time.Duration(i)*time.Second {
			t.Fatalf("check %d of a banned key: %+v, want a local ban refusal, retry %v", i, d, time.Minute-time.Duration(i)*time.Second)
		}
		clock.Advance(time.Second)
	}
	if n := backend.calls.Load(); n != 0 {
		t.Fatalf("the backend was asked %d times about a banned key", n)
	}
	// A ban is replaced, earlier too.
	g.Ban("k", clock.Now().Add(10*time.Second))
	if d := mustDecide(t, g, h); d.RetryAfter != 10*time.Second {
		t.Fatalf("after a shorter ban: retry %v, want 10s", d.RetryAfter)
	}
	g.Lift("k")
	if d := mustDecide(t, g, h); !d.Allowed || backend.calls.Load() != 1 {
		t.Fatalf("after Lift: %+v (backend calls %d), want the backend's admission", d, backend.calls.Load())
	}
	// Lifting a key the Guard does not know is a no-op.
	g.Lift("unknown")
	// A ban ends by itself.
	g.Ban("k", clock.Now().Add(time.Second))
	clock.Advance(time.Second)
	if d := mustDecide(t, g, h); !d.Allowed {
		t.Fatalf("at the ban's end: %+v, want allowed", d)
	}
}

// TestGuardFleetBanFollowsRule: a ban learnt by Ban holds only where the
// hit's rule enables a penalty box, and a reload that loosens the rule
// after the ban refused a hit lifts it, as for the Guard's own bans.
func TestGuardFleetBanFollowsRule(t *testing.T) {
	g, backend, clock, _ := newReportingGuard(t, window.DefaultBan)
	off := hit("k", 5, time.Second) // its rule asks for no box
	g.Ban("k", clock.Now().Add(time.Minute))
	if d := mustDecide(t, g, off); !d.Allowed || backend.calls.Load() != 1 {
		t.Fatalf("a rule without a penalty box: %+v, want the backend's admission", d)
	}
	if d := mustDecide(t, g, asking(hit("k", 5, time.Second))); d.Source != window.SourceLocalBanned {
		t.Fatalf("the rule with its box: %+v, want a ban refusal", d)
	}
	// Tighter still holds; looser lifts.
	if d := mustDecide(t, g, asking(hit("k", 2, time.Second))); d.Source != window.SourceLocalBanned {
		t.Fatalf("a tighter rule: %+v, want a ban refusal", d)
	}
	if d := mustDecide(t, g, asking(hit("k", 50, time.Second))); !d.Allowed {
		t.Fatalf("a looser rule: %+v, want the backend's admission", d)
	}
}

func TestGuardReportsDenials(t *testing.T) {
	ban := window.Ban{Threshold: 100, Window: time.Minute, Duration: time.Minute}
	g, _, _, rep := newReportingGuard(t, ban)
	h := asking(hit("k", 1, time.Second))
	mustDecide(t, g, h) // admitted: no report
	if n := rep.count("k"); n != 0 {
		t.Fatalf("an admission reported %d denials", n)
	}
	mustDecide(t, g, h) // the backend denies
	mustDecide(t, g, h) // refused locally: full
	if n := rep.count("k"); n != 2 {
		t.Fatalf("%d denials reported, want 2 (the backend's and the local refusal)", n)
	}
	if rep.bans[0] != ban {
		t.Fatalf("reported ban %+v, want the Guard's %+v", rep.bans[0], ban)
	}
	// A rule's own box is reported, the fields it leaves out taken from the
	// Guard's; a rule that asks for none, or shadow: no report.
	own := window.Ban{Threshold: 3, Duration: time.Hour}
	r := hit("r", 1, time.Second)
	r.Tag = ruleBan{&own}
	mustDecide(t, g, r)
	mustDecide(t, g, r)
	want := window.Ban{Threshold: 3, Window: time.Minute, Duration: time.Hour}
	if n := rep.count("r"); n != 1 || rep.bans[len(rep.bans)-1] != want {
		t.Fatalf("rule's box: %d reports, last %+v; want 1 with %+v", n, rep.bans[len(rep.bans)-1], want)
	}
	off := hit("off", 1, time.Second)
	off.Tag = ruleBan{nil}
	sh := asking(hit("sh", 1, time.Second))
	sh.Shadow = true
	for range 3 {
		mustDecide(t, g, off)
		mustDecide(t, g, sh)
	}
	if n := rep.count("off") + rep.count("sh"); n != 0 {
		t.Fatalf("%d denials reported for a rule without a box or a shadow hit", n)
	}
}

// TestGuardBanConcurrent runs Ban and Lift against checks of the same keys
// (for -race).
func TestGuardBanConcurrent(t *testing.T) {
	g, _, clock, _ := newReportingGuard(t, window.DefaultBan)
	keys := []string{"a", "b", "c"}
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for i := range 200 {
				k := keys[(i+w)%len(keys)]
				switch {
				case w == 0 && i%2 == 0:
					g.Ban(k, clock.Now().Add(time.Minute))
				case w == 0:
					g.Lift(k)
				default:
					mustDecide(t, g, asking(hit(k, 3, time.Second)))
				}
			}
		})
	}
	wg.Wait()
	g.Ban("a", clock.Now().Add(time.Minute))
	if d := mustDecide(t, g, asking(hit("a", 3, time.Second))); d.Source != window.SourceLocalBanned {
		t.Fatalf("after the storm, a ban: %+v", d)
	}
}
