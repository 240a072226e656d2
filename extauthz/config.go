package extauthz

import (
	"crypto/sha256"
	_ "embed"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/goccy/go-yaml"
	"github.com/goccy/go-yaml/ast"
	"github.com/goccy/go-yaml/parser"

	"github.com/flashgate/flashgate/window"
)

//go:embed flashsale.yaml
var exampleYAML []byte

// ExampleName is the file name under which the built-in example is reported
// in errors and logs.
const ExampleName = "built-in:flashsale.yaml"

// ExampleYAML returns a copy of the built-in example descriptors file
// (domain "flashsale"), byte for byte the shipped extauthz/flashsale.yaml.
func ExampleYAML() []byte { return append([]byte(nil), exampleYAML...) }

// ExampleConfig parses the built-in example. It fails only if the embedded
// file is broken, which a test rules out.
func ExampleConfig() (*Config, error) { return ParseConfig(ExampleName, exampleYAML) }

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
)

// FailureMode says what to do with a hit when the backend cannot decide.
type FailureMode uint8

const (
	// FailureDefault: use the server's default (Options.FailureMode).
	FailureDefault FailureMode = iota
	// FailureLocal: decide the hit with the in-process fallback limiter.
	FailureLocal
	// FailureAllow: admit as far as this hit is concerned.
	FailureAllow
	// FailureDeny: refuse the request.
	FailureDeny
)

// String returns "local", "allow", "deny" or "default".
func (m FailureMode) String() string {
	switch m {
	case FailureLocal:
		return "local"
	case FailureAllow:
		return "allow"
	case FailureDeny:
		return "deny"
	default:
		return "default"
	}
}

// ParseFailureMode parses "local", "allow" or "deny" (the --failure-mode
// flag and the per-rule failure_mode).
func ParseFailureMode(s string) (FailureMode, error) {
	switch s {
	case "local":
		return FailureLocal, nil
	case "allow":
		return FailureAllow, nil
	case "deny":
		return FailureDeny, nil
	}
	return FailureDefault, fmt.Errorf("failure mode %q is not one of local, allow, deny", s)
}

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

// defaultSources are the descriptor keys that need no entry under sources.
var defaultSources = map[string]Source{
	"remote_address": {Kind: SourceRemoteAddress},
	"path":           {Kind: SourcePath},
	"method":         {Kind: SourceMethod},
	"authority":      {Kind: SourceAuthority},
	"host":           {Kind: SourceAuthority},
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
	// the limit key.
	HasValue bool
	Value    string
	Prefix   bool

	src     int    // index into Config.sources
	pattern string // Pattern(), precomputed
}

// Pattern returns the value as written in the file ("/api/coupon/*"), or "".
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
type Rule struct {
	// Name is unique in its Config: given, or derived from the path.
	Name string
	// Limit is enforced per distinct tuple of request values.
	Limit window.Limit
	// Match is the descriptor path from the top level down to this rule.
	Match []Match
	// Shadow: decide and count, but never deny (shadow_mode).
	Shadow bool
	// FailureMode overrides the server's default when not FailureDefault.
	FailureMode FailureMode
	// OnMissing: what to do when a value the rule needs is absent.
	OnMissing OnMissing
	// Ban, when non-nil, overrides the penalty box for this rule.
	Ban *window.Ban
	// Line and Column locate the descriptor in the file.
	Line, Column int

	idx      int    // index in Config.Rules
	constKey string // the joined constant parts, when the rule has no variable part
	nvar     int    // number of variable parts
}

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
	// Rules are the descriptors with a rate_limit, in file order.
	Rules []*Rule

	sources    []Source
	sourceKeys []string // descriptor key of each source, for reports
	path       string   // the file LoadFile read, for Server.Reload
	sum        [32]byte // SHA-256 of the content
}

// Sources returns the descriptor keys in use and where their values come
// from, sorted by key.
func (c *Config) Sources() map[string]Source {
	m := make(map[string]Source, len(c.sources))
	for i, s := range c.sources {
		m[c.sourceKeys[i]] = s
	}
	return m
}

// ConfigError is a descriptors file error at a position.
type ConfigError struct {
	File         string
	Line, Column int
	// Msg is a plain sentence, without position.
	Msg string
}

// Error returns "FILE:LINE:COL: message".
func (e *ConfigError) Error() string {
	return fmt.Sprintf("%s:%d:%d: %s", e.File, e.Line, e.Column, e.Msg)
}

// LoadFile reads, parses, defaults and validates the descriptors file at
// path. Errors about the content are *ConfigError.
func LoadFile(path string) (*Config, error) {
	data, err := readFile(path)
	if err != nil {
		return nil, err
	}
	c, err := ParseConfig(path, data)
	if err != nil {
		return nil, err
	}
	c.path = path
	return c, nil
}

func readFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("read descriptors file: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, MaxFileSize+1))
	if err != nil {
		return nil, fmt.Errorf("read descriptors file: %w", err)
	}
	return data, nil
}

// ParseConfig parses, defaults and validates a descriptors file; name is
// used in error positions. Every error about the content is a *ConfigError
// ("name:line:col: sentence"); the first one found is returned.
func ParseConfig(name string, data []byte) (*Config, error) {
	p := &cfgParser{file: name}
	c, err := p.parse(data)
	if err != nil {
		return nil, err
	}
	return c, nil
}

type cfgParser struct {
	file   string
	cfg    *Config
	srcIdx map[string]int
	// srcNodes holds where each declared source is, to report unused ones.
	srcNodes map[string]ast.Node
	used     map[string]bool
	names    map[string]*Rule
}

func (p *cfgParser) errAt(line, col int, format string, args ...any) error {
	return &ConfigError{File: p.file, Line: line, Column: col, Msg: fmt.Sprintf(format, args...)}
}

func (p *cfgParser) errf(n ast.Node, format string, args ...any) error {
	line, col := nodePos(n)
	return p.errAt(line, col, format, args...)
}

// nodePos returns where a node starts, as people read it.
func nodePos(n ast.Node) (int, int) {
	switch m := n.(type) {
	case nil:
		return 1, 1
	case *ast.MappingNode:
		if !m.IsFlowStyle && len(m.Values) > 0 {
			return nodePos(m.Values[0])
		}
	case *ast.MappingValueNode:
		return nodePos(m.Key)
	case *ast.SequenceNode:
		if !m.IsFlowStyle && len(m.Values) > 0 {
			line, col := nodePos(m.Values[0])
			return line, max(col-2, 1)
		}
	}
	tk := n.GetToken()
	if tk == nil || tk.Position == nil {
		return 1, 1
	}
	return tk.Position.Line, tk.Position.Column
}

func (p *cfgParser) parse(data []byte) (*Config, error) {
	if len(data) > MaxFileSize {
		return nil, p.errAt(1, 1, "the file is larger than %d bytes", MaxFileSize)
	}
	f, err := parser.ParseBytes(data, 0)
	if err != nil {
		return nil, p.yamlError(err)
	}
	var body ast.Node
	for _, d := range f.Docs {
		if d.Body == nil {
			continue
		}
		if body != nil {
			return nil, p.errf(d.Body, "the file holds more than one YAML document; keep one")
		}
		body = d.Body
	}
	if body == nil {
		return nil, p.errAt(1, 1, "the file is empty: it needs at least domain and descriptors")
	}
	p.cfg = &Config{Name: p.file}
	p.srcIdx = map[string]int{}
	p.srcNodes = map[string]ast.Node{}
	p.used = map[string]bool{}
	p.names = map[string]*Rule{}
	if err := p.top(body); err != nil {
		return nil, err
	}
	p.cfg.sum = sha256.Sum256(data)
	return p.cfg, nil
}

var dupKeyRE = regexp.MustCompile(`^mapping key ("[^"]*") already defined at \[(\d+):\d+\]`)

// yamlError turns a goccy/go-yaml error into a *ConfigError.
func (p *cfgParser) yamlError(err error) error {
	var ye yaml.Error
	if errors.As(err, &ye) && ye.GetToken() != nil && ye.GetToken().Position != nil {
		pos := ye.GetToken().Position
		msg := ye.GetMessage()
		// The parser finds duplicate keys: `mapping key "a" already defined at [4:5]`.
		if m := dupKeyRE.FindStringSubmatch(msg); m != nil {
			return p.errAt(pos.Line, pos.Column, "duplicate key %s (first set on line %s)", m[1], m[2])
		}
		return p.errAt(pos.Line, pos.Column, "invalid YAML: %s", msg)
	}
	return p.errAt(1, 1, "invalid YAML: %s", err.Error())
}

// field is one key: value of a mapping.
type field struct {
	key   string
	keyN  ast.Node
	value ast.Node
}

// fields returns the entries of a mapping node, refusing keys outside known,
// duplicates, anchors, aliases and tags. what names the mapping in errors.
func (p *cfgParser) fields(n ast.Node, what string, known ...string) ([]field, error) {
	if err := p.plain(n); err != nil {
		return nil, err
	}
	var vals []*ast.MappingValueNode
	switch m := n.(type) {
	case *ast.MappingNode:
		vals = m.Values
	case *ast.MappingValueNode:
		vals = []*ast.MappingValueNode{m}
	case *ast.NullNode:
		return nil, nil
	default:
		return nil, p.errf(n, "%s must be a mapping of keys to values, not %s", what, kindOf(n))
	}
	out := make([]field, 0, len(vals))
	seen := map[string]bool{}
	for _, v := range vals {
		if err := p.plain(v.Key); err != nil {
			return nil, err
		}
		k, ok := scalarText(v.Key)
		if !ok {
			return nil, p.errf(v.Key, "keys of %s must be plain words", what)
		}
		if seen[k] {
			return nil, p.errf(v.Key, "duplicate key %q in %s", k, what)
		}
		seen[k] = true
		if known != nil && !contains(known, k) {
			return nil, p.errf(v.Key, "unknown key %q in %s; known keys: %s", k, what, strings.Join(known, ", "))
		}
		if err := p.plain(v.Value); err != nil {
			return nil, err
		}
		out = append(out, field{key: k, keyN: v.Key, value: v.Value})
	}
	return out, nil
}

// plain refuses anchors, aliases, tags and merge keys, which would make the
// file harder to read than it needs to be.
func (p *cfgParser) plain(n ast.Node) error {
	switch n.(type) {
	case *ast.AnchorNode, *ast.AliasNode:
		return p.errf(n, "anchors and aliases are not supported in a descriptors file")
	case *ast.TagNode:
		return p.errf(n, "YAML tags are not supported in a descriptors file")
	case *ast.MergeKeyNode:
		return p.errf(n, "merge keys (<<) are not supported in a descriptors file")
	}
	return nil
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

func kindOf(n ast.Node) string {
	switch n.(type) {
	case *ast.MappingNode, *ast.MappingValueNode:
		return "a mapping"
	case *ast.SequenceNode:
		return "a list"
	case *ast.NullNode:
		return "empty"
	case *ast.StringNode, *ast.LiteralNode:
		return "a string"
	case *ast.IntegerNode, *ast.FloatNode, *ast.InfinityNode, *ast.NanNode:
		return "a number"
	case *ast.BoolNode:
		return "a boolean"
	}
	return "a " + n.Type().String()
}

// scalarText returns the text of a scalar node.
func scalarText(n ast.Node) (string, bool) {
	switch s := n.(type) {
	case *ast.StringNode:
		return s.Value, true
	case *ast.LiteralNode:
		return s.Value.Value, true
	case *ast.IntegerNode, *ast.FloatNode, *ast.BoolNode:
		return n.GetToken().Value, true
	}
	return "", false
}

func (p *cfgParser) str(n ast.Node, what string) (string, error) {
	if err := p.plain(n); err != nil {
		return "", err
	}
	s, ok := scalarText(n)
	if !ok {
		return "", p.errf(n, "%s must be a string, not %s", what, kindOf(n))
	}
	return s, nil
}

func (p *cfgParser) integer(n ast.Node, what string) (int, error) {
	in, ok := n.(*ast.IntegerNode)
	if !ok {
		return 0, p.errf(n, "%s must be a whole number, not %s", what, kindOf(n))
	}
	switch v := in.Value.(type) {
	case int64:
		if v > math.MaxInt32 || v < math.MinInt32 {
			return 0, p.errf(n, "%s %d is out of range", what, v)
		}
		return int(v), nil
	case uint64:
		if v > math.MaxInt32 {
			return 0, p.errf(n, "%s %d is out of range", what, v)
		}
		return int(v), nil
	}
	return 0, p.errf(n, "%s must be a whole number", what)
}

func (p *cfgParser) boolean(n ast.Node, what string) (bool, error) {
	b, ok := n.(*ast.BoolNode)
	if !ok {
		return false, p.errf(n, "%s must be true or false, not %s", what, kindOf(n))
	}
	return b.Value, nil
}

// duration parses a Go duration string ("1s", "250ms"); a bare 0 is zero.
func (p *cfgParser) duration(n ast.Node, what string) (time.Duration, error) {
	if in, ok := n.(*ast.IntegerNode); ok {
		if t := in.GetToken().Value; t == "0" {
			return 0, nil
		}
		return 0, p.errf(n, "%s %s has no unit: write a duration such as 1s or 500ms", what, in.GetToken().Value)
	}
	s, ok := n.(*ast.StringNode)
	if !ok {
		return 0, p.errf(n, "%s must be a duration such as 1s or 500ms, not %s", what, kindOf(n))
	}
	d, err := time.ParseDuration(s.Value)
	if err != nil {
		return 0, p.errf(n, "%s %q is not a duration such as 1s or 500ms", what, s.Value)
	}
	return d, nil
}

func (p *cfgParser) top(body ast.Node) error {
	fs, err := p.fields(body, "the descriptors file", "domain", "sources", "client_ip", "descriptors")
	if err != nil {
		return err
	}
	var domainSet bool
	var descs *field
	for i := range fs {
		f := &fs[i]
		switch f.key {
		case "domain":
			d, err := p.str(f.value, "domain")
			if err != nil {
				return err
			}
			if d == "" {
				return p.errf(f.value, "domain is empty")
			}
			if len(d) > MaxRuleName || !safeName(d) {
				return p.errf(f.value, "domain %q must be 1 to %d characters of A-Z a-z 0-9 . _ -", d, MaxRuleName)
			}
			p.cfg.Domain, domainSet = d, true
		case "sources":
			if err := p.sources(f.value); err != nil {
				return err
			}
		case "client_ip":
			if err := p.clientIP(f.value); err != nil {
				return err
			}
		case "descriptors":
			descs = f
		}
	}
	if !domainSet {
		return p.errf(body, "domain is missing: name the rules' domain, such as domain: flashsale")
	}
	if descs == nil {
		return p.errf(body, "descriptors is missing: the file declares no rules")
	}
	if err := p.descriptors(descs.value, nil, inherited{}, 1); err != nil {
		return err
	}
	if len(p.cfg.Rules) == 0 {
		return p.errf(descs.keyN, "no descriptor has a rate_limit: the file declares no rules")
	}
	// Sources declared but never used are likely typos.
	for _, k := range sortedKeys(p.srcNodes) {
		if !p.used[k] {
			return p.errf(p.srcNodes[k], "source %q is not used by any descriptor", k)
		}
	}
	return nil
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func (p *cfgParser) clientIP(n ast.Node) error {
	fs, err := p.fields(n, "client_ip", "trusted_hops")
	if err != nil {
		return err
	}
	for _, f := range fs {
		hops, err := p.integer(f.value, "trusted_hops")
		if err != nil {
			return err
		}
		if hops < 0 || hops > MaxTrustedHops {
			return p.errf(f.value, "trusted_hops %d must be between 0 and %d", hops, MaxTrustedHops)
		}
		p.cfg.ClientIP.TrustedHops = hops
	}
	return nil
}

func (p *cfgParser) sources(n ast.Node) error {
	fs, err := p.fields(n, "sources")
	if err != nil {
		return err
	}
	for _, f := range fs {
		if f.key == "" || !safeName(f.key) {
			return p.errf(f.keyN, "descriptor key %q must be characters of A-Z a-z 0-9 . _ -", f.key)
		}
		src, err := p.source(f.key, f.value)
		if err != nil {
			return err
		}
		if len(p.cfg.sources) == MaxSources {
			return p.errf(f.keyN, "more than %d sources", MaxSources)
		}
		p.srcIdx[f.key] = len(p.cfg.sources)
		p.srcNodes[f.key] = f.keyN
		p.cfg.sources = append(p.cfg.sources, src)
		p.cfg.sourceKeys = append(p.cfg.sourceKeys, f.key)
	}
	return nil
}

func (p *cfgParser) source(key string, n ast.Node) (Source, error) {
	what := fmt.Sprintf("source %q", key)
	fs, err := p.fields(n, what)
	if err != nil {
		return Source{}, err
	}
	if len(fs) != 1 {
		return Source{}, p.errf(n, "%s must have exactly one of %s", what, sourceKindList)
	}
	f := fs[0]
	kind, ok := sourceKinds[f.key]
	if !ok {
		return Source{}, p.errf(f.keyN, "unknown source %q; known sources: %s", f.key, sourceKindList)
	}
	src := Source{Kind: kind}
	switch kind {
	case SourceHeader:
		opts, err := p.fields(f.value, f.key, "header_name")
		if err != nil {
			return Source{}, err
		}
		if len(opts) == 0 {
			return Source{}, p.errf(f.value, "request_headers needs header_name")
		}
		name, err := p.str(opts[0].value, "header_name")
		if err != nil {
			return Source{}, err
		}
		if !headerName(name) {
			return Source{}, p.errf(opts[0].value, "header_name %q is not a valid HTTP header name", name)
		}
		src.Name = strings.ToLower(name)
	case SourceContextExtension:
		opts, err := p.fields(f.value, f.key, "key")
		if err != nil {
			return Source{}, err
		}
		if len(opts) == 0 {
			return Source{}, p.errf(f.value, "context_extension needs key")
		}
		name, err := p.str(opts[0].value, "key")
		if err != nil {
			return Source{}, err
		}
		if name == "" {
			return Source{}, p.errf(opts[0].value, "context_extension key is empty")
		}
		src.Name = name
	default:
		opts, err := p.fields(f.value, f.key)
		if err != nil {
			return Source{}, err
		}
		if len(opts) > 0 {
			return Source{}, p.errf(opts[0].keyN, "%s takes no options: write %s: {}", f.key, f.key)
		}
	}
	return src, nil
}

// headerName reports whether s is an HTTP/2 header name (token characters,
// optionally with a leading ':' for pseudo-headers).
func headerName(s string) bool {
	s = strings.TrimPrefix(s, ":")
	if s == "" || len(s) > 256 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0 {
			continue
		}
		return false
	}
	return true
}

// safeName reports whether s uses only [A-Za-z0-9._-].
func safeName(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '.' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// inherited are the settings a descriptor passes to nested ones.
type inherited struct {
	shadow    bool
	failure   FailureMode
	onMissing OnMissing
	ban       *window.Ban
}

func (p *cfgParser) descriptors(n ast.Node, path []Match, inh inherited, depth int) error {
	if err := p.plain(n); err != nil {
		return err
	}
	seq, ok := n.(*ast.SequenceNode)
	if !ok {
		return p.errf(n, "descriptors must be a list, not %s", kindOf(n))
	}
	if depth > MaxDepth {
		return p.errf(n, "descriptors are nested deeper than %d levels", MaxDepth)
	}
	for _, item := range seq.Values {
		if err := p.descriptor(item, path, inh, depth); err != nil {
			return err
		}
	}
	return nil
}

var descriptorKeys = []string{"key", "value", "name", "rate_limit", "shadow_mode", "failure_mode", "ban", "on_missing", "descriptors"}

func (p *cfgParser) descriptor(n ast.Node, path []Match, inh inherited, depth int) error {
	fs, err := p.fields(n, "a descriptor", descriptorKeys...)
	if err != nil {
		return err
	}
	if len(fs) == 0 {
		return p.errf(n, "a descriptor needs a key")
	}
	get := func(k string) *field {
		for i := range fs {
			if fs[i].key == k {
				return &fs[i]
			}
		}
		return nil
	}
	kf := get("key")
	if kf == nil {
		return p.errf(n, "a descriptor needs a key")
	}
	key, err := p.str(kf.value, "key")
	if err != nil {
		return err
	}
	if key == "" {
		return p.errf(kf.value, "key is empty")
	}
	m := Match{Key: key}
	if i, ok := p.srcIdx[key]; ok {
		m.src, m.Source = i, p.cfg.sources[i]
		p.used[key] = true
	} else if src, ok := defaultSources[key]; ok {
		if len(p.cfg.sources) == MaxSources {
			return p.errf(kf.value, "more than %d sources", MaxSources)
		}
		p.srcIdx[key] = len(p.cfg.sources)
		p.cfg.sources = append(p.cfg.sources, src)
		p.cfg.sourceKeys = append(p.cfg.sourceKeys, key)
		m.src, m.Source = p.srcIdx[key], src
	} else {
		return p.errf(kf.value, "descriptor key %q has no source: declare it under sources (for example %s: {request_headers: {header_name: x-%s}})", key, key, key)
	}
	for _, earlier := range path {
		if earlier.Key == key {
			return p.errf(kf.value, "descriptor key %q is already used by an enclosing descriptor", key)
		}
	}
	if vf := get("value"); vf != nil {
		v, err := p.str(vf.value, "value")
		if err != nil {
			return err
		}
		if err := p.pattern(vf.value, v, &m); err != nil {
			return err
		}
	}
	path = append(path[:len(path):len(path)], m)

	if f := get("shadow_mode"); f != nil {
		if inh.shadow, err = p.boolean(f.value, "shadow_mode"); err != nil {
			return err
		}
	}
	if f := get("failure_mode"); f != nil {
		s, err := p.str(f.value, "failure_mode")
		if err != nil {
			return err
		}
		if inh.failure, err = ParseFailureMode(s); err != nil {
			return p.errf(f.value, "failure_mode %q must be local, allow or deny", s)
		}
	}
	if f := get("on_missing"); f != nil {
		s, err := p.str(f.value, "on_missing")
		if err != nil {
			return err
		}
		switch s {
		case "skip":
			inh.onMissing = MissingSkip
		case "deny":
			inh.onMissing = MissingDeny
		default:
			return p.errf(f.value, "on_missing %q must be skip or deny", s)
		}
	}
	if f := get("ban"); f != nil {
		b, err := p.ban(f.value)
		if err != nil {
			return err
		}
		inh.ban = b
	}

	rl, nested := get("rate_limit"), get("descriptors")
	nf := get("name")
	if rl == nil && nested == nil {
		return p.errf(n, "descriptor %q has neither rate_limit nor nested descriptors", key)
	}
	if nf != nil && rl == nil {
		return p.errf(nf.keyN, "name is set on a descriptor without rate_limit")
	}
	if rl != nil {
		limit, err := p.rateLimit(rl.value)
		if err != nil {
			return err
		}
		line, col := nodePos(n)
		r := &Rule{
			Limit: limit, Match: path, Shadow: inh.shadow, FailureMode: inh.failure,
			OnMissing: inh.onMissing, Ban: inh.ban, Line: line, Column: col,
		}
		var at ast.Node = kf.value
		if nf != nil {
			name, err := p.str(nf.value, "name")
			if err != nil {
				return err
			}
			if name == "" || len(name) > MaxRuleName || !safeName(name) {
				return p.errf(nf.value, "rule name %q must be 1 to %d characters of A-Z a-z 0-9 . _ -", name, MaxRuleName)
			}
			r.Name, at = name, nf.value
		} else {
			r.Name = derivedName(path)
			if len(r.Name) > MaxRuleName {
				return p.errf(n, "the derived rule name %q is longer than %d characters: set name", r.Name, MaxRuleName)
			}
		}
		if prev, dup := p.names[r.Name]; dup {
			return p.errf(at, "rule name %q is already used by the rule on line %d", r.Name, prev.Line)
		}
		p.names[r.Name] = r
		r.finish()
		r.idx = len(p.cfg.Rules)
		p.cfg.Rules = append(p.cfg.Rules, r)
	}
	if nested != nil {
		if err := p.descriptors(nested.value, path, inh, depth+1); err != nil {
			return err
		}
	}
	return nil
}

// finish precomputes what the request mapping needs.
func (r *Rule) finish() {
	var parts []string
	for _, m := range r.Match {
		if m.HasValue {
			parts = append(parts, m.Pattern())
		} else {
			r.nvar++
		}
	}
	if r.nvar == 0 {
		r.constKey = joinParts(parts)
	}
}

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

// derivedName names a rule after its path: "path.api_coupon.uid".
func derivedName(path []Match) string {
	var b strings.Builder
	for i, m := range path {
		if i > 0 {
			b.WriteByte('.')
		}
		b.WriteString(m.Key)
		if m.HasValue {
			v := sanitize(m.Value)
			if v != "" {
				b.WriteByte('_')
				b.WriteString(v)
			}
		}
	}
	return b.String()
}

// sanitize keeps [A-Za-z0-9] and turns runs of anything else into one '_'.
func sanitize(s string) string {
	var b strings.Builder
	under := false
	for i := 0; i < len(s); i++ {
		c := s[i]
		if 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' {
			b.WriteByte(c)
			under = false
		} else if !under && b.Len() > 0 {
			b.WriteByte('_')
			under = true
		}
	}
	return strings.TrimSuffix(b.String(), "_")
}

func (p *cfgParser) pattern(n ast.Node, v string, m *Match) error {
	if v == "" {
		return p.errf(n, "value is empty: omit value to limit per request value")
	}
	if v == "*" {
		return p.errf(n, "value \"*\" matches every value: omit value to limit per request value")
	}
	body := strings.TrimSuffix(v, "*")
	if strings.Contains(body, "*") {
		return p.errf(n, "value %q has a * that is not at the end; only a trailing * (prefix match) is supported", v)
	}
	if len(body) > MaxValueLen {
		return p.errf(n, "value is longer than %d bytes", MaxValueLen)
	}
	m.HasValue, m.Value, m.Prefix, m.pattern = true, body, len(body) < len(v), v
	return nil
}

var units = map[string]time.Duration{
	"second": time.Second, "minute": time.Minute, "hour": time.Hour, "day": 24 * time.Hour,
}

func (p *cfgParser) rateLimit(n ast.Node) (window.Limit, error) {
	fs, err := p.fields(n, "rate_limit", "requests", "window", "unit", "requests_per_unit")
	if err != nil {
		return window.Limit{}, err
	}
	var l window.Limit
	var reqN, winN, unitN, rpuN ast.Node
	for _, f := range fs {
		switch f.key {
		case "requests":
			reqN = f.value
		case "window":
			winN = f.value
		case "unit":
			unitN = f.value
		case "requests_per_unit":
			rpuN = f.value
		}
	}
	switch {
	case (reqN != nil || winN != nil) && (unitN != nil || rpuN != nil):
		return l, p.errf(n, "rate_limit mixes {requests, window} with {unit, requests_per_unit}: use one form")
	case reqN != nil || winN != nil:
		if reqN == nil {
			return l, p.errf(n, "rate_limit needs requests")
		}
		if winN == nil {
			return l, p.errf(n, "rate_limit needs window")
		}
		if l.Requests, err = p.integer(reqN, "requests"); err != nil {
			return l, err
		}
		if l.Window, err = p.duration(winN, "window"); err != nil {
			return l, err
		}
	case unitN != nil || rpuN != nil:
		if unitN == nil {
			return l, p.errf(n, "rate_limit needs unit")
		}
		if rpuN == nil {
			return l, p.errf(n, "rate_limit needs requests_per_unit")
		}
		if l.Requests, err = p.integer(rpuN, "requests_per_unit"); err != nil {
			return l, err
		}
		u, err := p.str(unitN, "unit")
		if err != nil {
			return l, err
		}
		d, ok := units[u]
		if !ok {
			return l, p.errf(unitN, "unit %q must be second, minute, hour or day", u)
		}
		l.Window, winN = d, unitN
	default:
		return l, p.errf(n, "rate_limit needs requests and window, such as {requests: 5, window: 1s}")
	}
	if l.Requests < 1 {
		return l, p.errf(firstNonNil(reqN, rpuN), "the limit must allow at least 1 request, not %d", l.Requests)
	}
	if l.Requests > window.MaxRequests {
		return l, p.errf(firstNonNil(reqN, rpuN), "the limit allows at most %d requests per window, not %d", window.MaxRequests, l.Requests)
	}
	if err := l.Validate(); err != nil {
		return l, p.errf(winN, "%s", err.Error())
	}
	return l, nil
}

func firstNonNil(ns ...ast.Node) ast.Node {
	for _, n := range ns {
		if n != nil {
			return n
		}
	}
	return nil
}

func (p *cfgParser) ban(n ast.Node) (*window.Ban, error) {
	fs, err := p.fields(n, "ban", "threshold", "window", "duration")
	if err != nil {
		return nil, err
	}
	var b window.Ban
	var thrN, winN, durN ast.Node
	for _, f := range fs {
		switch f.key {
		case "threshold":
			thrN = f.value
			if b.Threshold, err = p.integer(f.value, "threshold"); err != nil {
				return nil, err
			}
		case "window":
			winN = f.value
			if b.Window, err = p.duration(f.value, "ban window"); err != nil {
				return nil, err
			}
		case "duration":
			durN = f.value
			if b.Duration, err = p.duration(f.value, "ban duration"); err != nil {
				return nil, err
			}
		}
	}
	if durN == nil {
		return nil, p.errf(n, "ban needs duration (0 disables the penalty box)")
	}
	if b.Duration < 0 {
		return nil, p.errf(durN, "ban duration %s must not be negative", b.Duration)
	}
	if b.Duration == 0 {
		return &window.Ban{}, nil
	}
	if thrN == nil || winN == nil {
		return nil, p.errf(n, "ban needs threshold, window and duration")
	}
	if b.Threshold < 1 {
		return nil, p.errf(thrN, "ban threshold must be at least 1, not %d", b.Threshold)
	}
	if b.Window <= 0 {
		return nil, p.errf(winN, "ban window must be positive, not %s", b.Window)
	}
	return &b, nil
}
