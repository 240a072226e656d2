package rls

import (
	"strconv"
	"strings"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"

	"github.com/flashgate/flashgate/window"
)

// match is what one request descriptor resolves to.
type match struct {
	// rule is the config's rate limit, nil when none applies.
	rule *Rule
	// override is the request's own limit, when flashgate can enforce it.
	override *Rule
	// value is the key's value part, a share_threshold pattern in place
	// of the value.
	value string
}

// limit returns the rule in force: the override, else the config's.
func (m *match) limit() *Rule {
	if m.override != nil {
		return m.override
	}
	return m.rule
}

// lookup finds the rate limit of a request descriptor as ratelimit's
// GetLimit does: per entry, the exact key and value, else the key's first
// matching wildcard, else the key's value-less entry; the last entry's
// node holds the limit. A limit override replaces it in a known domain.
func (d *Domain) lookup(desc *ratelimitv3.RateLimitDescriptor) match {
	entries := desc.GetEntries()
	var m match
	if len(entries) == 0 {
		// Envoy never sends one; limiting it would share one bucket.
		return m
	}
	if o := overrideRule(desc.GetLimit()); o != nil {
		m.override = o
		m.value = keyValue(entries, nil, o.Window)
		return m
	}
	level := &d.root
	var shared []string // the pattern standing for each entry's value, if any
	for i, e := range entries {
		next := level.exact[e.GetKey()+"\x00"+e.GetValue()]
		if next == nil {
			for _, w := range level.wild {
				if w.key == e.GetKey() && w.matches(e.GetValue()) {
					next = w.n
					break
				}
			}
		}
		if next == nil {
			next = level.keyOnly[e.GetKey()]
		}
		if next == nil {
			break
		}
		if next.share {
			if shared == nil {
				shared = make([]string, len(entries))
			}
			shared[i] = next.pattern
		}
		if next.rule != nil && i == len(entries)-1 {
			m.rule = next.rule
		}
		if next.empty() {
			break
		}
		level = next
	}
	if m.rule != nil && !m.rule.Unlimited {
		m.value = keyValue(entries, shared, m.rule.Window)
	}
	return m
}

// keyValue joins the window and the entries length-prefixed; window.Keys
// bounds and hashes the result.
func keyValue(entries []*ratelimitv3.RateLimitDescriptor_Entry, shared []string, w time.Duration) string {
	var b strings.Builder
	b.WriteString(strconv.FormatInt(w.Milliseconds(), 10))
	b.WriteString("ms")
	for i, e := range entries {
		v := e.GetValue()
		if shared != nil && shared[i] != "" {
			v = shared[i]
		}
		for _, s := range [2]string{e.GetKey(), v} {
			b.WriteByte('|')
			b.WriteString(strconv.Itoa(len(s)))
			b.WriteByte(':')
			b.WriteString(s)
		}
	}
	return b.String()
}

var overrideUnits = map[typev3.RateLimitUnit]rlsv3.RateLimitResponse_RateLimit_Unit{
	typev3.RateLimitUnit_SECOND: rlsv3.RateLimitResponse_RateLimit_SECOND,
	typev3.RateLimitUnit_MINUTE: rlsv3.RateLimitResponse_RateLimit_MINUTE,
	typev3.RateLimitUnit_HOUR:   rlsv3.RateLimitResponse_RateLimit_HOUR,
	typev3.RateLimitUnit_DAY:    rlsv3.RateLimitResponse_RateLimit_DAY,
	typev3.RateLimitUnit_MONTH:  rlsv3.RateLimitResponse_RateLimit_MONTH,
	typev3.RateLimitUnit_YEAR:   rlsv3.RateLimitResponse_RateLimit_YEAR,
}

// overrideRule turns a request's limit override into a rule, or nil when
// flashgate cannot enforce it (the config's rule then applies).
func overrideRule(o *ratelimitv3.RateLimitDescriptor_RateLimitOverride) *Rule {
	if o == nil {
		return nil
	}
	unit, ok := overrideUnits[o.GetUnit()]
	if !ok || o.GetRequestsPerUnit() > window.MaxRequests {
		return nil
	}
	mult := uint32(1)
	if m := o.GetUnitMultiplier(); m != nil && m.GetValue() > 0 {
		mult = m.GetValue()
	}
	w, err := limitWindow(unit, mult)
	if err != nil {
		return nil
	}
	r := &Rule{Path: overrideLabel, RequestsPerUnit: o.GetRequestsPerUnit(), Unit: unit, UnitMultiplier: mult, Window: w}
	// Sized as a rule without algorithm, so the window stays bounded.
	r.Buckets = window.Limit{Requests: int(r.RequestsPerUnit), Window: w}.Auto().Buckets
	r.AutoBuckets = r.Buckets > 0
	return r
}

// overrideLabel is the rule label of request overrides, whose entries are
// request values.
const overrideLabel = "override"
