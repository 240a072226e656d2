package descriptors

import (
	"strconv"
	"time"

	"github.com/flashgate/flashgate/enforce"
	"github.com/flashgate/flashgate/internal/configfile"
	"github.com/flashgate/flashgate/window"
)

// This file holds the model of a descriptors file: what [ParseConfig]
// produces and a [Mapper] reads. compile.go builds it; map.go only
// reads it.

// Limits of a descriptors file.
const (
	// MaxRuleName is the longest rule name, so that rule names stay verbatim
	// in limit keys.
	MaxRuleName = window.MaxVerbatim
	// MaxSources is the most sources a file may declare.
	MaxSources = 64
	// MaxDepth is the deepest nesting of descriptors.
	MaxDepth = 8
	// MaxFileSize is the largest descriptors file accepted.
	MaxFileSize = 1 << 20
	// MaxTrustedHops bounds client_ip.trusted_hops.
	MaxTrustedHops = 16
	// MaxValueLen is the longest value pattern a descriptor may have in the
	// descriptors file. Request values have no such cap: a value of any
	// length (up to the gRPC message limit) is a bucket of its own, hashed
	// into a bounded key by window.Keys, so padding a header cannot escape a
	// rule. Matching a descriptor's value pattern uses the whole request
	// value.
	MaxValueLen = 1024
)

// OnMissing says what a rule does with a request lacking one of its values.
type OnMissing uint8

const (
	// MissingSkip: the rule does not apply to the request (the default).
	MissingSkip OnMissing = iota
	// MissingDeny: the request is refused (admitted with the shadow header if
	// the rule is in shadow mode).
	MissingDeny
)

// String returns "skip" or "deny".
func (o OnMissing) String() string {
	if o == MissingDeny {
		return "deny"
	}
	return "skip"
}

// parseOnMissing parses "skip" or "deny" (the per-rule on_missing).
func parseOnMissing(s string) (OnMissing, bool) {
	switch s {
	case "skip":
		return MissingSkip, true
	case "deny":
		return MissingDeny, true
	}
	return MissingSkip, false
}

// SourceKind is where a descriptor key's value comes from.
type SourceKind uint8

const (
	// SourceHeader: a request header (request_headers: {header_name}).
	SourceHeader SourceKind = iota + 1
	// SourceRemoteAddress: the client IP (remote_address: {}), see ClientIP.
	SourceRemoteAddress
	// SourcePath: the request path without query (request_path: {}).
	SourcePath
	// SourceMethod: the request method (request_method: {}).
	SourceMethod
	// SourceAuthority: the host / :authority (authority: {}).
	SourceAuthority
	// SourceContextExtension: an Envoy per-route ext_authz
	// context_extensions entry (context_extension: {key}).
	SourceContextExtension
)

// sourceKinds maps the YAML name of each SourceKind to it.
var sourceKinds = map[string]SourceKind{
	"request_headers":   SourceHeader,
	"remote_address":    SourceRemoteAddress,
	"request_path":      SourcePath,
	"request_method":    SourceMethod,
	"authority":         SourceAuthority,
	"context_extension": SourceContextExtension,
}

// sourceKindList is the keys of sourceKinds in declaration order, for errors.
const sourceKindList = "request_headers, remote_address, request_path, request_method, authority, context_extension"

// String returns the YAML name of k.
func (k SourceKind) String() string {
	for name, v := range sourceKinds {
		if v == k {
			return name
		}
	}
	return "unknown"
}

// Source is where one descriptor key's value comes from.
type Source struct {
	Kind SourceKind
	// Name is the lower-case header name (SourceHeader) or the
	// context_extensions key (SourceContextExtension); empty otherwise.
	Name string
}

// String describes s for people: "header x-uid", "client IP", ...
func (s Source) String() string {
	switch s.Kind {
	case SourceHeader:
		return "header " + s.Name
	case SourceRemoteAddress:
		return "client IP"
	case SourcePath:
		return "path"
	case SourceMethod:
		return "method"
	case SourceAuthority:
		return "authority"
	case SourceContextExtension:
		return "context_extension " + s.Name
	}
	return "unknown"
}

// Match is one level of a rule's descriptor path.
type Match struct {
	// Key is the descriptor key; Source where its value comes from.
	Key    string
	Source Source
	// HasValue: the descriptor sets a value, so the request's value must
	// equal Value (Prefix false) or start with it (Prefix true, the trailing
	// "*" removed), and the limit key holds the pattern, not the request's
	// value. Without a value, any present value matches and becomes part of
	// the limit key. A path's Value is canonical (package reqpath), compared
	// with the request's canonical path; a prefix ending in "/" also holds
	// the directory itself ("/api/coupon/*" holds "/api/coupon").
	HasValue bool
	Value    string
	Prefix   bool

	src     int    // index into Config.sources
	pattern string // the value as written in the file
	dir     bool   // a path prefix ending in "/": holds Value less its "/" too
}

// Pattern returns the value as written in the file ("/api/coupon/*"), or "".
// The limit key of a rule holds it, not the canonical Value.
func (m Match) Pattern() string {
	if m.pattern != "" {
		return m.pattern
	}
	if m.Prefix {
		return m.Value + "*"
	}
	return m.Value
}

// Rule is one descriptor with a rate_limit, with the settings it inherits.
// A Rule is immutable once its Config is built.
//
// The limit key of a hit is window.Keys.Key(Name, v), v being the key parts
// of the rule's Match levels, in order, joined by joinParts: for a level
// with a value its Pattern, otherwise the request's value.
type Rule struct {
	// Name is unique in its Config: given, or derived from the path.
	Name string
	// Limit is enforced per distinct tuple of request values. Its Buckets
	// come from rate_limit's algorithm and buckets: written (algorithm:
	// buckets is window.DefaultBuckets), 0 for algorithm: exact, and by
	// default window.Limit.Auto's choice.
	Limit window.Limit
	// AutoBuckets: Limit.Buckets was chosen by the rule's size
	// (window.AutoBucketsAbove), not written in the file.
	AutoBuckets bool
	// Match is the descriptor path from the top level down to this rule.
	Match []Match
	// Shadow: decide and count, but never deny (shadow_mode).
	Shadow bool
	// FailureMode overrides the server's default when not FailureDefault.
	FailureMode enforce.FailureMode
	// LocalShare (local_share) is how many admissions per window one
	// sidecar may make on its own for this rule while the shared backend is
	// unavailable and the rule's failure mode is local: 1 to Limit.Requests.
	// 0, the default, means ceil(Limit.Requests / live fleet size), which the
	// fallback limiter computes.
	LocalShare int
	// OnMissing: what to do when a value the rule needs is absent.
	OnMissing OnMissing
	// Ban is the penalty box the rule asks for (ban:), its zero fields
	// taken from the server's; nil: the rule's keys are never banned.
	Ban *window.Ban
	// Lease (lease: {for: D}) is how long a sidecar may admit from a batch
	// of the rule's admissions reserved in one call; 0, the default: none.
	Lease time.Duration
	// Line and Column locate the descriptor in the file.
	Line, Column int

	idx      int    // index in Config.Rules
	nvar     int    // number of Match levels without a value (request values in the key)
	constKey string // when nvar is 0: the joined key parts, the same for every request
}

// Index returns r's position in its Config's Rules.
func (r *Rule) Index() int { return r.idx }

// PenaltyBox returns the penalty box the rule asks for, nil for none: a
// hit tagged with r carries it to the Guard (guard.RuleBan).
func (r *Rule) PenaltyBox() *window.Ban { return r.Ban }

// FallbackShare returns the rule's local_share, 0 for the fleet's share: a
// hit tagged with r carries it to the Fallback (fallback.RuleShare).
func (r *Rule) FallbackShare() int { return r.LocalShare }

// LeaseFor returns the rule's lease length, 0 for none: a hit tagged with
// r carries it to the lease holder (lease.RuleLease).
func (r *Rule) LeaseFor() time.Duration { return r.Lease }

// ClientIP says how the client IP (remote_address) is found.
type ClientIP struct {
	// TrustedHops: 0 uses Envoy's source.address; N > 0 takes the Nth
	// address from the right of x-forwarded-for (the one the farthest
	// trusted proxy appended), falling back to source.address when the header
	// has fewer than N entries.
	TrustedHops int
}

// Config is a loaded, defaulted and validated descriptors file. It is
// immutable and safe for concurrent use.
type Config struct {
	// Name is the file name given to ParseConfig (or the path to LoadFile).
	Name string
	// Domain is the file's domain, used as a metric label.
	Domain string
	// ClientIP configures remote_address.
	ClientIP ClientIP
	// PathCase says whether path patterns and path values tell case apart.
	PathCase PathCase
	// Rules are the descriptors with a rate_limit, in file order.
	Rules []*Rule

	sources    []Source
	sourceKeys []string // descriptor key of each source, for reports
	sum        [32]byte // SHA-256 of the content
}

// Sum returns the SHA-256 of the file c was parsed from.
func (c *Config) Sum() [32]byte { return c.sum }

// Sources returns the descriptor keys in use and where their values come
// from (a new map on each call).
func (c *Config) Sources() map[string]Source {
	m := make(map[string]Source, len(c.sources))
	for i, s := range c.sources {
		m[c.sourceKeys[i]] = s
	}
	return m
}

// ConfigError is a descriptors file error at a position: File, Line,
// Column and Msg, a plain sentence; Error returns "FILE:LINE:COL: message".
// The ratelimit service's loader reports the same type (rls.ConfigError).
type ConfigError = configfile.Error

// joinParts joins key parts unambiguously: one part is itself, several are
// each prefixed by their length ("13:/api/coupon/*7:user-42").
func joinParts(parts []string) string {
	if len(parts) == 1 {
		return parts[0]
	}
	n := 0
	for _, s := range parts {
		n += len(s) + 8
	}
	return string(appendJoined(make([]byte, 0, n), parts))
}

// appendJoined appends joinParts(parts) to b, for two parts or more.
func appendJoined(b []byte, parts []string) []byte {
	for _, s := range parts {
		b = strconv.AppendInt(b, int64(len(s)), 10)
		b = append(b, ':')
		b = append(b, s...)
	}
	return b
}
