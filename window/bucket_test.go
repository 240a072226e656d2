package window

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"testing"
	"time"
)

// bucketed returns a hit of a bucketed limit.
func bucketed(key string, n int, w time.Duration, buckets int) Hit {
	h := hit(key, n, w)
	h.Limit.Buckets = buckets
	return h
}

func TestLimitBuckets(t *testing.T) {
	for name, tc := range map[string]struct {
		l     Limit
		err   bool
		width time.Duration
	}{
		"exact":              {l: Limit{Requests: 5, Window: time.Second}},
		"60 in an hour":      {l: Limit{Requests: 5, Window: time.Hour, Buckets: 60}, width: time.Minute},
		"rounded up":         {l: Limit{Requests: 5, Window: 10 * time.Millisecond, Buckets: 3}, width: 3334 * time.Microsecond},
		"one per µs":         {l: Limit{Requests: 5, Window: time.Millisecond, Buckets: 1000}, width: time.Microsecond},
		"negative":           {l: Limit{Requests: 5, Window: time.Second, Buckets: -1}, err: true},
		"above MaxBuckets":   {l: Limit{Requests: 5, Window: time.Hour, Buckets: MaxBuckets + 1}, err: true},
		"shorter than a µs":  {l: Limit{Requests: 5, Window: 2 * time.Millisecond, Buckets: 1000}, width: 2 * time.Microsecond},
		"window below width": {l: Limit{Requests: 5, Window: time.Millisecond, Buckets: 1001}, err: true},
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
	if got := (Limit{Requests: AutoBucketsAbove, Window: time.Hour}).Auto(); got.Buckets != 0 {
		t.Errorf("Auto at the threshold = %v, want exact", got)
	}
	if got := (Limit{Requests: AutoBucketsAbove + 1, Window: time.Hour}).Auto(); got.Buckets != DefaultBuckets {
		t.Errorf("Auto above the threshold = %v, want %d buckets", got, DefaultBuckets)
	}
	if got := (Limit{Requests: 1e6, Window: time.Hour, Buckets: 7}).Auto(); got.Buckets != 7 {
		t.Errorf("Auto of a chosen bucket count = %v, want it kept", got)
	}
	if s := (Limit{Requests: 100000, Window: 24 * time.Hour, Buckets: 96}).String(); s != "100000/24h0m0s in 96 buckets" {
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
func replay(t testing.TB, l Limit, load []arrival) []int64 {
	clock := newStepClock()
	clock.Advance(123456 * time.Microsecond) // off the sub-window boundaries
	m := newTestMemory(t, clock, 0)
	start := clock.Now()
	var admitted []int64
	for _, a := range load {
		clock.Advance(start.Add(a.at).Sub(clock.Now()))
		h := Hit{Key: "k", Limit: l, Cost: a.cost}
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
		exact := replay(t, Limit{Requests: limit, Window: w}, ld.load)
		if m := maxInWindow(exact, w); m > limit {
			t.Fatalf("%s exact: %d in one window", ld.name, m)
		}
		t.Logf("%-14s %8s %9d %9s %9d %9s", ld.name, "exact", len(exact), "-", maxInWindow(exact, w), "-")
		for _, b := range []int{10, 60, 100} {
			got := replay(t, Limit{Requests: limit, Window: w, Buckets: b}, ld.load)
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

// TestBucketedRedisMatchesMemory replays one random sequence of requests,
// mixing exact and bucketed hits, costs, shadow hits, repeated keys (of
// either kind), bucket-count changes and conversions both ways, on Memory
// and on the Redis script (ClockLocal on the same injected clock), and
// requires the same decision every time: the two
// implementations of the bounded-memory window are one semantics.
func TestBucketedRedisMatchesMemory(t *testing.T) {
	t.Parallel()
	_, c := startRedis(t)
	clock := newStepClock()
	m := newTestMemory(t, clock, 0)
	r := newTestRedis(t, c, RedisOptions{Clock: ClockLocal, Now: clock.Now})
	k := testKeys(t)
	rng := rand.New(rand.NewPCG(1, 2))
	const w = 10 * time.Second
	keys := []string{k.Key("a", "1"), k.Key("b", "2"), k.Key("c", "3"), k.Key("d", "4"), k.Key("e", "5"), k.Key("f", "6")}
	converted := false
	var allowed, denied int
	mk := func() Hit {
		i := rng.IntN(len(keys))
		h := Hit{Key: keys[i], Limit: Limit{Requests: 20, Window: w}}
		switch i {
		case 0:
			h.Limit.Buckets = 10
		case 1:
			h.Limit.Buckets = []int{3, 7}[rng.IntN(2)] // a reload now and then
		case 2:
			h.Limit.Requests = 8 // exact
		case 3:
			h.Limit.Buckets, h.Limit.Requests, h.Limit.Window = 4, 6, 2*time.Second
		case 4:
			h.Limit.Requests = 12
			if converted { // exact, then bucketed: converted once
				h.Limit.Buckets = 5
			}
		case 5:
			// Exact or bucketed, hit by hit (an override beside a rule, a
			// rollout): converted both ways, within requests too.
			h.Limit.Requests, h.Limit.Buckets = 10, []int{0, 4}[rng.IntN(2)]
		}
		if rng.IntN(5) == 0 {
			h.Cost = 1 + rng.IntN(4)
		}
		h.Shadow = rng.IntN(10) == 0
		return h
	}
	for i := range 3000 {
		converted = i >= 1500
		clock.Advance(time.Duration(rng.IntN(20_000)) * time.Microsecond)
		hits := make([]Hit, 1+rng.IntN(3))
		for j := range hits {
			hits[j] = mk()
		}
		want := mustDecide(t, m, hits...)
		got := mustDecide(t, r, hits...)
		if got != want {
			t.Fatalf("request %d %s:\nredis  %+v\nmemory %+v", i, describe(hits), got, want)
		}
		if got.Allowed {
			allowed++
		} else {
			denied++
		}
	}
	if allowed < 100 || denied < 100 {
		t.Fatalf("%d allowed, %d denied: the sequence does not test both", allowed, denied)
	}
}

func describe(hits []Hit) string {
	s := ""
	for _, h := range hits {
		s += fmt.Sprintf("[%s %v cost %d shadow %v] ", h.Key[len(h.Key)-3:], h.Limit, h.Cost, h.Shadow)
	}
	return s
}

// TestBucketedForgetsIds: a bucketed key remembers the member ids it
// admitted for IdempotencyHorizon (a retry within it counts once: see the
// conformance table), then forgets them, so that it holds its width, its
// counters and only the last seconds' ids whatever the limit.
func TestBucketedForgetsIds(t *testing.T) {
	t.Parallel()
	_, c := startRedis(t)
	clock := newStepClock() // on a whole minute: one sub-window of 10s
	r := newTestRedis(t, c, RedisOptions{Clock: ClockLocal, Now: clock.Now})
	key := testKeys(t).Key("uid", "u1")
	h := bucketed(key, 100, time.Minute, 6)
	for range 20 {
		mustAllow(t, r, "fill", h)
	}
	ctx := context.Background()
	if n := c.ZCard(ctx, key).Val(); n != 22 {
		t.Fatalf("ZCARD %d, want 22 (width, counter, 20 ids)", n)
	}
	if want := fmt.Sprintf("local HORIZON = %d ", IdempotencyHorizon.Microseconds()); !strings.Contains(slidingLua, want) {
		t.Fatalf("redis.lua lacks %q: IdempotencyHorizon and the script disagree", want)
	}
	clock.Advance(IdempotencyHorizon + time.Second)
	if d := mustAllow(t, r, "later", h); d.Count != 21 {
		t.Fatalf("count %d, want 21", d.Count)
	}
	if n := c.ZCard(ctx, key).Val(); n != 3 {
		t.Fatalf("ZCARD %d, want 3 (width, counter, the newest id): %v", n, c.ZRangeWithScores(ctx, key, 0, -1).Val())
	}
}

// TestMeasureBucketBytes prints Redis's MEMORY USAGE of one key holding n
// admissions spread evenly over its window, exact and bucketed
// (BENCHMARKS.md, "Bounded-memory windows"). It runs only when asked:
//
//	FLASHGATE_MEASURE=1 go test ./window/ -run TestMeasureBucketBytes -v
func TestMeasureBucketBytes(t *testing.T) {
	if os.Getenv("FLASHGATE_MEASURE") == "" {
		t.Skip("set FLASHGATE_MEASURE=1 to measure")
	}
	_, c := startRedis(t)
	ctx := context.Background()
	k := testKeys(t)
	t.Logf("%-8s %7s %8s %12s %9s", "window", "n", "buckets", "bytes/key", "entries")
	for _, tc := range []struct {
		w time.Duration
		n int
	}{{24 * time.Hour, 1000}, {24 * time.Hour, 10_000}, {24 * time.Hour, 100_000}, {time.Minute, 10_000}} {
		for _, b := range []int{0, 60, 96} {
			clock := newStepClock()
			r := newTestRedis(t, c, RedisOptions{Clock: ClockLocal, Now: clock.Now})
			key := k.Key("m", fmt.Sprintf("%s-%d-%d", tc.w, tc.n, b))
			h := bucketed(key, tc.n, tc.w, b)
			for range tc.n {
				mustAllow(t, r, "fill", h)
				clock.Advance(tc.w / time.Duration(tc.n))
			}
			bytes, err := c.MemoryUsage(ctx, key, 0).Result()
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("%-8s %7d %8d %12d %9d", tc.w, tc.n, b, bytes, c.ZCard(ctx, key).Val())
		}
	}
}
