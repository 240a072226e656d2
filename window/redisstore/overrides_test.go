package redisstore

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/flashgate/flashgate/window/overrides"
	"github.com/flashgate/flashgate/window/redistest"
)

// overrideEvents records a follower's events.
type overrideEvents struct {
	mu         sync.Mutex
	set, clear []overrides.Target
}

func (e *overrideEvents) Set(o *overrides.Override) {
	e.mu.Lock()
	e.set = append(e.set, o.Target)
	e.mu.Unlock()
}

func (e *overrideEvents) Cleared(o *overrides.Override) {
	e.mu.Lock()
	e.clear = append(e.clear, o.Target)
	e.mu.Unlock()
}

func (e *overrideEvents) counts() (set, clear int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.set), len(e.clear)
}

// until polls cond every 10 ms for up to 10 s.
func until(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 10 s", what)
		}
	}
}

// TestOverridesFollowed: on standalone, Sentinel and Cluster, an override
// set reaches two followers' books, a clear ends it, the history keeps
// both; a follower that starts later learns the one in force before
// Synced; a restart of Redis (standalone: it comes back empty) is met by a
// write-back of the overrides held.
func TestOverridesFollowed(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		cfg  func(t *testing.T) (ClientConfig, *redistest.Server)
	}{
		{"standalone", func(t *testing.T) (ClientConfig, *redistest.Server) {
			s := redistest.Start(t)
			return ClientConfig{Addrs: []string{s.Addr()}}, s
		}},
		{"sentinel", func(t *testing.T) (ClientConfig, *redistest.Server) {
			return ClientConfig{Addrs: []string{redistest.StartSentinel(t, redistest.Start(t), "fgmaster").Addr()}, MasterName: "fgmaster"}, nil
		}},
		{"cluster", func(t *testing.T) (ClientConfig, *redistest.Server) {
			return ClientConfig{Addrs: redistest.StartCluster(t, 3).Addrs(), Mode: ModeCluster}, nil
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cfg, restartable := tc.cfg(t)
			c := newTestClient(t, cfg)
			keys := testKeys(t)
			store, err := NewOverrides(c, keys)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			var wg sync.WaitGroup
			t.Cleanup(func() { cancel(); wg.Wait() })
			follow := func() (*overrides.Book, *overrideEvents, *Follower) {
				book, ev := overrides.NewBook(nil), &overrideEvents{}
				f, err := store.NewFollower(book, FollowerOptions{Events: ev, Resync: time.Second})
				if err != nil {
					t.Fatal(err)
				}
				wg.Go(func() { f.Run(ctx) })
				return book, ev, f
			}
			waitSynced := func(f *Follower) {
				t.Helper()
				select {
				case <-f.Synced():
				case <-time.After(10 * time.Second):
					t.Fatal("not synced within 10 s")
				}
			}
			b1, ev1, f1 := follow()
			b2, _, f2 := follow()
			waitSynced(f1)
			waitSynced(f2)

			now := time.Now().Truncate(time.Millisecond)
			o := &overrides.Override{Target: overrides.Target{Domain: "shop", Rule: "coupon"}, Mode: overrides.ModeLimit, Requests: 2,
				Set: now, Until: now.Add(10 * time.Minute), By: "test", Reason: "orders failing"}
			if err := store.Set(ctx, o); err != nil {
				t.Fatal(err)
			}
			for _, b := range []*overrides.Book{b1, b2} {
				until(t, "the override learnt", func() bool { return b.Lookup("shop", "coupon") != nil })
			}
			if got := b1.Lookup("shop", "coupon"); got.Requests != 2 || got.Reason != "orders failing" || !got.Until.Equal(o.Until) {
				t.Fatalf("learnt %+v, want %+v", got, o)
			}
			if list, err := store.List(ctx); err != nil || len(list) != 1 {
				t.Fatalf("List = %v, %v", list, err)
			}

			// A follower that starts now knows it once synced.
			b3, _, f3 := follow()
			waitSynced(f3)
			if b3.Lookup("shop", "coupon") == nil {
				t.Fatal("a follower started during the override: synced without it")
			}

			if restartable != nil {
				restartable.Restart()
				until(t, "the override written back", func() bool {
					got, err := store.Get(ctx, o.Target)
					return err == nil && got != nil && got.Until.Equal(o.Until)
				})
				for _, b := range []*overrides.Book{b1, b2, b3} {
					if b.Lookup("shop", "coupon") == nil {
						t.Fatal("an override lost from a book at a Redis restart")
					}
				}
			}

			was, err := store.Clear(ctx, o.Target, "test", "orders back")
			if err != nil || was == nil || was.Requests != 2 {
				t.Fatalf("Clear = %v, %v", was, err)
			}
			for _, b := range []*overrides.Book{b1, b2, b3} {
				until(t, "the override cleared", func() bool { return b.Lookup("shop", "coupon") == nil })
			}
			if set, clear := ev1.counts(); set != 1 || clear != 1 {
				t.Fatalf("events: %d set, %d cleared; want 1 and 1", set, clear)
			}
			// The history is Redis's: a restart without persistence
			// loses the set.
			want := 2
			if restartable != nil {
				want = 1
			}
			hist, err := store.History(ctx, 0)
			if err != nil || len(hist) != want || hist[0].Op != "clear" || hist[0].Reason != "orders back" || want == 2 && (hist[1].Op != "set" || hist[1].By != "test") {
				t.Fatalf("History = %+v, %v; want %d events", hist, err, want)
			}
		})
	}
}

// TestOverridesHistoryBounded: the history keeps the newest
// overrides.MaxHistory events.
func TestOverridesHistoryBounded(t *testing.T) {
	t.Parallel()
	_, _, store := startOverrides(t)
	ctx := context.Background()
	target := overrides.Target{Domain: "shop", Rule: "coupon"}
	for i := range overrides.MaxHistory + 3 {
		if _, err := store.Clear(ctx, target, "test", "r"+itoa(int64(i))); err != nil {
			t.Fatal(err)
		}
	}
	hist, err := store.History(ctx, 0)
	if err != nil || len(hist) != overrides.MaxHistory || hist[0].Reason != "r"+itoa(overrides.MaxHistory+2) {
		t.Fatalf("History: %d events (%v), want the newest %d", len(hist), err, overrides.MaxHistory)
	}
}
