package memory

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/flashgate/flashgate/window"
)

// BenchmarkMemoryDecide: one request with one hit on one hot key (mostly
// denials once the window is full, the sliding trim included).
func BenchmarkMemoryDecide(b *testing.B) {
	m, err := New(Options{})
	if err != nil {
		b.Fatal(err)
	}
	hits := []window.Hit{hit("fg:{abcdef}:coupon_per_uid:user-1", 1000, 10*time.Millisecond)}
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
	m, err := New(Options{})
	if err != nil {
		b.Fatal(err)
	}
	keys := window.Keys{}
	hits := []window.Hit{
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
	m, err := New(Options{})
	if err != nil {
		b.Fatal(err)
	}
	keys := window.Keys{}
	hits := make([]window.Hit, n)
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
