// Package windowtest holds what the tests of every window.Limiter share: the
// conformance table ([Run]) that Memory, the Fallback and Redis pass alike,
// and small helpers to build hits and keys.
package windowtest

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/flashgate/flashgate/window"
)

// prefixSeq numbers the key prefixes [Keys] returns.
var prefixSeq atomic.Uint64

// Keys returns a key builder with a prefix no other test of the process
// uses, so that tests sharing a Redis never share a key.
func Keys(t testing.TB) window.Keys {
	t.Helper()
	k, err := window.NewKeys(fmt.Sprintf("t%d", prefixSeq.Add(1)))
	if err != nil {
		t.Fatalf("NewKeys: %v", err)
	}
	return k
}

// Hit returns a hit of n requests per w on key, of rule "r".
func Hit(key string, n int, w time.Duration) window.Hit {
	return window.Hit{Key: key, Rule: "r", Limit: window.Limit{Requests: n, Window: w}}
}

// Bucketed returns a hit of a bucketed limit.
func Bucketed(key string, n int, w time.Duration, buckets int) window.Hit {
	h := Hit(key, n, w)
	h.Limit.Buckets = buckets
	return h
}

// MustDecide decides hits, failing the test on an error.
func MustDecide(t testing.TB, l window.Limiter, hits ...window.Hit) window.Decision {
	t.Helper()
	d, err := l.Decide(context.Background(), hits)
	if err != nil {
		t.Fatalf("Decide: %v", err)
	}
	return d
}

// CheckSliding fails if some span (t-window, t] of the sorted timestamps ts
// holds more than limit of them, and reports whether some span holds
// exactly limit.
func CheckSliding(t testing.TB, ts []int64, limit int, window int64) (reached bool) {
	t.Helper()
	for i := range ts {
		if j := i + limit; j < len(ts) && ts[j]-ts[i] < window {
			t.Fatalf("admissions %d..%d are %d apart: %d inside one window of %d", i, j, ts[j]-ts[i], limit+1, window)
		}
	}
	return Fills(ts, limit, window)
}

// Fills reports whether some span (t-window, t] of the sorted timestamps ts
// holds limit of them.
func Fills(ts []int64, limit int, window int64) bool {
	for i := range ts {
		if j := i + limit - 1; j < len(ts) && ts[j]-ts[i] < window {
			return true
		}
	}
	return false
}
