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
	// rule is the config's rate limit, nil when none applies (no match,
	// replaced, or a request override).
	rule *Rule
	// override is the request's own limit (RateLimitDescriptor.limit),
	// when it is one flashgate can enforce.
	override *Rule
	// value is the limit key's value part: the descriptor's entries, with
	// the pattern in place of the value under a share_threshold wildcard.
	value string
}

// limit returns the rule in force: the override, else the config's.
func (m *match) limit() *Rule {
	if m.override != nil {
		return m.override
	}
	return m.rule
}

// lookup finds the rate limit of one request descriptor as ratelimit's
// GetLimit does. For each entry, in order: the config entry with the same
// key and value, else the first wildcard of that key (a value with one or
// more *, each matching any run of characters) that the value matches, in
// file order, else the value-less entry of the key. The limit is the matched node's if it is the descriptor's last
// entry; a request descriptor with more entries than the config's nesting
// matches nothing, as in ratelimit. A descriptor with a limit override uses
// the override (whatever the config holds) when the domain is known. A
// descriptor without entries matches nothing.
func (d *Domain) lookup(desc *ratelimitv3.RateLimitDescriptor) match {
	entries := desc.GetEntries()
	var m match
	if len(entries) == 0 {
		// Envoy never sends one (entries has min_items 1); limiting it
		// would put every such descriptor in one bucket.
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

// keyValue joins the window and the entries unambiguously (each part
// length-prefixed), a shared pattern standing for the value where set. The
// result is window.Keys' value, which bounds and hashes it.
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

// overrideUnits maps the request override's unit (envoy.type.v3) to the
// response's unit enum.
var overrideUnits = map[typev3.RateLimitUnit]rlsv3.RateLimitResponse_RateLimit_Unit{
	typev3.RateLimitUnit_SECOND: rlsv3.RateLimitResponse_RateLimit_SECOND,
	typev3.RateLimitUnit_MINUTE: rlsv3.RateLimitResponse_RateLimit_MINUTE,
	typev3.RateLimitUnit_HOUR:   rlsv3.RateLimitResponse_RateLimit_HOUR,
	typev3.RateLimitUnit_DAY:    rlsv3.RateLimitResponse_RateLimit_DAY,
	typev3.RateLimitUnit_MONTH:  rlsv3.RateLimitResponse_RateLimit_MONTH,
	typev3.RateLimitUnit_YEAR:   rlsv3.RateLimitResponse_RateLimit_YEAR,
}

// overrideRule turns a request's limit override into a rule, or nil when
// there is none or flashgate cannot enforce it (an unknown unit, a window
// above window.MaxWindow, more than window.MaxRequests): the descriptor
// then falls back to the config's rule. Its window algorithm is
// window.Limit.Auto's choice, as for a rule that does not choose one.
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
	// Sized as a rule without algorithm: above window.AutoBucketsAbove
	// requests an exact log would not be bounded.
	r.Buckets = window.Limit{Requests: int(r.RequestsPerUnit), Window: w}.Auto().Buckets
	r.AutoBuckets = r.Buckets > 0
	return r
}

// overrideLabel is the metrics' rule label of request overrides: their
// entries are request values, never put in a label.
const overrideLabel = "override"
