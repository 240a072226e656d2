package main

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

func TestHistogramBuckets(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for range 100_000 {
		v := r.Int64N(1 << uint(r.IntN(41)))
		i := bucketOf(v)
		hi := bucketHigh(i)
		if hi < v {
			t.Fatalf("bucket %d of %d: high %d below the value", i, v, hi)
		}
		if v >= subCount && float64(hi-v) > float64(v)/subCount {
			t.Fatalf("bucket %d of %d: high %d more than 1/%d above", i, v, hi, subCount)
		}
		if i > 0 && bucketHigh(i-1) >= v {
			t.Fatalf("value %d also fits bucket %d (high %d)", v, i-1, bucketHigh(i-1))
		}
	}
	if got := bucketOf(1 << 50); got != histBuckets-1 {
		t.Errorf("huge value in bucket %d, want the last (%d)", got, histBuckets-1)
	}
}

func TestHistogramQuantiles(t *testing.T) {
	var h histogram
	if h.quantile(0.5) != 0 {
		t.Error("empty histogram: want 0")
	}
	r := rand.New(rand.NewPCG(3, 4))
	vals := make([]time.Duration, 50_000)
	for i := range vals {
		vals[i] = time.Duration(r.ExpFloat64() * float64(time.Millisecond))
		h.record(vals[i])
	}
	slices.Sort(vals)
	for _, q := range []float64{0.5, 0.9, 0.99, 0.999, 1} {
		exact := vals[int(q*float64(len(vals)))-1]
		got := h.quantile(q)
		if got < exact || float64(got-exact) > float64(exact)/subCount+1 {
			t.Errorf("q%g = %s, exact %s", q, got, exact)
		}
	}
	if h.quantile(1) != vals[len(vals)-1] || h.max != vals[len(vals)-1] {
		t.Errorf("max = %s, want %s", h.max, vals[len(vals)-1])
	}
	var m histogram
	m.merge(&h)
	m.merge(&h)
	if m.total != 2*h.total || m.quantile(0.5) != h.quantile(0.5) {
		t.Errorf("merge: total %d, p50 %s", m.total, m.quantile(0.5))
	}
}
