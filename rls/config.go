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

// This file holds the model of a ratelimit config directory: what [LoadDir]
// and [ParseFiles] produce and [Config.match] walks.

// Limits of a config directory.
const (
	// MaxFileSize is the largest config file accepted.
	MaxFileSize = 1 << 20
	// MaxFiles is the most config files a directory may hold.
	MaxFiles = 1024
	// MaxDepth is the deepest nesting of descriptors.
	MaxDepth = 16
)

// Config is a loaded ratelimit config: every domain of a directory. It is
// immutable once loaded and safe for concurrent use.
type Config struct {
	// Dir is the directory the files came from ("" when parsed from memory).
	Dir     string
	domains map[string]*Domain
	sum     [32]byte // hash of the files' names and contents
}

// quotaRules returns the labels of the rules with quota_mode, "domain:label",
// sorted by domain; nil for none.
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

// KeyNamespace begins the rule part of every limit key the RLS makes: a
// domain's windows are keyed under the rule KeyNamespace+domain. The RLS
// registers it with the core; the descriptors file refuses rule names
// that begin with it (descriptors.ReservedRulePrefix), so that no ext_authz
// rule shares a domain's windows.
const KeyNamespace = "rls."

// Domain is one domain: the descriptors of one file.
type Domain struct {
	Name string
	File string
	// keyRule is the rule part of the domain's limit keys: KeyNamespace
	// and the domain (window.Keys hashes it if it is long or unsafe).
	keyRule string
	root    node
	// rules lists every rate_limit of the domain, in file order.
	rules []*Rule
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
	// Path is the rule's place in its domain as ratelimit names it in its
	// stats: "key_value.subkey" (keys, and values when set, from the
	// config only). It labels metrics when Name is empty.
	Path string
	// Name is rate_limit.name ("" when unset); replaces refers to it.
	Name string
	// Replaces names the rules this one replaces when both match one request.
	Replaces []string
	// Unlimited: the descriptor matches but is never limited or counted.
	Unlimited bool
	// RequestsPerUnit as written; 0 refuses every request (ratelimit's way
	// to block a value).
	RequestsPerUnit uint32
	// Unit and UnitMultiplier as written (multiplier 1 when unset).
	Unit           rlsv3.RateLimitResponse_RateLimit_Unit
	UnitMultiplier uint32
	// Window is Unit × UnitMultiplier: the sliding window's length.
	Window time.Duration
	// Buckets is the window's window.Limit.Buckets: written (flashgate's
	// rate_limit algorithm and buckets), or window.Limit.Auto's choice by
	// size, AutoBuckets then set; 0 is an exact log.
	Buckets     int
	AutoBuckets bool
	// Shadow is shadow_mode: counted and reported, never denies.
	Shadow bool
	// QuotaMode is ratelimit's quota_mode, which refuses a request only
	// when every quota descriptor of it is over. flashgate enforces such a
	// rule as an ordinary limit (stricter: it refuses as soon as this one
	// is over); the Server logs it when it installs the config.
	QuotaMode bool
	// FailureMode, LocalShare and Ban are flashgate's additions
	// (failure_mode, local_share, ban), as in its descriptors file: set on
	// a descriptor, they apply to its rate_limit and to the nested ones.
	// FailureDefault means the server's failure mode; LocalShare 0 means
	// ceil(limit / fleet size) (see [Rule.FallbackShare]); a nil Ban means
	// no penalty box (ratelimit's files never ask for one), a non-nil one
	// the box the rule asks for, its zero fields taken from the server's.
	FailureMode enforce.FailureMode
	LocalShare  int
	Ban         *window.Ban
	// Lease (lease: {for: D}, flashgate's) is how long a sidecar may admit
	// from a batch of the rule's admissions reserved in one call; 0: none.
	Lease time.Duration
	// DetailedMetric and ValueToMetric are accepted for compatibility;
	// flashgate's metric labels never carry request values, so they change
	// nothing.
	DetailedMetric, ValueToMetric bool

	// policy is the rule as the rate-limit headers name it, built when the
	// rule is loaded (nil for an unlimited one; see policyOf).
	policy *enforce.Policy
}

// policyOf returns the rule's rate-limit header policy: named by its
// Label, its requests per unit a window.
func (r *Rule) policyOf() *enforce.Policy {
	if r.policy != nil {
		return r.policy
	}
	return enforce.NewPolicy(r.Label(), window.Limit{Requests: int(r.RequestsPerUnit), Window: r.Window})
}

// PenaltyBox returns the penalty box the rule asks for, nil for none: a
// hit tagged with r carries it to the Guard (guard.RuleBan).
func (r *Rule) PenaltyBox() *window.Ban { return r.Ban }

// FallbackShare returns the rule's local_share, 0 for the fleet's share: a
// hit tagged with r carries it to the Fallback (fallback.RuleShare).
func (r *Rule) FallbackShare() int { return r.LocalShare }

// LeaseFor returns the rule's lease length, 0 for none: a hit tagged with
// r carries it to the lease holder (lease.RuleLease).
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
	// exact holds "key\x00value" entries and value-less "key" entries
	// (keyOnly); wild holds the values with a * in file order.
	exact   map[string]*node
	keyOnly map[string]*node
	wild    []*wildNode
	rule    *Rule
	// share: this node is a wildcard with share_threshold: every value it
	// matches counts in one bucket, keyed by the pattern.
	share   bool
	pattern string // the wildcard's value, with its *
}

// wildNode is a wildcard value: each * matches any run of characters,
// none included (ratelimit's wildcardMatch); parts is the pattern split on
// its stars.
type wildNode struct {
	key, pattern string
	parts        []string
	n            *node
}

// matches reports whether value matches the wildcard: it starts with the
// first part, ends with the last, and holds the middle ones in order in
// between, none overlapping.
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

// unitWindows are the units ratelimit accepts (go-control-plane's enum) and
// their lengths. ratelimit's month and year are 30 and 365 days: longer than
// window.MaxWindow, so flashgate refuses them with a sentence.
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

// windowUnits are the units a flashgate window ({requests, window}) is
// reported in, longest first: current_limit names the longest unit that
// divides the window, as ratelimit reports a unit_multiplier's base unit.
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
