package rls

import (
	"errors"
	"fmt"
	"strings"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"

	"github.com/flashgate/flashgate/window"
)

// Errors of [Config.LimitKey], wrapped with the reason.
var (
	// ErrUnknownDomain: the config has no domain of that name.
	ErrUnknownDomain = errors.New("unknown domain")
	// ErrNotCounted: no window counts the descriptor.
	ErrNotCounted = errors.New("the descriptor is never counted")
)

// Domain returns the domain named name, nil if there is none.
func (c *Config) Domain(name string) *Domain { return c.domains[name] }

// WindowLimit returns the window r enforces on each of its keys.
func (r *Rule) WindowLimit() window.Limit {
	return window.Limit{Requests: int(r.RequestsPerUnit), Window: r.Window, Buckets: r.Buckets}
}

// LimitKey returns the rule that limits descriptor desc of a request to
// domain and the limit key ShouldRateLimit counts it under with keys. The
// error wraps [ErrUnknownDomain], or [ErrNotCounted] with the reason. Safe
// for concurrent use.
func (c *Config) LimitKey(keys window.Keys, domain string, desc *ratelimitv3.RateLimitDescriptor) (string, *Rule, error) {
	d := c.domains[domain]
	if d == nil {
		return "", nil, fmt.Errorf("%w %q: the ratelimit config has no such domain", ErrUnknownDomain, domain)
	}
	switch n := len(desc.GetEntries()); {
	case n == 0:
		return "", nil, fmt.Errorf("%w: a descriptor needs at least one entry", ErrNotCounted)
	case n > MaxEntries:
		return "", nil, fmt.Errorf("%w: %d entries, more than a request's descriptor may carry (%d)", ErrNotCounted, n, MaxEntries)
	}
	m := d.lookup(desc)
	r := m.limit()
	switch {
	case r == nil:
		return "", nil, fmt.Errorf("%w: no rule of domain %s limits the descriptor %s", ErrNotCounted, domain, describeEntries(desc))
	case r.Unlimited:
		return "", r, fmt.Errorf("%w: rule %s of domain %s, which matches the descriptor, is unlimited", ErrNotCounted, r.Label(), domain)
	case r.RequestsPerUnit == 0:
		return "", r, fmt.Errorf("%w: rule %s of domain %s, which matches the descriptor, refuses every request without counting (requests_per_unit: 0)", ErrNotCounted, r.Label(), domain)
	}
	return keys.Key(d.keyRule, m.value), r, nil
}

// describeEntries writes desc's entries for errors; they are the
// operator's values, never a request's.
func describeEntries(desc *ratelimitv3.RateLimitDescriptor) string {
	var b strings.Builder
	b.WriteByte('(')
	for i, e := range desc.GetEntries() {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s=%q", e.GetKey(), e.GetValue())
	}
	b.WriteByte(')')
	return b.String()
}
