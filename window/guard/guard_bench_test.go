package guard

import (
	"context"
	"testing"
	"time"

	"github.com/flashgate/flashgate/window"
	"github.com/flashgate/flashgate/window/memory"
)

// BenchmarkGuardDeny: the local over-limit cache refusing a known-full key.
func BenchmarkGuardDeny(b *testing.B) {
	m, err := memory.New(memory.Options{})
	if err != nil {
		b.Fatal(err)
	}
	g, err := NewGuard(m, GuardOptions{Ban: window.DefaultBan})
	if err != nil {
		b.Fatal(err)
	}
	defer g.Close()
	hits := []window.Hit{hit(window.Keys{}.Key("coupon_per_uid", "abuser"), 1, time.Hour)}
	ctx := context.Background()
	g.Decide(ctx, hits)
	g.Decide(ctx, hits)
	g.Wait()
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
