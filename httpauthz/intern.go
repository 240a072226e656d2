package httpauthz

import (
	"maps"
	"sync"
	"sync/atomic"
)

// An intern table holds at most maxInterned keys of up to maxInternedLen
// bytes, so headers an attacker invents cannot grow it.
const (
	maxInterned    = 1024
	maxInternedLen = 128
)

// intern is a bounded table of values built from keys, once rather than
// per request. Reads take no lock: an insert copies the table. Safe for
// concurrent use.
type intern[K comparable, V any] struct {
	m  atomic.Pointer[map[K]V]
	mu sync.Mutex
}

// get returns k's value, kept when size ≤ maxInternedLen and there is room.
func (t *intern[K, V]) get(k K, size int, build func(K) V) V {
	m := t.m.Load()
	if m != nil {
		if v, ok := (*m)[k]; ok {
			return v
		}
	}
	v := build(k)
	if size > maxInternedLen || m != nil && len(*m) >= maxInterned {
		return v
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	old := t.m.Load()
	if old != nil && len(*old) >= maxInterned {
		return v
	}
	grown := map[K]V{}
	if old != nil {
		grown = maps.Clone(*old)
	}
	grown[k] = v
	t.m.Store(&grown)
	return v
}
