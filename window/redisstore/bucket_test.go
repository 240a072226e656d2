package redisstore

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/flashgate/flashgate/window"
	"github.com/flashgate/flashgate/window/testclock"
)

// TestBucketedRedisMatchesMemory replays one random sequence of requests,
// mixing exact and bucketed hits, costs, shadow hits, repeated keys (of
// either kind), bucket-count changes and conversions both ways, on Memory
// and on the Redis script (ClockLocal on the same injected clock), and
// requires the same decision and the same report of each hit every time:
// the two implementations of the bounded-memory window are one semantics.
func TestBucketedRedisMatchesMemory(t *testing.T) {
	t.Parallel()
	_, c := startRedis(t)
	clock := testclock.New()
	m := newTestMemory(t, clock, 0)
	r := newTestRedis(t, c, Options{Clock: ClockLocal, Now: clock.Now})
	k := testKeys(t)
	rng := rand.New(rand.NewPCG(1, 2))
	const w = 10 * time.Second
	keys := []string{k.Key("a", "1"), k.Key("b", "2"), k.Key("c", "3"), k.Key("d", "4"), k.Key("e", "5"), k.Key("f", "6")}
	converted := false
	var allowed, denied int
	mk := func() window.Hit {
		i := rng.IntN(len(keys))
		h := window.Hit{Key: keys[i], Limit: window.Limit{Requests: 20, Window: w}}
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
		hits := make([]window.Hit, 1+rng.IntN(3))
		for j := range hits {
			hits[j] = mk()
		}
		mem, red := make([]window.HitReport, len(hits)), make([]window.HitReport, len(hits))
		for j := range hits {
			hits[j].Tag = reportInto{&mem[j]}
		}
		want := mustDecide(t, m, hits...)
		for j := range hits {
			hits[j].Tag = reportInto{&red[j]}
		}
		got := mustDecide(t, r, hits...)
		if got != want {
			t.Fatalf("request %d %s:\nredis  %+v\nmemory %+v", i, describe(hits), got, want)
		}
		for j := range hits {
			if red[j] != mem[j] {
				t.Fatalf("request %d %s: hit %d reports\nredis  %+v\nmemory %+v", i, describe(hits), j, red[j], mem[j])
			}
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

// reportInto is a hit's Tag that keeps the hit's own outcome in *r.
type reportInto struct{ r *window.HitReport }

func (t reportInto) ReportHit(r window.HitReport) { *t.r = r }

func describe(hits []window.Hit) string {
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
	clock := testclock.New() // on a whole minute: one sub-window of 10s
	r := newTestRedis(t, c, Options{Clock: ClockLocal, Now: clock.Now})
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
			clock := testclock.New()
			r := newTestRedis(t, c, Options{Clock: ClockLocal, Now: clock.Now})
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
