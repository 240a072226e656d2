package memory

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/flashgate/flashgate/window"
	"github.com/flashgate/flashgate/window/windowtest"
)

var bucketed = windowtest.Bucketed

func TestLimitBuckets(t *testing.T) {
	for name, tc := range map[string]struct {
		l     window.Limit
		err   bool
		width time.Duration
	}{
		"exact":                   {l: window.Limit{Requests: 5, Window: time.Second}},
		"60 in an hour":           {l: window.Limit{Requests: 5, Window: time.Hour, Buckets: 60}, width: time.Minute},
		"rounded up":              {l: window.Limit{Requests: 5, Window: 10 * time.Millisecond, Buckets: 3}, width: 3334 * time.Microsecond},
		"one per µs":              {l: window.Limit{Requests: 5, Window: time.Millisecond, Buckets: 1000}, width: time.Microsecond},
		"negative":                {l: window.Limit{Requests: 5, Window: time.Second, Buckets: -1}, err: true},
		"above window.MaxBuckets": {l: window.Limit{Requests: 5, Window: time.Hour, Buckets: window.MaxBuckets + 1}, err: true},
		"shorter than a µs":       {l: window.Limit{Requests: 5, Window: 2 * time.Millisecond, Buckets: 1000}, width: 2 * time.Microsecond},
		"window below width":      {l: window.Limit{Requests: 5, Window: time.Millisecond, Buckets: 1001}, err: true},
	} {
		t.Run(name, func(t *testing.T) {
			err := tc.l.Validate()
			if (err != nil) != tc.err {
				t.Fatalf("Validate(%v) = %v, want error %v", tc.l, err, tc.err)
			}
			if err == nil && tc.l.Width() != tc.width {
				t.Fatalf("Width(%v) = %s, want %s", tc.l, tc.l.Width(), tc.width)
			}
		})
	}
	if got := (window.Limit{Requests: window.AutoBucketsAbove, Window: time.Hour}).Auto(); got.Buckets != 0 {
		t.Errorf("Auto at the threshold = %v, want exact", got)
	}
	if got := (window.Limit{Requests: window.AutoBucketsAbove + 1, Window: time.Hour}).Auto(); got.Buckets != window.DefaultBuckets {
		t.Errorf("Auto above the threshold = %v, want %d buckets", got, window.DefaultBuckets)
	}
	if got := (window.Limit{Requests: 1e6, Window: time.Hour, Buckets: 7}).Auto(); got.Buckets != 7 {
		t.Errorf("Auto of a chosen bucket count = %v, want it kept", got)
	}
	if s := (window.Limit{Requests: 100000, Window: 24 * time.Hour, Buckets: 96}).String(); s != "100000/24h0m0s in 96 buckets" {
		t.Errorf("String = %q", s)
	}
}

// TestBucketedWorstCase pins the bound on an injected clock: the oldest
// sub-window counts whole until it ends, so the window admits again at most
// one width after the exact log would, and retry-after says exactly when.
func TestBucketedWorstCase(t *testing.T) {
	clock := newStepClock() // on a whole second: a sub-window boundary
	m := newTestMemory(t, clock, 0)
	const w = 10 * time.Second
	h := bucketed("k", 10, w, 10) // sub-windows of 1s
	clock.Advance(500 * time.Millisecond)
	for i := range 10 {
		if d := mustAllow(t, m, "fill", h); d.Count != i+1 || d.Remaining != 9-i {
			t.Fatalf("admission %d = %+v", i+1, d)
		}
	}
	d := mustDeny(t, m, "11th", h)
	// The exact log would admit at +10s; the sub-window [0s, 1s) leaves at 11s.
	if d.Count != 10 || d.RetryAfter != 10500*time.Millisecond {
		t.Fatalf("11th = %+v, want count 10, retry-after 10.5s", d)
	}
	clock.Advance(10*time.Second + 100*time.Millisecond) // 10.6s: the exact log has room
	if d := mustDeny(t, m, "past the exact window", h); d.RetryAfter != 400*time.Millisecond {
		t.Fatalf("at 10.6s = %+v, want denied until 11s", d)
	}
	clock.Advance(400 * time.Millisecond) // 11s
	if d := mustAllow(t, m, "once the sub-window has left", h); d.Count != 1 {
		t.Fatalf("at 11s = %+v, want count 1", d)
	}
}

// TestBucketedReload: a key keeps its count when a reload makes its rule
// bucketed, or changes the bucket count (conservatively: a counter moves to
// the sub-window holding its old one's last instant), or makes it exact
// again (Memory: the newest counts become entries at their sub-window's last
// instant).
func TestBucketedReload(t *testing.T) {
	clock := newStepClock()
	m := newTestMemory(t, clock, 0)
	const w = 10 * time.Second
	for range 3 {
		mustAllow(t, m, "exact", hit("k", 5, w))
		clock.Advance(time.Second)
	}
	// Entries at 0, 1, 2s; now 3s. Bucketed in 5 (2s): 0–2s, 2–4s.
	if d := mustAllow(t, m, "bucketed", bucketed("k", 5, w, 5)); d.Count != 4 {
		t.Fatalf("bucketed after 3 exact = %+v, want count 4", d)
	}
	// Now 10 buckets of 1s: the counter of [0,2s) (2) moves to [1s,2s), the
	// one of [2s,4s) (2) to [3s,4s) (now's).
	clock.Advance(8*time.Second + 500*time.Millisecond) // 11.5s: [1s,2s) still overlaps
	d := mustAllow(t, m, "10 buckets", bucketed("k", 5, w, 10))
	if d.Count != 5 {
		t.Fatalf("10 buckets at 11.5s = %+v, want count 5 (2 moved + 2 + this one)", d)
	}
	d = mustDeny(t, m, "full", bucketed("k", 5, w, 10))
	if d.RetryAfter != 500*time.Millisecond {
		t.Fatalf("full = %+v, want retry-after 0.5s ([1s,2s) leaves at 12s)", d)
	}
	// Exact again: 5 entries, the 2 of [1s,2s) at 2s (its end): they leave
	// at 12s.
	if d := mustDeny(t, m, "exact", hit("k", 5, w)); d.Count != 5 || d.RetryAfter != 500*time.Millisecond {
		t.Fatalf("exact again = %+v, want count 5, retry-after 0.5s", d)
	}
}

// arrival is one request of a measured load: when (since the start) and
// its cost.
type arrival struct {
	at   time.Duration
	cost int
}

// steadyLoad arrives every gap, each of cost 1, for d.
func steadyLoad(gap, d time.Duration) []arrival {
	var out []arrival
	for at := time.Duration(0); at < d; at += gap {
		out = append(out, arrival{at: at, cost: 1})
	}
	return out
}

// burstyLoad sends bursts of size requests at random instants (exponential
// gaps of mean gap), for d.
func burstyLoad(rng *rand.Rand, size int, gap, d time.Duration) []arrival {
	var out []arrival
	for at := time.Duration(0); at < d; at += time.Duration(rng.ExpFloat64()*float64(gap)) + time.Microsecond {
		for range size {
			out = append(out, arrival{at: at, cost: 1})
		}
	}
	return out
}

// replay decides load on one key of limit l with Memory on an injected
// clock and returns the admission instants, one per counted request.
func replay(t testing.TB, l window.Limit, load []arrival) []int64 {
	clock := newStepClock()
	clock.Advance(123456 * time.Microsecond) // off the sub-window boundaries
	m := newTestMemory(t, clock, 0)
	start := clock.Now()
	var admitted []int64
	for _, a := range load {
		clock.Advance(start.Add(a.at).Sub(clock.Now()))
		h := window.Hit{Key: "k", Limit: l, Cost: a.cost}
		if mustDecide(t, m, h).Allowed {
			for range a.cost {
				admitted = append(admitted, int64(a.at))
			}
		}
	}
	return admitted
}

// maxInWindow returns the most admissions in any span (t-w, t].
func maxInWindow(ts []int64, w time.Duration) int {
	most, j := 0, 0
	for i := range ts {
		for ts[i]-ts[j] >= int64(w) {
			j++
		}
		most = max(most, i-j+1)
	}
	return most
}

// TestBucketedError measures the bounded-memory window against the exact
// log under a steady and a bursty load (BENCHMARKS.md, "Bounded-memory
// windows"): both never admit more than the limit in any window; the
// bucketed one admits at least B/(B+1) of what the exact log admits.
//
//	go test ./window/ -run TestBucketedError -v
func TestBucketedError(t *testing.T) {
	const limit, w = 1000, time.Hour
	rng := rand.New(rand.NewPCG(10, 10))
	var edge []arrival // the limit at once, every 60.5 minutes
	for at := time.Duration(0); at < 12*w; at += w + 30*time.Second {
		for range limit {
			edge = append(edge, arrival{at: at, cost: 1})
		}
	}
	loads := []struct {
		name      string
		load      []arrival
		saturated bool // demand at every moment: the B/(B+1) bound holds
	}{
		// 1.25 × the limit, evenly: the exact log admits 1000 an hour.
		{"steady 1.25x", steadyLoad(w/1250, 12*w), true},
		// A 2x steady load: refusals at every moment.
		{"steady 2x", steadyLoad(w/2000, 12*w), true},
		// Bursts of 50 about every 2 minutes: ~1500 an hour, in clumps.
		{"bursty 1.5x", burstyLoad(rng, 50, 2*time.Minute, 12*w), false},
		// The worst case: each burst comes 30s after the previous one left
		// the exact window, while its sub-window (≥ 36s) is still counted.
		{"limit/60.5min", edge, false},
	}
	t.Logf("%-14s %8s %9s %9s %9s %9s", "load", "buckets", "admitted", "vs exact", "max/win", "bound")
	for _, ld := range loads {
		exact := replay(t, window.Limit{Requests: limit, Window: w}, ld.load)
		if m := maxInWindow(exact, w); m > limit {
			t.Fatalf("%s exact: %d in one window", ld.name, m)
		}
		t.Logf("%-14s %8s %9d %9s %9d %9s", ld.name, "exact", len(exact), "-", maxInWindow(exact, w), "-")
		for _, b := range []int{10, 60, 100} {
			got := replay(t, window.Limit{Requests: limit, Window: w, Buckets: b}, ld.load)
			most := maxInWindow(got, w)
			if most > limit {
				t.Fatalf("%s, %d buckets: %d admissions in one window, limit %d", ld.name, b, most, limit)
			}
			// The bucketed window is an exact log of a window of at most
			// w + w/b: over the run it admits at least b/(b+1) of the
			// exact log's, less one window's worth at the edges.
			ratio := float64(len(got)) / float64(len(exact))
			bound := float64(b) / float64(b+1)
			if ld.saturated && float64(len(got)) < bound*float64(len(exact))-limit {
				t.Errorf("%s, %d buckets: admitted %d, exact %d: below %.3f of it", ld.name, b, len(got), len(exact), bound)
			}
			t.Logf("%-14s %8d %9d %8.2f%% %9d %8.2f%%", ld.name, b, len(got), 100*ratio, most, 100*bound)
		}
	}
}
