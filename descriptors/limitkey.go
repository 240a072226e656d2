package descriptors

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"unicode/utf8"

	"github.com/flashgate/flashgate/enforce"
	"github.com/flashgate/flashgate/internal/reqpath"
	"github.com/flashgate/flashgate/window"
)

// This file derives a rule's limit key from values for operators (flashgate
// inspect, bans), or says why the rule never sees them.

// Errors of [Config.LimitKey], wrapped with the reason.
var (
	// ErrUnknownRule: the descriptors file has no rule of that name.
	ErrUnknownRule = errors.New("unknown rule")
	// ErrNeverSeen: no request the rule applies to carries those values.
	ErrNeverSeen = errors.New("the rule never sees that value")
)

// maxRequestBytes bounds a request value: the gRPC message limit.
const maxRequestBytes = 4 << 20

// Rule returns the rule named name, nil if there is none.
func (c *Config) Rule(name string) *Rule {
	for _, r := range c.Rules {
		if r.Name == name {
			return r
		}
	}
	return nil
}

// Keyed returns r's descriptors without a value, whose request values the
// key holds.
func (r *Rule) Keyed() []Match {
	var out []Match
	for _, m := range r.Match {
		if !m.HasValue {
			out = append(out, m)
		}
	}
	return out
}

// LimitKey returns the rule named rule and the key a [Mapper] with keys
// builds for a request carrying values for the rule's [Rule.Keyed]
// descriptors, a client IP in any form netip parses. The error wraps
// [ErrUnknownRule], or [ErrNeverSeen] with the reason (the wrong number of
// values, or one its source never yields or the rule's patterns exclude).
// Safe for concurrent use.
func (c *Config) LimitKey(keys window.Keys, rule string, values ...string) (string, *Rule, error) {
	r := c.Rule(rule)
	if r == nil {
		return "", nil, fmt.Errorf("%w %q: %s has no rule of that name", ErrUnknownRule, rule, c.Name)
	}
	if r.nvar == 0 {
		if len(values) > 0 {
			return "", r, fmt.Errorf("%w: rule %s keys no request value (every descriptor of it sets one): all the requests it applies to share one window, so it takes no value", ErrNeverSeen, r.Name)
		}
		return keys.Key(r.Name, r.constKey), r, nil
	}
	if len(values) != r.nvar {
		return "", r, fmt.Errorf("%w: rule %s keys %d request value(s), one for each of %s in order; %d given", ErrNeverSeen, r.Name, r.nvar, describeKeyed(r), len(values))
	}
	parts := make([]string, 0, len(r.Match))
	vi := 0
	for _, m := range r.Match {
		if m.HasValue {
			parts = append(parts, m.Pattern())
			continue
		}
		v, err := c.seen(r, m, values[vi])
		if err != nil {
			return "", r, fmt.Errorf("%w: rule %s, %s (%s): %w", ErrNeverSeen, r.Name, m.Key, m.Source, err)
		}
		parts = append(parts, v)
		vi++
	}
	return keys.Key(r.Name, joinParts(parts)), r, nil
}

// describeKeyed lists r's keyed descriptors and their sources.
func describeKeyed(r *Rule) string {
	var b strings.Builder
	for i, m := range r.Keyed() {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s (%s)", m.Key, m.Source)
	}
	return b.String()
}

// seen returns v as the server reads it for m, or why no request carries it.
func (c *Config) seen(r *Rule, m Match, v string) (string, error) {
	switch {
	case v == "":
		return "", errors.New("the value is empty: a request without it is never keyed by the rule")
	case len(v) > maxRequestBytes:
		return "", fmt.Errorf("the value is %d bytes, more than a CheckRequest holds (%d)", len(v), maxRequestBytes)
	case !utf8.ValidString(v):
		return "", errors.New("the value is not valid UTF-8: the server reads each invalid byte sequence as U+FFFD")
	}
	switch m.Source.Kind {
	case SourceHeader:
		if strings.IndexByte(v, ',') >= 0 {
			return "", errors.New("the value holds a comma: the rule keys a header's first comma-separated element (Envoy joins a repeated header's values with commas)")
		}
		if strings.Trim(v, " \t") != v {
			return "", errors.New("the value begins or ends with blanks, which HTTP strips from a header value")
		}
		if hasControl(v) {
			return "", errors.New("the value holds control characters, which a header value cannot")
		}
	case SourceRemoteAddress:
		a, err := netip.ParseAddr(v)
		if err != nil {
			return "", fmt.Errorf("%q is not an IP address", v)
		}
		v = a.Unmap().WithZone("").String()
	case SourcePath:
		if strings.ContainsAny(v, "?#") {
			return "", errors.New("the value holds ? or #: the rule keys the path without its query")
		}
		if hasControl(v) || strings.ContainsAny(v, " \t") {
			return "", errors.New("the value holds blanks or control characters, which a request path cannot")
		}
		// Every spelling of a path is keyed by its canonical form.
		v = reqpath.Canonical(v, c.pathForm(false))
	case SourceMethod:
		if strings.HasPrefix(v, ":") || !enforce.ValidHeaderName(v) {
			return "", fmt.Errorf("%q is not an HTTP method (a token)", v)
		}
	case SourceAuthority:
		if hasControl(v) || strings.ContainsAny(v, " \t") {
			return "", errors.New("the value holds blanks or control characters, which a host cannot")
		}
	}
	// A pattern on the same source lets only its matches through.
	for _, o := range r.Match {
		if o.HasValue && o.Source == m.Source && !o.holds(v) {
			return "", fmt.Errorf("the rule applies only where %s is %q, which the value does not match", o.Key, o.Pattern())
		}
	}
	return v, nil
}

// hasControl reports whether s holds an ASCII control character other than
// a tab, or DEL.
func hasControl(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 && c != '\t' || c == 0x7f {
			return true
		}
	}
	return false
}
