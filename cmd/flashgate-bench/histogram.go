package main

import (
	"math/bits"
	"time"
)

// histogram records durations in log-linear buckets, like HdrHistogram: each
// power of two is split in 2^subBits buckets, so a recorded value is known to
// within 1/2^subBits (1.6%) whatever its size, in a fixed 18 KiB. The zero
// histogram is empty and ready. It is not safe for concurrent use: each
// bench worker owns one and they are merged at the end.
type histogram struct {
	counts [histBuckets]uint64
	total  uint64
	max    time.Duration
}

const (
	subBits     = 6
	subCount    = 1 << subBits
	maxShift    = 40 - subBits // values up to 2^40ns (18 minutes); larger ones are clamped
	histBuckets = (maxShift + 2) * subCount
)

// bucketOf returns the bucket of v nanoseconds.
func bucketOf(v int64) int {
	if v < subCount {
		if v < 0 {
			return 0
		}
		return int(v)
	}
	shift := bits.Len64(uint64(v)) - subBits - 1
	if shift > maxShift {
		return histBuckets - 1
	}
	return shift*subCount + int(v>>shift)
}

// bucketHigh returns the largest value of bucket i.
func bucketHigh(i int) int64 {
	if i < 2*subCount {
		return int64(i)
	}
	shift := i/subCount - 1
	top := int64(i - shift*subCount)
	return (top+1)<<shift - 1
}

func (h *histogram) record(d time.Duration) {
	h.counts[bucketOf(int64(d))]++
	h.total++
	if d > h.max {
		h.max = d
	}
}

func (h *histogram) merge(o *histogram) {
	for i, c := range o.counts {
		h.counts[i] += c
	}
	h.total += o.total
	h.max = max(h.max, o.max)
}

// quantile returns the value at quantile q (0 < q ≤ 1): the upper end of the
// bucket holding the ceil(q·total)-th smallest value, never above the
// maximum. It returns 0 for an empty histogram.
func (h *histogram) quantile(q float64) time.Duration {
	if h.total == 0 {
		return 0
	}
	rank := uint64(q * float64(h.total))
	if float64(rank) < q*float64(h.total) {
		rank++
	}
	rank = max(rank, 1)
	var seen uint64
	for i, c := range h.counts {
		seen += c
		if seen >= rank {
			return min(time.Duration(bucketHigh(i)), h.max)
		}
	}
	return h.max
}
