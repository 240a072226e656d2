package guard

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/flashgate/flashgate/window"
	"github.com/flashgate/flashgate/window/memory"
)

// newBenchGuard returns a Guard with the default penalty box in front of a
// memory store.
func newBenchGuard(b *testing.B) *Guard {
	b.Helper()
	m, err := memory.New(memory.Options{})
	if err != nil {
		b.Fatal(err)
	}
	g, err := NewGuard(m, GuardOptions{Ban: window.DefaultBan})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(g.Close)
	return g
}

// BenchmarkGuardDeny: the local over-limit cache refusing a known-full key.
func BenchmarkGuardDeny(b *testing.B) {
	g := newBenchGuard(b)
	hits := []window.Hit{hit(window.Keys{}.Key("coupon_per_uid", "abuser"), 1, time.Hour)}
	ctx := context.Background()
	g.Decide(ctx, hits)
	g.Decide(ctx, hits)
	if d, _ := g.Decide(ctx, hits); d.Source == window.SourceBackend {
		b.Fatal("the key is not cached as full")
	}
	b.ReportAllocs()
	for b.Loop() {
		if d, _ := g.Decide(ctx, hits); d.Allowed {
			b.Fatal("allowed")
		}
	}
}

// BenchmarkGuardFirstDenial: the backend denies a key the Guard has no
// entry for, so the Guard makes and stores one (a flood of fresh keys).
func BenchmarkGuardFirstDenial(b *testing.B) {
	g := newBenchGuard(b)
	ctx := context.Background()
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		i++
		// A cost of 2 on a limit of 1: the backend denies the fresh key.
		h := hit(window.Keys{}.Key("coupon_per_uid", strconv.Itoa(i)), 1, time.Hour)
		h.Cost = 2
		if d, _ := g.Decide(ctx, []window.Hit{h}); d.Allowed {
			b.Fatal("allowed")
		}
	}
}
