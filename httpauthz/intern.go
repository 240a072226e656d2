package httpauthz

import (
	"maps"
	"sync"
	"sync/atomic"
)

// An intern table holds at most maxInterned entries of keys up to
// maxInternedLen bytes: other names and header values are built per
// request, so that headers an attacker invents cannot grow it (they can
// fill it: then the names that come later are built per request too).
const (
	maxInterned    = 1024
	maxInternedLen = 128
)

// intern is a bounded table of values derived from keys (a header name in
// canonical form, a response header in the HTTP server's form), so that a
// check builds each once rather than per request. Reads take no lock: the
// table is copied on each insert, which stops at maxInterned entries. It is
// safe for concurrent use.
type intern[K comparable, V any] struct {
	m atomic.Pointer[map[K]V]
	// mu orders inserts.
	mu sync.Mutex
}

// get returns the value of k, from the table or made by build; it is kept
// when size (k's length) is at most maxInternedLen and the table has room.
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
