package descriptors

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/goccy/go-yaml/ast"

	"github.com/flashgate/flashgate/enforce"
	"github.com/flashgate/flashgate/window"
)

// ReservedRulePrefix begins no rule name of a descriptors file: the
// ratelimit service keys a domain's windows under rls.<domain>.
const ReservedRulePrefix = "rls."

// This file compiles a descriptors file's YAML tree to a validated Config.

// cfgParser compiles one descriptors file.
type cfgParser struct {
	strictYAML
	cfg    *Config
	srcIdx map[string]int
	// srcNodes holds where each declared source is, to report unused ones.
	srcNodes map[string]ast.Node
	used     map[string]bool
	names    map[string]*Rule
}

// compile builds the Config of body. An error that leaves the rest
// readable is added to y.errs and compiling goes on, so one run reports
// every error; only y.errs.result() tells whether the Config is valid.
func compile(y strictYAML, body ast.Node) (*Config, error) {
	p := &cfgParser{
		strictYAML: y,
		cfg:        &Config{Name: y.file},
		srcIdx:     map[string]int{},
		srcNodes:   map[string]ast.Node{},
		used:       map[string]bool{},
		names:      map[string]*Rule{},
	}
	if err := p.top(body); err != nil {
		return nil, err
	}
	return p.cfg, nil
}

// note adds err, if any, to the file's errors and reports whether there
// was one.
func (p *cfgParser) note(err error) bool {
	if err != nil {
		p.errs.add(err)
	}
	return err != nil
}

// at places err from one of enforce's checks at node n; nil stays nil.
func (p *cfgParser) at(n ast.Node, err error) error {
	if err == nil {
		return nil
	}
	return p.errf(n, "%s", err)
}

// top compiles the document: domain, sources, client_ip, path_case, descriptors.
func (p *cfgParser) top(body ast.Node) error {
	fs, err := p.fields(body, "the descriptors file", "domain", "sources", "client_ip", "path_case", "descriptors")
	if err != nil {
		return err
	}
	var domainSet bool
	var descs *field
	for i := range fs {
		f := &fs[i]
		switch f.key {
		case "domain":
			domainSet = true
			d, err := p.str(f.value, "domain")
			switch {
			case p.note(err):
			case d == "":
				p.note(p.errf(f.value, "domain is empty"))
			case len(d) > MaxRuleName || !window.SafeName(d):
				p.note(p.errf(f.value, "domain %q must be 1 to %d characters of A-Z a-z 0-9 . _ -", d, MaxRuleName))
			default:
				p.cfg.Domain = d
			}
		case "sources":
			p.note(p.sources(f.value))
		case "client_ip":
			p.note(p.clientIP(f.value))
		case "path_case":
			p.note(p.pathCase(f.value))
		case "descriptors":
			descs = f
		}
	}
	if !domainSet {
		p.note(p.missing(body, "domain is missing: name the rules' domain, such as domain: flashsale"))
	}
	if descs == nil {
		return p.missing(body, "descriptors is missing: the file declares no rules")
	}
	if err := p.descriptors(descs.value, nil, inherited{}, 1); err != nil {
		return err
	}
	if len(p.errs.errs) > 0 {
		return nil // the rules and sources in use are not all known
	}
	if len(p.cfg.Rules) == 0 {
		return p.errf(descs.keyN, "no descriptor has a rate_limit: the file declares no rules")
	}
	// Sources declared but never used are likely typos.
	for _, k := range slices.Sorted(maps.Keys(p.srcNodes)) {
		if !p.used[k] {
			p.note(p.errf(p.srcNodes[k], "source %q is not used by any descriptor", k))
		}
	}
	return nil
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

// defaultSources are the descriptor keys that need no entry under sources.
var defaultSources = map[string]Source{
	"remote_address": {Kind: SourceRemoteAddress},
	"path":           {Kind: SourcePath},
	"method":         {Kind: SourceMethod},
	"authority":      {Kind: SourceAuthority},
	"host":           {Kind: SourceAuthority},
}

func (p *cfgParser) sources(n ast.Node) error {
	fs, err := p.fields(n, "sources")
	if err != nil {
		return err
	}
	for _, f := range fs {
		if f.key == "" || !window.SafeName(f.key) {
			p.note(p.errf(f.keyN, "descriptor key %q must be characters of A-Z a-z 0-9 . _ -", f.key))
			continue
		}
		// A bad source is still declared, so its descriptors are checked.
		src, err := p.source(f.key, f.value)
		p.note(err)
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
		return Source{}, p.missing(n, "%s must have exactly one of %s", what, sourceKindList)
	}
	f := fs[0]
	kind, ok := sourceKinds[f.key]
	if !ok {
		return Source{}, p.errf(f.keyN, "unknown source %q; known sources: %s", f.key, sourceKindList)
	}
	src := Source{Kind: kind}
	switch kind {
	case SourceHeader:
		name, at, err := p.onlyOption(f, "header_name")
		if err != nil {
			return Source{}, err
		}
		if !enforce.ValidHeaderName(name) {
			return Source{}, p.errf(at, "header_name %q is not a valid HTTP header name", name)
		}
		src.Name = strings.ToLower(name)
	case SourceContextExtension:
		name, at, err := p.onlyOption(f, "key")
		if err != nil {
			return Source{}, err
		}
		if name == "" {
			return Source{}, p.errf(at, "context_extension key is empty")
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

// onlyOption reads source f's one required string option opt.
func (p *cfgParser) onlyOption(f field, opt string) (string, ast.Node, error) {
	opts, err := p.fields(f.value, f.key, opt)
	if err != nil {
		return "", nil, err
	}
	if len(opts) == 0 {
		return "", nil, p.missing(f.value, "%s needs %s", f.key, opt)
	}
	v, err := p.str(opts[0].value, opt)
	return v, opts[0].value, err
}

// inherited are the settings a descriptor passes to nested ones.
type inherited struct {
	shadow    bool
	failure   enforce.FailureMode
	onMissing OnMissing
	ban       *window.Ban
	// localShare is the local_share in force, written at localShareN.
	localShare  int
	localShareN ast.Node
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
		p.note(p.descriptor(item, path, inh, depth))
	}
	return nil
}

var descriptorKeys = []string{"key", "value", "name", "rate_limit", "shadow_mode", "failure_mode", "local_share", "ban", "on_missing", "lease", "descriptors"}

func (p *cfgParser) descriptor(n ast.Node, path []Match, inh inherited, depth int) error {
	fs, err := p.fields(n, "a descriptor", descriptorKeys...)
	if err != nil {
		return err
	}
	if len(fs) == 0 {
		return p.missing(n, "a descriptor needs a key")
	}
	get := func(k string) *field {
		for i := range fs {
			if fs[i].key == k {
				return &fs[i]
			}
		}
		return nil
	}
	// A bad key or value is reported, the rest still checked, and the
	// rule left out.
	var m Match
	matched := false
	kf := get("key")
	if kf == nil {
		p.note(p.missing(n, "a descriptor needs a key"))
	} else {
		m, matched = p.match(kf, path)
	}
	if vf := get("value"); vf != nil {
		v, err := p.str(vf.value, "value")
		if p.note(err) || p.note(p.pattern(vf.value, v, &m)) {
			matched = false
		}
	}
	path = append(path[:len(path):len(path)], m)

	inh = p.settings(get, inh)

	rl, nested := get("rate_limit"), get("descriptors")
	nf := get("name")
	if rl == nil && nested == nil {
		if kf == nil {
			return errReported // a descriptor of no key, said above
		}
		return p.missing(n, "descriptor %q has neither rate_limit nor nested descriptors", m.Key)
	}
	if nf != nil && rl == nil {
		p.note(p.errf(nf.keyN, "name is set on a descriptor without rate_limit"))
	}
	lf := get("lease")
	if lf != nil && rl == nil {
		p.note(p.errf(lf.keyN, "lease is set on a descriptor without rate_limit"))
	}
	if rl != nil {
		p.note(p.rule(n, kf, nf, rl, lf, path, inh, matched))
	}
	if nested != nil {
		if err := p.descriptors(nested.value, path, inh, depth+1); err != nil {
			return err
		}
	}
	return nil
}

// match reads descriptor key kf below path; false when it reported an
// error.
func (p *cfgParser) match(kf *field, path []Match) (m Match, ok bool) {
	key, err := p.str(kf.value, "key")
	if p.note(err) {
		return m, false
	}
	if key == "" {
		p.note(p.errf(kf.value, "key is empty"))
		return m, false
	}
	m.Key, ok = key, true
	if i, declared := p.srcIdx[key]; declared {
		m.src, m.Source = i, p.cfg.sources[i]
		p.used[key] = true
	} else if src, builtin := defaultSources[key]; !builtin {
		ok = !p.note(p.errf(kf.value, "descriptor key %q has no source: declare it under sources (for example %s: {request_headers: {header_name: x-%s}})", key, key, key))
	} else if len(p.cfg.sources) == MaxSources {
		ok = !p.note(p.errf(kf.value, "more than %d sources", MaxSources))
	} else {
		p.srcIdx[key] = len(p.cfg.sources)
		p.cfg.sources = append(p.cfg.sources, src)
		p.cfg.sourceKeys = append(p.cfg.sourceKeys, key)
		m.src, m.Source = p.srcIdx[key], src
	}
	for _, earlier := range path {
		if earlier.Key == key {
			ok = !p.note(p.errf(kf.value, "descriptor key %q is already used by an enclosing descriptor", key))
		}
	}
	return m, ok
}

// settings reads a descriptor's inheritable settings over inh; a bad one
// is reported and the inherited value kept.
func (p *cfgParser) settings(get func(string) *field, inh inherited) inherited {
	if f := get("shadow_mode"); f != nil {
		b, err := p.boolean(f.value, "shadow_mode")
		if !p.note(err) {
			inh.shadow = b
		}
	}
	if f := get("failure_mode"); f != nil {
		s, err := p.str(f.value, "failure_mode")
		if !p.note(err) {
			if m, err := enforce.CheckFailureMode(s); err != nil {
				p.note(p.at(f.value, err))
			} else {
				inh.failure = m
			}
		}
	}
	if f := get("local_share"); f != nil {
		v, err := p.integer(f.value, "local_share")
		switch {
		case p.note(err):
		case p.note(p.at(f.value, enforce.CheckLocalShare(int64(v)))):
		default:
			inh.localShare, inh.localShareN = v, f.value
		}
	}
	if f := get("on_missing"); f != nil {
		s, err := p.str(f.value, "on_missing")
		if !p.note(err) {
			if m, ok := parseOnMissing(s); ok {
				inh.onMissing = m
			} else {
				p.note(p.errf(f.value, "on_missing %q must be skip or deny", s))
			}
		}
	}
	if f := get("ban"); f != nil {
		b, err := p.ban(f.value)
		if !p.note(err) {
			inh.ban = b
		}
	}
	return inh
}

// rule compiles descriptor n's rate_limit into a Rule at path and adds it
// to the config if matched. Every error is added to the file's errors.
func (p *cfgParser) rule(n ast.Node, kf, nf, rl, lf *field, path []Match, inh inherited, matched bool) error {
	limit, auto, limitErr := p.rateLimit(rl.value)
	p.note(limitErr)
	var lease time.Duration
	if lf != nil && limitErr == nil {
		if auto {
			// A leased window is an exact log (the reserving script's).
			limit.Buckets, auto = 0, false
		}
		var err error
		if lease, err = p.lease(lf.value, limit); p.note(err) {
			limitErr = errReported
		}
	}
	line, col := nodePos(n)
	r := &Rule{
		Limit: limit, AutoBuckets: auto, Match: path, Shadow: inh.shadow, FailureMode: inh.failure,
		LocalShare: inh.localShare, OnMissing: inh.onMissing, Ban: inh.ban, Line: line, Column: col,
		Lease: lease,
	}
	var at ast.Node = n
	if kf != nil {
		at = kf.value
	}
	switch {
	case nf != nil:
		name, err := p.str(nf.value, "name")
		if err != nil {
			return err
		}
		if name == "" || len(name) > MaxRuleName || !window.SafeName(name) {
			return p.errf(nf.value, "rule name %q must be 1 to %d characters of A-Z a-z 0-9 . _ -", name, MaxRuleName)
		}
		r.Name, at = name, nf.value
	case !matched:
		return errReported // no name to check
	default:
		r.Name = derivedName(path)
		if len(r.Name) > MaxRuleName {
			return p.errf(n, "the derived rule name %q is longer than %d characters: set name", r.Name, MaxRuleName)
		}
	}
	if strings.HasPrefix(r.Name, ReservedRulePrefix) {
		return p.errf(at, "rule name %q begins with %q, which is reserved for the ratelimit service's domains: set another name", r.Name, ReservedRulePrefix)
	}
	if prev, dup := p.names[r.Name]; dup {
		return p.errf(at, "rule name %q is already used by the rule on line %d", r.Name, prev.Line)
	}
	p.names[r.Name] = r
	if limitErr != nil || !matched {
		return errReported
	}
	if err := p.at(inh.localShareN, enforce.CheckShareFits(r.LocalShare, limit.Requests, r.Name)); err != nil {
		return err
	}
	r.finish()
	r.idx = len(p.cfg.Rules)
	p.cfg.Rules = append(p.cfg.Rules, r)
	return nil
}

// finish precomputes the variable key parts' count and, with none, the
// constant key.
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

// derivedName names a rule after its path: "path.api_coupon.uid".
func derivedName(path []Match) string {
	var b strings.Builder
	for i, m := range path {
		if i > 0 {
			b.WriteByte('.')
		}
		b.WriteString(m.Key)
		if m.HasValue {
			v := sanitize(strings.TrimSuffix(m.pattern, "*"))
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
	if m.Source.Kind == SourcePath {
		return p.pathPattern(n, body, m)
	}
	return nil
}

var units = map[string]time.Duration{
	"second": time.Second, "minute": time.Minute, "hour": time.Hour, "day": 24 * time.Hour,
}

// rateLimit compiles a rate_limit; auto: its bucket count was chosen by
// size.
func (p *cfgParser) rateLimit(n ast.Node) (_ window.Limit, auto bool, err error) {
	fs, err := p.fields(n, "rate_limit", "requests", "window", "unit", "requests_per_unit", "algorithm", "buckets")
	if err != nil {
		return window.Limit{}, false, err
	}
	var reqN, winN, unitN, rpuN, algN, bucketsN ast.Node
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
		case "algorithm":
			algN = f.value
		case "buckets":
			bucketsN = f.value
		}
	}
	l, sizeErr := p.rateLimitSize(n, reqN, winN, unitN, rpuN)
	if sizeErr != nil {
		// Their checks do not depend on the size.
		p.note(sizeErr)
		_, _, err := p.algorithm(n, window.Limit{Requests: 1, Window: time.Second}, algN, bucketsN)
		p.note(err)
		return l, false, errReported
	}
	return p.algorithm(n, l, algN, bucketsN)
}

// algorithm applies rate_limit n's algorithm and buckets to l.
func (p *cfgParser) algorithm(n ast.Node, l window.Limit, algN, bucketsN ast.Node) (_ window.Limit, auto bool, err error) {
	var alg *string
	var buckets *int64
	var bad bool
	if algN != nil {
		s, err := p.str(algN, "algorithm")
		bad = p.note(err)
		alg = &s
	}
	if bucketsN != nil {
		v, err := p.integer(bucketsN, "buckets")
		bad = p.note(err) || bad
		buckets = ptr(int64(v))
	}
	if bad {
		return l, false, errReported
	}
	l, auto, err = enforce.CheckAlgorithm(l, alg, buckets)
	if err != nil {
		return l, false, p.fieldErr(n, map[string]ast.Node{"algorithm": algN, "buckets": bucketsN}, err)
	}
	return l, auto, nil
}

// rateLimitSize reads rate_limit n's requests and window (or unit and
// requests_per_unit).
func (p *cfgParser) rateLimitSize(n, reqN, winN, unitN, rpuN ast.Node) (window.Limit, error) {
	var l window.Limit
	field, reqAt := "requests", reqN
	switch {
	case (reqN != nil || winN != nil) && (unitN != nil || rpuN != nil):
		return l, p.errf(n, "rate_limit mixes {requests, window} with {unit, requests_per_unit}: use one form")
	case reqN != nil || winN != nil:
		if reqN == nil {
			return l, p.missing(n, "rate_limit needs requests")
		}
		if winN == nil {
			return l, p.missing(n, "rate_limit needs window")
		}
	case unitN != nil || rpuN != nil:
		if unitN == nil {
			return l, p.missing(n, "rate_limit needs unit")
		}
		if rpuN == nil {
			return l, p.missing(n, "rate_limit needs requests_per_unit")
		}
		field, reqAt = "requests_per_unit", rpuN
	default:
		return l, p.missing(n, "rate_limit needs requests and window, such as {requests: 5, window: 1s}")
	}
	// requests and window are each checked, whatever the other's error.
	var reqErr, winErr error
	if l.Requests, reqErr = p.integer(reqAt, field); reqErr == nil {
		reqErr = p.at(reqAt, enforce.CheckRequests(field, int64(l.Requests)))
	}
	if winN != nil {
		l.Window, winErr = p.duration(winN, "window")
	} else {
		winN = unitN
		u, err := p.str(unitN, "unit")
		d, ok := units[u]
		switch {
		case err != nil:
			winErr = err
		case !ok:
			winErr = p.errf(unitN, "unit %q must be second, minute, hour or day", u)
		default:
			l.Window = d
		}
	}
	if winErr == nil {
		if err := (window.Limit{Requests: 1, Window: l.Window}).Validate(); err != nil {
			winErr = p.errf(winN, "%s", err.Error())
		}
	}
	switch {
	case reqErr != nil && winErr != nil:
		p.note(reqErr)
		p.note(winErr)
		return l, errReported
	case reqErr != nil:
		return l, reqErr
	}
	return l, winErr
}

// ban reads ban block n; "ban: {}" asks for the server's penalty box, an
// empty "ban:" is refused.
func (p *cfgParser) ban(n ast.Node) (*window.Ban, error) {
	if _, ok := n.(*ast.NullNode); ok {
		return nil, p.errf(n, "ban is empty: write ban: {} for the penalty box of serve's --ban-* flags, or set threshold, window, duration")
	}
	fs, err := p.fields(n, "ban", "threshold", "window", "duration")
	if err != nil {
		return nil, err
	}
	var b enforce.BanFields
	at := map[string]ast.Node{}
	for _, f := range fs {
		at[f.key] = f.value
		switch f.key {
		case "threshold":
			v, err := p.integer(f.value, "threshold")
			if err != nil {
				return nil, err
			}
			b.Threshold = ptr(int64(v))
		case "window":
			d, err := p.duration(f.value, "ban window")
			if err != nil {
				return nil, err
			}
			b.Window = &d
		case "duration":
			d, err := p.duration(f.value, "ban duration")
			if err != nil {
				return nil, err
			}
			b.Duration = &d
		}
	}
	ban, err := enforce.CheckBan(b)
	if err != nil {
		return nil, p.fieldErr(n, at, err)
	}
	return ban, nil
}

func ptr[T any](v T) *T { return &v }

// lease reads a rule's lease for limit.
func (p *cfgParser) lease(n ast.Node, limit window.Limit) (time.Duration, error) {
	fs, err := p.fields(n, "lease", "for")
	if err != nil {
		return 0, err
	}
	if len(fs) == 0 {
		return 0, p.missing(n, "lease needs for (lease: {for: 50ms})")
	}
	d, err := p.duration(fs[0].value, "lease for")
	if err != nil {
		return 0, err
	}
	if err := enforce.CheckLease(d, limit); err != nil {
		return 0, p.fieldErr(n, map[string]ast.Node{"for": fs[0].value}, err)
	}
	return d, nil
}

// fieldErr places err from enforce's checks of block n at the field it
// names, or at n.
func (p *cfgParser) fieldErr(n ast.Node, at map[string]ast.Node, err error) error {
	var fe *enforce.FieldError
	if errors.As(err, &fe) && at[fe.Field] != nil {
		return p.errf(at[fe.Field], "%s", fe.Msg)
	}
	return p.missing(n, "%s", err)
}
