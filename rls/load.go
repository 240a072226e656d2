package rls

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"time"

	"github.com/goccy/go-yaml"
	"github.com/goccy/go-yaml/ast"

	"github.com/flashgate/flashgate/enforce"
	"github.com/flashgate/flashgate/internal/configfile"
	"github.com/flashgate/flashgate/internal/yamlguard"
	"github.com/flashgate/flashgate/window"
)

// ConfigError is an error in one config file, "FILE:LINE:COL: message";
// the descriptors file's loader reports the same type.
type ConfigError = configfile.Error

// File is one config file's name (as errors name it) and content.
type File struct {
	Name string
	Data []byte
}

// LoadDir loads a ratelimit config directory: dir/config/*.yaml when dir
// holds a config subdirectory (ratelimit's runtime layout), else dir/*.yaml
// and dir/*.yml; dot files are skipped. Each file is one domain. Content
// errors are *ConfigError or ConfigErrors.
func LoadDir(dir string) (*Config, error) {
	files, err := ReadDir(dir)
	if err != nil {
		return nil, err
	}
	c, err := ParseFiles(files)
	if err != nil {
		return nil, err
	}
	c.Dir = dir
	return c, nil
}

// ConfigDir returns dir/config if that is a directory, else dir.
func ConfigDir(dir string) string {
	sub := filepath.Join(dir, "config")
	if fi, err := os.Stat(sub); err == nil && fi.IsDir() {
		return sub
	}
	return dir
}

// ReadDir reads the config files of dir (see LoadDir), sorted by name.
func ReadDir(dir string) ([]File, error) {
	from := ConfigDir(dir)
	ents, err := os.ReadDir(from)
	if err != nil {
		return nil, fmt.Errorf("read ratelimit config directory: %w", err)
	}
	var files []File
	for _, e := range ents {
		name := e.Name()
		if strings.HasPrefix(name, ".") || !(strings.HasSuffix(name, ".yaml") || strings.HasSuffix(name, ".yml")) {
			continue
		}
		path := filepath.Join(from, name)
		fi, err := os.Stat(path) // follows symlinks
		if err != nil {
			return nil, fmt.Errorf("read ratelimit config: %w", err)
		}
		if fi.IsDir() {
			return nil, fmt.Errorf("read ratelimit config: %s is a directory, not a config file", path)
		}
		if len(files) == MaxFiles {
			return nil, fmt.Errorf("ratelimit config directory %s: more than %d files", from, MaxFiles)
		}
		data, err := readFile(path)
		if err != nil {
			return nil, err
		}
		files = append(files, File{Name: path, Data: data})
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("ratelimit config directory %s holds no *.yaml or *.yml file", from)
	}
	return files, nil
}

// readFile reads at most MaxFileSize+1 bytes of path, so ParseFiles can
// tell a file that is too large.
func readFile(path string) ([]byte, error) {
	return configfile.Read(path, MaxFileSize, "ratelimit config")
}

// MaxErrors is the most errors ParseFiles lists; the others are counted.
const MaxErrors = configfile.MaxErrors

// ConfigErrors is every error of the config files in file order, the
// first MaxErrors listed; Unwrap gives each *ConfigError.
type ConfigErrors = configfile.Errors

// ParseFiles parses config files, one domain each, and refuses what
// ratelimit refuses plus flashgate's bounds (window.MaxRequests,
// window.MaxWindow, yamlguard's). Errors are *ConfigError, or ConfigErrors
// when there are several.
func ParseFiles(files []File) (*Config, error) {
	c := &Config{domains: map[string]*Domain{}, sum: sumOf(files)}
	var errs []*ConfigError
	for _, f := range files {
		d, ferrs := parseFile(f)
		if len(ferrs) > 0 {
			errs = append(errs, ferrs...)
			continue
		}
		if prev, ok := c.domains[d.Name]; ok {
			errs = append(errs, &ConfigError{File: f.Name, Line: 1, Column: 1,
				Msg: fmt.Sprintf("duplicate domain %q (also in %s)", d.Name, prev.File)})
			continue
		}
		c.domains[d.Name] = d
	}
	if err := configfile.Join(errs); err != nil {
		return nil, err
	}
	return c, nil
}

// sumOf hashes the files' names and contents.
func sumOf(files []File) [32]byte {
	h := sha256.New()
	for _, f := range files {
		fmt.Fprintf(h, "%d:%s%d:", len(f.Name), f.Name, len(f.Data))
		h.Write(f.Data)
	}
	var sum [32]byte
	copy(sum[:], h.Sum(nil))
	return sum
}

// The YAML schema, decoded strictly (unknown keys are errors).
type (
	yamlFile struct {
		Domain      string           `yaml:"domain"`
		Descriptors []yamlDescriptor `yaml:"descriptors"`
	}
	yamlDescriptor struct {
		Key            string           `yaml:"key"`
		Value          string           `yaml:"value"`
		RateLimit      *yamlRateLimit   `yaml:"rate_limit"`
		Descriptors    []yamlDescriptor `yaml:"descriptors"`
		ShadowMode     bool             `yaml:"shadow_mode"`
		DetailedMetric bool             `yaml:"detailed_metric"`
		ValueToMetric  bool             `yaml:"value_to_metric"`
		ShareThreshold bool             `yaml:"share_threshold"`
		QuotaMode      bool             `yaml:"quota_mode"`
		// Metadata is ratelimit's free-form metadata: accepted, ignored.
		Metadata any `yaml:"metadata"`
		// flashgate's additions
		FailureMode *string    `yaml:"failure_mode"`
		LocalShare  *int64     `yaml:"local_share"`
		Ban         *yamlBan   `yaml:"ban"`
		Lease       *yamlLease `yaml:"lease"`
	}
	yamlLease struct {
		For *string `yaml:"for"`
	}
	yamlBan struct {
		Threshold *int64  `yaml:"threshold"`
		Window    *string `yaml:"window"`
		Duration  *string `yaml:"duration"`
	}
	yamlRateLimit struct {
		Unit            string        `yaml:"unit"`
		RequestsPerUnit *uint32       `yaml:"requests_per_unit"`
		UnitMultiplier  *uint32       `yaml:"unit_multiplier"`
		Unlimited       bool          `yaml:"unlimited"`
		Name            string        `yaml:"name"`
		Replaces        []yamlReplace `yaml:"replaces"`
		Requests        *int64        `yaml:"requests"`
		Window          *string       `yaml:"window"`
		// flashgate's window algorithm and bucket count.
		Algorithm *string `yaml:"algorithm"`
		Buckets   *int64  `yaml:"buckets"`
	}
	yamlReplace struct {
		Name string `yaml:"name"`
	}
)

// fileParser turns one file into a Domain, with positioned errors.
type fileParser struct {
	name string
	file *ast.File
	errs *[]*ConfigError
}

// errReported stands for errors a check already recorded.
var errReported = errors.New("the errors are reported")

// note records err, unless errReported, and reports whether there was one.
func (p fileParser) note(err error) bool {
	if err == nil {
		return false
	}
	if errors.Is(err, errReported) {
		return true
	}
	var ce *ConfigError
	if !errors.As(err, &ce) {
		ce = &ConfigError{File: p.name, Msg: err.Error()}
	}
	*p.errs = append(*p.errs, ce)
	return true
}

// errAt returns a *ConfigError at YAML path: a field's key, else its
// mapping's or the file's first key.
func (p fileParser) errAt(path string, format string, args ...any) error {
	line, col := p.pos(path)
	return &ConfigError{File: p.name, Line: line, Column: col, Msg: fmt.Sprintf(format, args...)}
}

// pos resolves a YAML path as errAt describes; 1:1 when it cannot.
func (p fileParser) pos(path string) (int, int) {
	f := p.file
	if f == nil {
		return 1, 1
	}
	parent, field := path, ""
	if i := strings.LastIndexByte(path, '.'); i > 0 && !strings.HasSuffix(path, "]") {
		parent, field = path[:i], path[i+1:]
	}
	yp, err := yaml.PathString(parent)
	if err != nil {
		return 1, 1
	}
	n, err := yp.FilterFile(f)
	if err != nil || n == nil {
		return 1, 1
	}
	if field != "" {
		if m, ok := n.(*ast.MappingNode); ok {
			for _, v := range m.Values {
				if v.Key.GetToken().Value == field {
					return tokenPos(v.Key)
				}
			}
		}
	}
	if m, ok := n.(*ast.MappingNode); ok && len(m.Values) > 0 {
		return tokenPos(m.Values[0].Key)
	}
	return tokenPos(n)
}

func tokenPos(n ast.Node) (int, int) {
	if tk := n.GetToken(); tk != nil && tk.Position != nil {
		return tk.Position.Line, tk.Position.Column
	}
	return 1, 1
}

// parseFile parses and checks one file; its errors come in file order.
func parseFile(f File) (*Domain, []*ConfigError) {
	one := func(line, col int, format string, args ...any) (*Domain, []*ConfigError) {
		return nil, []*ConfigError{{File: f.Name, Line: line, Column: col, Msg: fmt.Sprintf(format, args...)}}
	}
	if len(f.Data) > MaxFileSize {
		return one(0, 0, "the file is larger than %d bytes", MaxFileSize)
	}
	file, err := yamlguard.Parse(f.Data)
	var ge *yamlguard.Error
	if errors.As(err, &ge) {
		return one(ge.Line, ge.Column, "%s", ge.Msg)
	}
	if err == nil {
		if ce := checkExpansion(f.Name, file); ce != nil {
			return nil, []*ConfigError{ce}
		}
	}
	var errs []*ConfigError
	p := fileParser{name: f.Name, file: file, errs: &errs}
	topRefused := false
	if file != nil {
		for _, doc := range file.Docs {
			topRefused = checkKeys(p, doc.Body, reflect.TypeFor[yamlFile]()) || topRefused
		}
	}
	// Unknown keys are reported above, in file order; the decoder's own
	// check backs it up.
	var opts []yaml.DecodeOption
	if len(errs) == 0 {
		opts = append(opts, yaml.Strict())
	}
	var y yamlFile
	dropped, ok := p.decode(f.Data, &y, opts)
	if !ok {
		return nil, sorted(errs)
	}
	checked := len(errs)
	if y.Domain == "" && !topRefused { // else likely the refused key
		p.note(p.errAt("$", "config file cannot have an empty domain"))
	}
	d := &Domain{Name: y.Domain, File: f.Name, keyRule: KeyNamespace + y.Domain, root: *newNode()}
	p.note(p.descriptors(d, &d.root, "$.descriptors", "", y.Descriptors, 1, inherited{}))
	// A value nulled for its wrong type likely made its mapping's check
	// fail: such errors are left out.
	kept := errs[:checked]
	for _, e := range errs[checked:] {
		if !dropped[[2]int{e.Line, e.Column}] {
			kept = append(kept, e)
		}
	}
	errs = kept
	if len(errs) > 0 {
		return nil, sorted(errs)
	}
	return d, nil
}

// decode decodes data into y. A value of the wrong type is recorded,
// nulled in the syntax tree and the tree decoded again, so each is
// reported; dropped holds the positions where the nulled fields' checks
// report. Any other error, or one past MaxErrors, stops it.
func (p fileParser) decode(data []byte, y *yamlFile, opts []yaml.DecodeOption) (dropped map[[2]int]bool, ok bool) {
	err := yaml.UnmarshalWithOptions(data, y, opts...)
	for tries := 0; ; tries++ {
		if err == nil {
			return dropped, true
		}
		var ye yaml.Error
		if !errors.As(err, &ye) || ye.GetToken() == nil || ye.GetToken().Position == nil {
			p.note(&ConfigError{File: p.name, Msg: fmt.Sprintf("invalid YAML: %v", err)})
			return nil, false
		}
		pos := ye.GetToken().Position
		p.note(&ConfigError{File: p.name, Line: pos.Line, Column: pos.Column, Msg: ye.GetMessage()})
		var te *yaml.TypeError
		var oe *yaml.OverflowError
		var ne *yaml.UnexpectedNodeTypeError
		if !errors.As(err, &te) && !errors.As(err, &oe) && !errors.As(err, &ne) || p.file == nil || len(p.file.Docs) == 0 || tries == MaxErrors {
			return nil, false
		}
		body := p.file.Docs[0].Body
		at := [2]int{pos.Line, pos.Column}
		key, first := nullValue(body, at)
		if key == nil {
			return nil, false
		}
		if dropped == nil {
			dropped = map[[2]int]bool{}
		}
		k1, k2 := tokenPos(key)
		f1, f2 := tokenPos(first)
		dropped[[2]int{k1, k2}], dropped[[2]int{f1, f2}] = true, true
		*y = yamlFile{}
		err = yaml.NodeToValue(body, y, opts...)
	}
}

// nullValue nulls the value of n's mapping entry starting at pos and
// returns the entry's key and its mapping's first key; nil if none.
func nullValue(n ast.Node, pos [2]int) (key, first ast.Node) {
	visit := func(m *ast.MappingValueNode, firstKey ast.Node) (ast.Node, ast.Node) {
		if l, c := tokenPos(m.Value); l == pos[0] && c == pos[1] {
			m.Value = ast.Null(m.Value.GetToken())
			return m.Key, firstKey
		}
		return nullValue(m.Value, pos)
	}
	switch v := n.(type) {
	case *ast.MappingNode:
		for _, m := range v.Values {
			if key, first := visit(m, v.Values[0].Key); key != nil {
				return key, first
			}
		}
	case *ast.MappingValueNode:
		return visit(v, v.Key)
	case *ast.SequenceNode:
		for _, item := range v.Values {
			if key, first := nullValue(item, pos); key != nil {
				return key, first
			}
		}
	case *ast.AnchorNode:
		return nullValue(v.Value, pos)
	case *ast.TagNode:
		return nullValue(v.Value, pos)
	}
	return nil, nil
}

// checkKeys records, in file order, every key of n that is not a field of
// t or is not a word (the decoder would skip it in silence), and reports
// whether a key of n itself was refused.
func checkKeys(p fileParser, n ast.Node, t reflect.Type) (refused bool) {
	for t.Kind() == reflect.Pointer || t.Kind() == reflect.Slice {
		if t.Kind() == reflect.Slice {
			if seq, ok := unwrap(n).(*ast.SequenceNode); ok {
				for _, v := range seq.Values {
					checkKeys(p, v, t.Elem())
				}
			}
			return false
		}
		t = t.Elem()
	}
	if t.Kind() != reflect.Struct {
		return false
	}
	var entries []*ast.MappingValueNode
	switch m := unwrap(n).(type) {
	case *ast.MappingNode:
		entries = m.Values
	case *ast.MappingValueNode:
		entries = []*ast.MappingValueNode{m}
	default:
		return false // not a mapping: the decoder says so
	}
	var known []string
	fields := map[string]reflect.Type{}
	for i := range t.NumField() {
		name, _, _ := strings.Cut(t.Field(i).Tag.Get("yaml"), ",")
		known = append(known, name)
		fields[name] = t.Field(i).Type
	}
	for _, e := range entries {
		if _, merge := e.Key.(*ast.MergeKeyNode); merge {
			continue
		}
		line, col := tokenPos(e.Key)
		key, ok := unwrap(e.Key).(*ast.StringNode)
		if !ok {
			refused = p.note(&ConfigError{File: p.name, Line: line, Column: col,
				Msg: fmt.Sprintf("key %s is %s, not a field name; known fields: %s", e.Key.GetToken().Value, keyKind(e.Key), strings.Join(known, ", "))})
			continue
		}
		ft, ok := fields[key.Value]
		if !ok {
			refused = p.note(&ConfigError{File: p.name, Line: line, Column: col,
				Msg: fmt.Sprintf("unknown field %q; known fields: %s", key.Value, strings.Join(known, ", "))})
			continue
		}
		checkKeys(p, e.Value, ft)
	}
	return refused
}

// keyKind names what a key that is not a string is, for errors.
func keyKind(n ast.Node) string {
	switch unwrap(n).(type) {
	case *ast.IntegerNode, *ast.FloatNode, *ast.InfinityNode, *ast.NanNode:
		return "a number"
	case *ast.BoolNode:
		return "a boolean"
	case *ast.NullNode:
		return "null"
	}
	return "not a string"
}

// unwrap returns the node an anchor or tag stands for; an alias is nil.
func unwrap(n ast.Node) ast.Node {
	for {
		switch v := n.(type) {
		case *ast.AnchorNode:
			n = v.Value
		case *ast.TagNode:
			n = v.Value
		case *ast.AliasNode:
			return nil
		default:
			return n
		}
	}
}

// sorted sorts errs by position, each position once.
func sorted(errs []*ConfigError) []*ConfigError {
	sort.SliceStable(errs, func(i, j int) bool {
		a, b := errs[i], errs[j]
		return a.Line < b.Line || a.Line == b.Line && a.Column < b.Column
	})
	out := errs[:0]
	for _, e := range errs {
		if n := len(out); n > 0 && *out[n-1] == *e {
			continue
		}
		out = append(out, e)
	}
	return out
}

// inherited are flashgate's settings a descriptor passes to nested ones.
type inherited struct {
	failure enforce.FailureMode
	// localShare is the local_share in force, written at localShareAt.
	localShare   int
	localShareAt string
	ban          *window.Ban
}

// descriptors loads one level of descriptors into n.
func (p fileParser) descriptors(d *Domain, n *node, at, parent string, ds []yamlDescriptor, depth int, inh inherited) error {
	if depth > MaxDepth && len(ds) > 0 {
		return p.errAt(at, "descriptors are nested deeper than %d levels", MaxDepth)
	}
	for i := range ds {
		p.note(p.descriptor(d, n, fmt.Sprintf("%s[%d]", at, i), parent, &ds[i], depth, inh))
	}
	return nil
}

// descriptor loads descriptor y and its nested ones into n. Every error is
// recorded and the rest still checked.
func (p fileParser) descriptor(d *Domain, n *node, here, parent string, y *yamlDescriptor, depth int, inh inherited) error {
	ok := true
	if y.Key == "" {
		ok = !p.note(p.errAt(here, "descriptor has an empty key"))
	}
	seg := y.Key
	if y.Value != "" {
		seg += "_" + y.Value
	}
	path := seg
	if parent != "" {
		path = parent + "." + seg
	}
	child := newNode()
	var dup bool
	switch {
	case !ok:
	case y.Value == "":
		_, dup = n.keyOnly[y.Key]
		n.keyOnly[y.Key] = child
	case strings.Contains(y.Value, "*"):
		for _, w := range n.wild {
			dup = dup || w.key == y.Key && w.pattern == y.Value
		}
		n.wild = append(n.wild, &wildNode{key: y.Key, pattern: y.Value, parts: strings.Split(y.Value, "*"), n: child})
		child.share, child.pattern = y.ShareThreshold, y.Value
	default:
		_, dup = n.exact[y.Key+"\x00"+y.Value]
		n.exact[y.Key+"\x00"+y.Value] = child
	}
	if dup {
		p.note(p.errAt(here, "duplicate descriptor composite key %q", d.Name+"."+path))
	}
	if y.ShareThreshold && !strings.Contains(y.Value, "*") {
		p.note(p.errAt(here, "share_threshold applies to a wildcard value (with a *); %q has none", y.Value))
	}
	inh, err := p.additions(here, y, inh)
	p.note(err)
	if y.RateLimit != nil {
		p.note(p.placeRule(d, child, here, path, y, inh))
	} else if y.Lease != nil {
		p.note(p.errAt(here+".lease", "lease is set on a descriptor without rate_limit"))
	}
	return p.descriptors(d, child, here+".descriptors", path, y.Descriptors, depth+1, inh)
}

// placeRule checks descriptor y's rate_limit and makes it child's rule.
func (p fileParser) placeRule(d *Domain, child *node, here, path string, y *yamlDescriptor, inh inherited) error {
	r, err := p.rule(here+".rate_limit", y.RateLimit)
	if err != nil {
		return err
	}
	r.Path, r.Shadow, r.DetailedMetric, r.ValueToMetric = path, y.ShadowMode, y.DetailedMetric, y.ValueToMetric
	r.QuotaMode = y.QuotaMode
	r.FailureMode, r.LocalShare, r.Ban = inh.failure, inh.localShare, inh.ban
	if !r.Unlimited {
		if err := enforce.CheckShareFits(r.LocalShare, int(r.RequestsPerUnit), r.Label()); err != nil {
			return p.errAt(inh.localShareAt, "%s", err)
		}
	}
	if y.Lease != nil && !r.Unlimited {
		if err := p.lease(here+".lease", y.Lease, r); err != nil {
			return err
		}
	}
	if !r.Unlimited {
		r.policy = r.policyOf()
	}
	child.rule = r
	d.rules = append(d.rules, r)
	return nil
}

// additions reads failure_mode, local_share and ban of y over the ones it
// inherits; a bad one is recorded and the inherited value kept.
func (p fileParser) additions(here string, y *yamlDescriptor, inh inherited) (inherited, error) {
	var bad bool
	if y.FailureMode != nil {
		m, err := enforce.CheckFailureMode(*y.FailureMode)
		if err != nil {
			bad = p.note(p.errAt(here+".failure_mode", "%s", err))
		} else {
			inh.failure = m
		}
	}
	if y.LocalShare != nil {
		if err := enforce.CheckLocalShare(*y.LocalShare); err != nil {
			bad = p.note(p.errAt(here+".local_share", "%s", err))
		} else {
			inh.localShare, inh.localShareAt = int(*y.LocalShare), here+".local_share"
		}
	}
	if y.Ban != nil {
		b, err := p.ban(here+".ban", y.Ban)
		if err != nil {
			bad = p.note(err)
		} else {
			inh.ban = b
		}
	}
	if bad {
		return inh, errReported
	}
	return inh, nil
}

// ban reads a ban block; enforce.CheckBan checks it.
func (p fileParser) ban(at string, y *yamlBan) (*window.Ban, error) {
	b := enforce.BanFields{Threshold: y.Threshold}
	var err error
	if b.Duration, err = p.banDuration(at, "duration", y.Duration); err != nil {
		return nil, err
	}
	if b.Window, err = p.banDuration(at, "window", y.Window); err != nil {
		return nil, err
	}
	ban, err := enforce.CheckBan(b)
	if err != nil {
		return nil, p.fieldErr(at, err)
	}
	return ban, nil
}

// lease reads rule r's lease block; a leased window stays an exact log.
func (p fileParser) lease(at string, y *yamlLease, r *Rule) error {
	if y.For == nil {
		return p.errAt(at, "lease needs for (lease: {for: 50ms})")
	}
	d, err := time.ParseDuration(*y.For)
	if err != nil {
		return p.errAt(at+".for", "lease for %q is not a duration such as 50ms", *y.For)
	}
	if r.AutoBuckets {
		r.Buckets, r.AutoBuckets = 0, false
	}
	if err := enforce.CheckLease(d, window.Limit{Requests: int(r.RequestsPerUnit), Window: r.Window, Buckets: r.Buckets}); err != nil {
		return p.fieldErr(at, err)
	}
	r.Lease = d
	return nil
}

// banDuration parses ban field s at path at, nil when absent.
func (p fileParser) banDuration(at, field string, s *string) (*time.Duration, error) {
	if s == nil {
		return nil, nil
	}
	d, err := time.ParseDuration(*s)
	if err != nil {
		return nil, p.errAt(at+"."+field, "ban %s %q is not a duration such as 1s or 500ms", field, *s)
	}
	return &d, nil
}

// fieldErr places err from enforce's checks at the field it names.
func (p fileParser) fieldErr(at string, err error) error {
	var fe *enforce.FieldError
	if errors.As(err, &fe) && fe.Field != "" {
		return p.errAt(at+"."+fe.Field, "%s", fe.Msg)
	}
	return p.errAt(at, "%s", err)
}

// rule checks one rate_limit block.
func (p fileParser) rule(at string, y *yamlRateLimit) (*Rule, error) {
	r, err := p.ruleSize(at, y)
	if err != nil {
		// Their checks do not depend on the size.
		if y.Algorithm != nil || y.Buckets != nil {
			_, algErr := p.algorithm(at, y, &Rule{RequestsPerUnit: 1, Window: time.Second})
			if algErr != nil {
				p.note(err)
				p.note(algErr)
				return nil, errReported
			}
		}
		return nil, err
	}
	if r.Unlimited && y.Algorithm == nil && y.Buckets == nil {
		return r, nil
	}
	return p.algorithm(at, y, r)
}

// algorithm applies flashgate's algorithm and buckets to r.
func (p fileParser) algorithm(at string, y *yamlRateLimit, r *Rule) (*Rule, error) {
	if r.Unlimited {
		return nil, p.errAt(at, "an unlimited rate limit must not have algorithm or buckets")
	}
	l, auto, err := enforce.CheckAlgorithm(window.Limit{Requests: int(r.RequestsPerUnit), Window: r.Window}, y.Algorithm, y.Buckets)
	if err != nil {
		return nil, p.fieldErr(at, err)
	}
	r.Buckets, r.AutoBuckets = l.Buckets, auto
	return r, nil
}

// ruleSize checks a rate_limit's requests and window, or unlimited, and
// its replaces.
func (p fileParser) ruleSize(at string, y *yamlRateLimit) (*Rule, error) {
	r := &Rule{Name: y.Name, Unlimited: y.Unlimited, UnitMultiplier: 1}
	if y.Requests != nil || y.Window != nil {
		return p.windowRule(at, y, r)
	}
	var errs []error
	bad := func(err error) { errs = append(errs, err) }
	for i, rep := range y.Replaces {
		switch rep.Name {
		case "":
			bad(p.errAt(fmt.Sprintf("%s.replaces[%d]", at, i), "replaces entry has an empty name"))
		case y.Name:
			bad(p.errAt(fmt.Sprintf("%s.replaces[%d]", at, i), "a rate limit cannot replace itself (%q)", y.Name))
		default:
			r.Replaces = append(r.Replaces, rep.Name)
		}
	}
	unit, unitOK := parseUnit(y.Unit)
	switch {
	case y.Unlimited:
		if unitOK {
			bad(p.errAt(at+".unit", "an unlimited rate limit must not have a unit"))
		}
		if y.RequestsPerUnit != nil {
			bad(p.errAt(at+".requests_per_unit", "an unlimited rate limit must not have requests_per_unit"))
		}
		return r, p.joined(errs)
	case !unitOK:
		bad(p.errAt(at+".unit", "invalid rate limit unit %q: want second, minute, hour, day or week", y.Unit))
	}
	if y.UnitMultiplier != nil {
		if *y.UnitMultiplier == 0 {
			bad(p.errAt(at+".unit_multiplier", "unit_multiplier must be at least 1"))
		} else {
			r.UnitMultiplier = *y.UnitMultiplier
		}
	}
	if unitOK {
		if w, err := limitWindow(unit, r.UnitMultiplier); err != nil {
			bad(p.errAt(at+".unit", "%s", err.Error()))
		} else {
			r.Unit, r.Window = unit, w
		}
	}
	if y.RequestsPerUnit != nil {
		r.RequestsPerUnit = *y.RequestsPerUnit
	}
	if r.RequestsPerUnit > 0 {
		if err := enforce.CheckRequests("requests_per_unit", int64(r.RequestsPerUnit)); err != nil {
			bad(p.errAt(at+".requests_per_unit", "%s", err))
		}
	}
	return r, p.joined(errs)
}

// joined returns nil, the one error, or errReported having recorded all.
func (p fileParser) joined(errs []error) error {
	switch len(errs) {
	case 0:
		return nil
	case 1:
		return errs[0]
	}
	for _, err := range errs {
		p.note(err)
	}
	return errReported
}

// windowRule checks flashgate's {requests: N, window: D}: whole seconds,
// 1s to window.MaxWindow.
func (p fileParser) windowRule(at string, y *yamlRateLimit, r *Rule) (*Rule, error) {
	switch {
	case y.Unit != "" || y.RequestsPerUnit != nil || y.UnitMultiplier != nil:
		return nil, p.errAt(at, "rate_limit mixes {requests, window} with {unit, requests_per_unit}: use one form")
	case y.Unlimited:
		return nil, p.errAt(at, "an unlimited rate limit must not have requests or window")
	case y.Requests == nil:
		return nil, p.errAt(at, "rate_limit needs requests")
	case y.Window == nil:
		return nil, p.errAt(at, "rate_limit needs window")
	}
	var errs []error
	if err := enforce.CheckRequests("requests", *y.Requests); err != nil {
		errs = append(errs, p.errAt(at+".requests", "%s", err))
	}
	w, err := time.ParseDuration(*y.Window)
	if err != nil || w < time.Second || w > window.MaxWindow || w%time.Second != 0 {
		errs = append(errs, p.errAt(at+".window", "window %q: in a ratelimit config, a whole number of seconds from 1s to %s (current_limit reports it in a unit)",
			*y.Window, window.MaxWindow))
	}
	if err := p.joined(errs); err != nil {
		return nil, err
	}
	r.RequestsPerUnit, r.Window = uint32(*y.Requests), w
	r.Unit, r.UnitMultiplier = unitOf(w)
	return r, nil
}
