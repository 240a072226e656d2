package window

import (
	"context"
	"strconv"
	"testing"
	"time"
)

// BenchmarkMemoryDecide: one request with one hit on one hot key (mostly
// denials once the window is full, the sliding trim included).
func BenchmarkMemoryDecide(b *testing.B) {
	m, err := NewMemory(MemoryOptions{})
	if err != nil {
		b.Fatal(err)
	}
	hits := []Hit{hit("fg:{abcdef}:coupon_per_uid:user-1", 1000, 10*time.Millisecond)}
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := m.Decide(ctx, hits); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkMemoryDecideExample: the example's three hits (uid, device, ip).
func BenchmarkMemoryDecideExample(b *testing.B) {
	m, err := NewMemory(MemoryOptions{})
	if err != nil {
		b.Fatal(err)
	}
	keys := Keys{}
	hits := []Hit{
		hit(keys.Key("coupon_per_uid", "u1"), 5, time.Second),
		hit(keys.Key("coupon_per_device", "d1"), 10, time.Second),
		hit(keys.Key("per_ip", "10.0.0.1"), 100, time.Second),
	}
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := m.Decide(ctx, hits); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkMemoryDecide1MKeys: uniform traffic over 1,000,000 keys.
func BenchmarkMemoryDecide1MKeys(b *testing.B) {
	const n = 1_000_000
	m, err := NewMemory(MemoryOptions{})
	if err != nil {
		b.Fatal(err)
	}
	keys := Keys{}
	hits := make([]Hit, n)
	for i := range hits {
		hits[i] = hit(keys.Key("coupon_per_uid", "user-"+strconv.Itoa(i)), 5, time.Second)
	}
	ctx := context.Background()
	for i := range hits { // warm: every key tracked
		if _, err := m.Decide(ctx, hits[i:i+1]); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportAllocs()
	b.ResetTimer()
	i := 0
	for b.Loop() {
		i = (i + 7919) % n
		if _, err := m.Decide(ctx, hits[i:i+1]); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkGuardDeny: the local over-limit cache refusing a known-full key.
func BenchmarkGuardDeny(b *testing.B) {
	m, err := NewMemory(MemoryOptions{})
	if err != nil {
		b.Fatal(err)
	}
	g, err := NewGuard(m, GuardOptions{Ban: DefaultBan})
	if err != nil {
		b.Fatal(err)
	}
	defer g.Close()
	hits := []Hit{hit(Keys{}.Key("coupon_per_uid", "abuser"), 1, time.Hour)}
	ctx := context.Background()
	g.Decide(ctx, hits)
	g.Decide(ctx, hits)
	g.Wait()
	if d, _ := g.Decide(ctx, hits); d.Source == SourceBackend {
		b.Fatal("the key is not cached as full")
	}
	b.ReportAllocs()
	for b.Loop() {
		if d, _ := g.Decide(ctx, hits); d.Allowed {
			b.Fatal("allowed")
		}
	}
}

// BenchmarkKeysKey: building one limit key.
func BenchmarkKeysKey(b *testing.B) {
	k := Keys{}
	b.ReportAllocs()
	for b.Loop() {
		_ = k.Key("coupon_per_uid", "user-12345678")
	}
}
