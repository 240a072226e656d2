package memory

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flashgate/flashgate/window"
	"github.com/flashgate/flashgate/window/testclock"
	"github.com/flashgate/flashgate/window/windowtest"
)

// stepClock is the injected clock of the in-memory tests.
type stepClock = testclock.Clock

func newStepClock() *stepClock { return testclock.New() }

func newTestMemory(t testing.TB, clock *stepClock, maxKeys int) *Memory {
	t.Helper()
	m, err := New(Options{Now: clock.Now, MaxKeys: maxKeys})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return m
}

var (
	hit        = windowtest.Hit
	mustDecide = windowtest.MustDecide
	mustAllow  = windowtest.MustAllow
	mustDeny   = windowtest.MustDeny
)

func TestMemorySliding(t *testing.T) {
	clock := newStepClock()
	m := newTestMemory(t, clock, 0)
	h := hit("k", 3, time.Second)

	for i := range 3 {
		d := mustDecide(t, m, h)
		if !d.Allowed || d.Remaining != 2-i || d.Count != i+1 {
			t.Fatalf("request %d: %+v, want allowed with remaining %d", i, d, 2-i)
		}
		clock.Advance(100 * time.Millisecond)
	}
	// t=300ms: entries at 0, 100, 200ms; the one at 0 leaves at 1000ms.
	d := mustDecide(t, m, h)
	if d.Allowed || d.RetryAfter != 700*time.Millisecond || d.Remaining != 0 || d.Index != 0 {
		t.Fatalf("4th: %+v, want denied, retry after 700ms", d)
	}
	clock.Advance(699 * time.Millisecond) // t=999ms
	if d := mustDecide(t, m, h); d.Allowed || d.RetryAfter != time.Millisecond {
		t.Fatalf("at 999ms: %+v, want denied for 1ms more", d)
	}
	clock.Advance(time.Millisecond) // t=1000ms: the first entry is exactly one window old
	if d := mustDecide(t, m, h); !d.Allowed {
		t.Fatalf("at 1000ms: %+v, want allowed", d)
	}
	// Denied requests were not recorded: the window now holds 100, 200, 1000ms.
	clock.Advance(100 * time.Millisecond) // 1100: 100 leaves
	if d := mustDecide(t, m, h); !d.Allowed || d.Count != 3 {
		t.Fatalf("at 1100ms: %+v, want allowed with count 3", d)
	}
}

func TestMemoryAllOrNothing(t *testing.T) {
	clock := newStepClock()
	m := newTestMemory(t, clock, 0)
	small, big := hit("small", 1, time.Second), hit("big", 10, time.Second)

	if d := mustDecide(t, m, big, small); !d.Allowed || d.Index != 1 || d.Remaining != 0 {
		t.Fatalf("first: %+v, want allowed, tightest = small", d)
	}
	for range 5 {
		if d := mustDecide(t, m, big, small); d.Allowed || d.Index != 1 {
			t.Fatalf("denied by small expected: %+v", d)
		}
	}
	// big recorded only the admitted request.
	if d := mustDecide(t, m, big); !d.Allowed || d.Count != 2 {
		t.Fatalf("big alone: %+v, want count 2", d)
	}
}

func TestMemoryShadow(t *testing.T) {
	clock := newStepClock()
	m := newTestMemory(t, clock, 0)
	enf := hit("enf", 10, time.Second)
	sh := hit("sh", 2, time.Second)
	sh.Shadow = true
	for i := range 4 {
		d := mustDecide(t, m, enf, sh)
		if !d.Allowed {
			t.Fatalf("request %d denied by a shadow hit: %+v", i, d)
		}
		if got, want := d.Shadowed, i >= 2; got != want {
			t.Fatalf("request %d: shadowed %v, want %v", i, got, want)
		}
	}
	if d := mustDecide(t, m, enf); d.Count != 5 {
		t.Fatalf("enforcing window holds %d, want 5 (4 admitted + this)", d.Count)
	}
	// The full shadow window was not grown past its limit.
	if d := mustDecide(t, m, sh); d.Count != 2 {
		t.Fatalf("shadow window holds %d, want 2", d.Count)
	}
}

func TestMemoryInvalid(t *testing.T) {
	m := newTestMemory(t, newStepClock(), 0)
	for name, h := range map[string]window.Hit{
		"empty key":   {Limit: window.Limit{Requests: 1, Window: time.Second}},
		"zero limit":  {Key: "k", Limit: window.Limit{Window: time.Second}},
		"tiny window": {Key: "k", Limit: window.Limit{Requests: 1, Window: time.Microsecond}},
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := m.Decide(context.Background(), []window.Hit{h}); !errors.Is(err, window.ErrInvalidHit) {
				t.Fatalf("err = %v, want window.ErrInvalidHit", err)
			}
		})
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := m.Decide(ctx, []window.Hit{hit("k", 1, time.Second)}); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled ctx: err = %v", err)
	}
	if d := mustDecide(t, m); !d.Allowed || d.Index != -1 {
		t.Fatalf("no hits: %+v, want allowed with index -1", d)
	}
	if _, err := New(Options{MaxKeys: -1}); err == nil {
		t.Fatal("negative MaxKeys accepted")
	}
}

func TestMemoryManyHits(t *testing.T) {
	clock := newStepClock()
	m := newTestMemory(t, clock, 0)
	var hits []window.Hit
	for i := range 12 { // more than the stack fast path
		hits = append(hits, hit(fmt.Sprintf("k%d", i), 2, time.Second))
	}
	hits = append(hits, hits[3]) // the same key twice counts once
	for i := range 2 {
		if d := mustDecide(t, m, hits...); !d.Allowed {
			t.Fatalf("request %d: %+v", i, d)
		}
	}
	if d := mustDecide(t, m, hits...); d.Allowed {
		t.Fatalf("3rd: %+v, want denied", d)
	}
}

func TestMemoryBounded(t *testing.T) {
	clock := newStepClock()
	m := newTestMemory(t, clock, 64*4) // 4 keys per shard
	for i := range 10_000 {
		mustDecide(t, m, hit(fmt.Sprintf("u%d", i), 5, time.Second))
		if i%1000 == 999 {
			clock.Advance(2 * time.Second) // all keys go idle
		}
	}
	if n := m.Len(); n > 64*4 {
		t.Fatalf("%d keys held, bound is %d", n, 64*4)
	}
	if m.Evictions() == 0 {
		t.Fatal("no live key was evicted though 1000 live keys exceed the bound")
	}
	// Idle keys go first: after the clock moves on, inserting does not evict live ones.
	clock.Advance(2 * time.Second)
	before := m.Evictions()
	for i := range 64 {
		mustDecide(t, m, hit(fmt.Sprintf("fresh%d", i), 5, time.Second))
	}
	if m.Evictions() != before {
		t.Fatalf("evicted %d live keys though idle ones were available", m.Evictions()-before)
	}
}

// TestMemoryConcurrentExact: many goroutines on one key with a clock that
// moves; the admissions of every window-length span never exceed the limit.
func TestMemoryConcurrentExact(t *testing.T) {
	clock := newStepClock()
	m := newTestMemory(t, clock, 0)
	const limit, win = 7, 50 * time.Millisecond
	h := hit("hot", limit, win)
	var admitted, ticks atomic.Int64
	var wg sync.WaitGroup
	for range 32 {
		wg.Go(func() {
			for range 300 {
				if ticks.Add(1)%8 == 0 {
					clock.Advance(time.Millisecond)
				}
				d, err := m.Decide(context.Background(), []window.Hit{h})
				if err != nil {
					t.Errorf("Decide: %v", err)
					return
				}
				if d.Allowed {
					admitted.Add(1)
				}
			}
		})
	}
	wg.Wait()
	if n := admitted.Load(); n < limit {
		t.Fatalf("only %d admitted", n)
	}
	// The log itself is the ground truth: check it directly.
	sh := &m.shards[shardOf("hot")]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	windowtest.CheckSliding(t, sh.logs["hot"].ts, limit, int64(win))
}

// TestMemoryEvictionSparesRequestAndHotKeys: at the key bound, a request
// never evicts its own keys (which would lose its admission), and the least
// recently admitted key goes first, so a hot key keeps its history.
func TestMemoryEvictionSparesRequestAndHotKeys(t *testing.T) {
	clock := newStepClock()
	m := newTestMemory(t, clock, shards) // one key per shard
	var a, b string
	for i := 0; b == ""; i++ {
		k := fmt.Sprintf("k%d", i)
		switch {
		case a == "":
			a = k
		case shardOf(k) == shardOf(a):
			b = k
		}
	}
	admitted := 0
	for range 5 {
		if mustDecide(t, m, hit(a, 1, time.Minute), hit(b, 1, time.Minute)).Allowed {
			admitted++
		}
	}
	if admitted != 1 {
		t.Fatalf("two keys of one shard at the bound: %d of 5 admitted, want 1", admitted)
	}

	m = newTestMemory(t, clock, shards*4)
	hot := hit("hot", 1_000_000, time.Hour)
	for i := range 2000 {
		clock.Advance(time.Millisecond)
		mustDecide(t, m, hot)
		mustDecide(t, m, hit(fmt.Sprintf("flood%d", i), 5, time.Hour))
	}
	if m.Evictions() == 0 {
		t.Fatal("the flood evicted nothing; the test tests nothing")
	}
	if d := mustDecide(t, m, hot); d.Count != 2001 {
		t.Fatalf("hot key holds %d admissions, want 2001: it was evicted", d.Count)
	}

	// A key at its limit (no longer admitted) with a long window outlives
	// short-window keys admitted more recently.
	m = newTestMemory(t, clock, shards*4)
	daily := hit("coupon-daily", 1, 24*time.Hour)
	mustDecide(t, m, daily)
	for i := range 2000 {
		clock.Advance(time.Millisecond)
		mustDecide(t, m, hit(fmt.Sprintf("ip%d", i), 100, time.Second))
	}
	if d := mustDecide(t, m, daily); d.Allowed {
		t.Fatal("the daily coupon key was evicted by a flood of 1-second keys: admitted twice")
	}
}
