package rls

import (
	"fmt"
	"sort"
	"strings"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/flashgate/flashgate/enforce"
	"github.com/flashgate/flashgate/window"
)

// Limits of a config directory.
const (
	// MaxFileSize is the largest config file accepted.
	MaxFileSize = 1 << 20
	// MaxFiles is the most config files a directory may hold.
	MaxFiles = 1024
	// MaxDepth is the deepest nesting of descriptors.
	MaxDepth = 16
)

// Config is a loaded ratelimit config directory, every domain; immutable
// and safe for concurrent use.
type Config struct {
	// Dir is the directory the files came from ("" when parsed from memory).
	Dir     string
	domains map[string]*Domain
	sum     [32]byte // hash of the files' names and contents
}

// quotaRules returns "domain:label" of the rules with quota_mode, sorted.
func (c *Config) quotaRules() []string {
	var out []string
	for _, d := range c.Domains() {
		for _, r := range d.rules {
			if r.QuotaMode {
				out = append(out, d.Name+":"+r.Label())
			}
		}
	}
	return out
}

// KeyNamespace begins the rule part of every limit key the RLS makes; the
// descriptors file refuses rule names that begin with it, so no ext_authz
// rule shares a domain's windows.
const KeyNamespace = "rls."

// Domain is one domain: the descriptors of one file.
type Domain struct {
	Name string
	File string
	// keyRule is the rule part of the domain's limit keys.
	keyRule string
	root    node
	rules   []*Rule
}

// Domains returns the loaded domains sorted by name.
func (c *Config) Domains() []*Domain {
	out := make([]*Domain, 0, len(c.domains))
	for _, d := range c.domains {
		out = append(out, d)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Rules returns the domain's rate limits in file order.
func (d *Domain) Rules() []*Rule { return d.rules }

// Rule is one rate_limit block of the config.
type Rule struct {
	// Path is the rule's place in its domain as ratelimit's stats name it,
	// "key_value.subkey"; it labels metrics when Name is empty.
	Path string
	// Name is rate_limit.name, which replaces refers to.
	Name     string
	Replaces []string
	// Unlimited: the descriptor matches but is never limited or counted.
	Unlimited bool
	// RequestsPerUnit as written; 0 refuses every request.
	RequestsPerUnit uint32
	// Unit and UnitMultiplier as written (multiplier 1 when unset).
	Unit           rlsv3.RateLimitResponse_RateLimit_Unit
	UnitMultiplier uint32
	// Window is Unit × UnitMultiplier.
	Window time.Duration
	// Buckets is the window's window.Limit.Buckets, written or chosen by
	// size (AutoBuckets); 0 is an exact log.
	Buckets     int
	AutoBuckets bool
	// Shadow is shadow_mode: counted and reported, never denies.
	Shadow bool
	// QuotaMode is ratelimit's quota_mode; flashgate enforces such a rule
	// as an ordinary limit, which is stricter, and logs it when installed.
	QuotaMode bool
	// FailureMode, LocalShare and Ban are flashgate's additions, inherited
	// by nested descriptors: zero values take the server's (a nil Ban is
	// no penalty box).
	FailureMode enforce.FailureMode
	LocalShare  int
	Ban         *window.Ban
	// Lease is how long a sidecar may admit from a reserved batch; 0: none.
	Lease time.Duration
	// DetailedMetric and ValueToMetric are accepted and change nothing:
	// metric labels never carry request values.
	DetailedMetric, ValueToMetric bool

	// policy is the rule's rate-limit header policy; nil when unlimited.
	policy *enforce.Policy
}

// policyOf returns the rule's rate-limit header policy.
func (r *Rule) policyOf() *enforce.Policy {
	if r.policy != nil {
		return r.policy
	}
	return enforce.NewPolicy(r.Label(), window.Limit{Requests: int(r.RequestsPerUnit), Window: r.Window})
}

// PenaltyBox returns the penalty box the rule asks for, nil for none.
func (r *Rule) PenaltyBox() *window.Ban { return r.Ban }

// FallbackShare returns the rule's local_share, 0 for the fleet's share.
func (r *Rule) FallbackShare() int { return r.LocalShare }

// LeaseFor returns the rule's lease length, 0 for none.
func (r *Rule) LeaseFor() time.Duration { return r.Lease }

// Label is what metrics call the rule: its name, else its path.
func (r *Rule) Label() string {
	if r.Name != "" {
		return r.Name
	}
	return r.Path
}

// node is one level of descriptors: the entries below a matched entry.
type node struct {
	// exact holds "key\x00value" and value-less "key" entries; wild the
	// values with a *, in file order.
	exact   map[string]*node
	keyOnly map[string]*node
	wild    []*wildNode
	rule    *Rule
	// share: a share_threshold wildcard, counting every value it matches
	// in one bucket keyed by the pattern.
	share   bool
	pattern string // the wildcard's value, with its *
}

// wildNode is a wildcard value split on its stars; each * matches any run
// of characters, none included.
type wildNode struct {
	key, pattern string
	parts        []string
	n            *node
}

// matches reports whether value matches the wildcard.
func (w *wildNode) matches(value string) bool {
	ps := w.parts
	first, last := ps[0], ps[len(ps)-1]
	if len(value) < len(first)+len(last) || !strings.HasPrefix(value, first) || !strings.HasSuffix(value, last) {
		return false
	}
	rest := value[len(first) : len(value)-len(last)]
	for _, p := range ps[1 : len(ps)-1] {
		i := strings.Index(rest, p)
		if i < 0 {
			return false
		}
		rest = rest[i+len(p):]
	}
	return true
}

func newNode() *node { return &node{exact: map[string]*node{}, keyOnly: map[string]*node{}} }

func (n *node) empty() bool { return len(n.exact) == 0 && len(n.keyOnly) == 0 && len(n.wild) == 0 }

// unitWindows are the units ratelimit accepts and their lengths; month and
// year exceed window.MaxWindow and are refused.
var unitWindows = map[rlsv3.RateLimitResponse_RateLimit_Unit]time.Duration{
	rlsv3.RateLimitResponse_RateLimit_SECOND: time.Second,
	rlsv3.RateLimitResponse_RateLimit_MINUTE: time.Minute,
	rlsv3.RateLimitResponse_RateLimit_HOUR:   time.Hour,
	rlsv3.RateLimitResponse_RateLimit_DAY:    24 * time.Hour,
	rlsv3.RateLimitResponse_RateLimit_WEEK:   7 * 24 * time.Hour,
	rlsv3.RateLimitResponse_RateLimit_MONTH:  30 * 24 * time.Hour,
	rlsv3.RateLimitResponse_RateLimit_YEAR:   365 * 24 * time.Hour,
}

// parseUnit reads a unit as ratelimit does (case-insensitive enum name).
func parseUnit(s string) (rlsv3.RateLimitResponse_RateLimit_Unit, bool) {
	v, ok := rlsv3.RateLimitResponse_RateLimit_Unit_value[strings.ToUpper(s)]
	if !ok || v == int32(rlsv3.RateLimitResponse_RateLimit_UNKNOWN) {
		return 0, false
	}
	return rlsv3.RateLimitResponse_RateLimit_Unit(v), true
}

// limitWindow returns unit × mult and whether flashgate can enforce it.
func limitWindow(unit rlsv3.RateLimitResponse_RateLimit_Unit, mult uint32) (time.Duration, error) {
	base, ok := unitWindows[unit]
	if !ok {
		return 0, fmt.Errorf("unit %s is not one of second, minute, hour, day, week, month, year", unit)
	}
	if mult == 0 {
		mult = 1
	}
	if time.Duration(mult) > window.MaxWindow/base {
		return 0, fmt.Errorf("a window of %d %s is longer than flashgate's longest window, %s (an exact log per key)",
			mult, strings.ToLower(unit.String()), window.MaxWindow)
	}
	return base * time.Duration(mult), nil
}

// windowUnits are the units current_limit reports, longest first: the
// longest that divides the window.
var windowUnits = []rlsv3.RateLimitResponse_RateLimit_Unit{
	rlsv3.RateLimitResponse_RateLimit_WEEK,
	rlsv3.RateLimitResponse_RateLimit_DAY,
	rlsv3.RateLimitResponse_RateLimit_HOUR,
	rlsv3.RateLimitResponse_RateLimit_MINUTE,
	rlsv3.RateLimitResponse_RateLimit_SECOND,
}

// unitOf returns the unit and multiplier of a window of whole seconds.
func unitOf(w time.Duration) (rlsv3.RateLimitResponse_RateLimit_Unit, uint32) {
	for _, u := range windowUnits {
		if base := unitWindows[u]; w%base == 0 {
			return u, uint32(w / base)
		}
	}
	return rlsv3.RateLimitResponse_RateLimit_UNKNOWN, 0
}
