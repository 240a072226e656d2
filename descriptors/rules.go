package descriptors

import (
	"strconv"
	"time"

	"github.com/flashgate/flashgate/enforce"
	"github.com/flashgate/flashgate/internal/configfile"
	"github.com/flashgate/flashgate/window"
)

// This file is the model of a descriptors file: compile.go builds it and
// map.go reads it.

// Limits of a descriptors file.
const (
	// MaxRuleName is the longest rule name, so names stay verbatim in keys.
	MaxRuleName = window.MaxVerbatim
	// MaxSources is the most sources a file may declare.
	MaxSources = 64
	// MaxDepth is the deepest nesting of descriptors.
	MaxDepth = 8
	// MaxFileSize is the largest descriptors file accepted.
	MaxFileSize = 1 << 20
	// MaxTrustedHops bounds client_ip.trusted_hops.
	MaxTrustedHops = 16
	// MaxValueLen is the longest value pattern in the file; request values
	// have no such cap (see the package doc).
	MaxValueLen = 1024
)

// OnMissing says what a rule does with a request lacking one of its values.
type OnMissing uint8

const (
	// MissingSkip: the rule does not apply to the request (the default).
	MissingSkip OnMissing = iota
	// MissingDeny: the request is refused (a would-be denial in shadow).
	MissingDeny
)

// String returns "skip" or "deny".
func (o OnMissing) String() string {
	if o == MissingDeny {
		return "deny"
	}
	return "skip"
}

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
	// SourceContextExtension: an Envoy per-route context_extensions entry.
	SourceContextExtension
)

var sourceKinds = map[string]SourceKind{
	"request_headers":   SourceHeader,
	"remote_address":    SourceRemoteAddress,
	"request_path":      SourcePath,
	"request_method":    SourceMethod,
	"authority":         SourceAuthority,
	"context_extension": SourceContextExtension,
}

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
	// Name is the lower-case header name or the context_extensions key.
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
	// HasValue: the request's value must equal Value, or start with it
	// when Prefix, and the limit key holds the pattern; without a value,
	// any present value matches and is keyed. A path prefix ending in "/"
	// also holds the directory itself.
	HasValue bool
	Value    string
	Prefix   bool

	src     int    // index into Config.sources
	pattern string // the value as written in the file
	dir     bool   // a path prefix ending in "/": holds Value less its "/" too
}

// Pattern returns the value as written in the file, which the limit key
// holds, or "".
func (m Match) Pattern() string {
	if m.pattern != "" {
		return m.pattern
	}
	if m.Prefix {
		return m.Value + "*"
	}
	return m.Value
}

// Rule is one descriptor with a rate_limit and the settings it inherits;
// immutable once its Config is built. A hit's limit key is
// window.Keys.Key(Name, joinParts of each level's Pattern or request
// value).
type Rule struct {
	// Name is unique in its Config: given, or derived from the path.
	Name string
	// Limit is enforced per distinct tuple of request values.
	Limit window.Limit
	// AutoBuckets: Limit.Buckets was chosen by the rule's size.
	AutoBuckets bool
	// Match is the descriptor path from the top level down to this rule.
	Match []Match
	// Shadow: decide and count, but never deny (shadow_mode).
	Shadow bool
	// FailureMode overrides the server's default when not FailureDefault.
	FailureMode enforce.FailureMode
	// LocalShare is how many admissions per window one sidecar may make
	// alone while the backend is down; 0 lets the fallback compute it.
	LocalShare int
	// OnMissing: what to do when a value the rule needs is absent.
	OnMissing OnMissing
	// Ban is the penalty box the rule asks for; nil: never banned.
	Ban *window.Ban
	// Lease is how long a sidecar may admit from a reserved batch; 0: none.
	Lease time.Duration
	// Line and Column locate the descriptor in the file.
	Line, Column int

	idx      int    // index in Config.Rules
	nvar     int    // number of Match levels without a value (request values in the key)
	constKey string // when nvar is 0: the joined key parts, the same for every request
}

// Index returns r's position in its Config's Rules.
func (r *Rule) Index() int { return r.idx }

// PenaltyBox returns the penalty box the rule asks for, nil for none.
func (r *Rule) PenaltyBox() *window.Ban { return r.Ban }

// FallbackShare returns the rule's local_share, 0 for the fleet's share.
func (r *Rule) FallbackShare() int { return r.LocalShare }

// LeaseFor returns the rule's lease length, 0 for none.
func (r *Rule) LeaseFor() time.Duration { return r.Lease }

// ClientIP says how the client IP (remote_address) is found.
type ClientIP struct {
	// TrustedHops: 0 uses Envoy's source.address; N takes the Nth entry
	// from the right of x-forwarded-for, else source.address.
	TrustedHops int
}

// Config is a loaded, validated descriptors file; immutable and safe for
// concurrent use.
type Config struct {
	// Name is the file name given to ParseConfig or LoadFile.
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

// Sources returns a new map of the descriptor keys in use and their
// sources.
func (c *Config) Sources() map[string]Source {
	m := make(map[string]Source, len(c.sources))
	for i, s := range c.sources {
		m[c.sourceKeys[i]] = s
	}
	return m
}

// ConfigError is a descriptors file error, "FILE:LINE:COL: message"; the
// ratelimit service's loader reports the same type.
type ConfigError = configfile.Error

// joinParts joins key parts unambiguously: one part as is, several each
// length-prefixed.
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
