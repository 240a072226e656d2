package descriptors

import (
	"errors"
	"fmt"
	"math"
	"regexp"
	"sort"
	"strings"
	"time"

	"github.com/goccy/go-yaml"
	"github.com/goccy/go-yaml/ast"

	"github.com/flashgate/flashgate/internal/configfile"
	"github.com/flashgate/flashgate/internal/yamlguard"
)

// strictYAML reads one YAML file strictly: one document, no anchors,
// aliases, tags or merge keys, no duplicate or unknown keys, scalars of the
// expected type. Every error is a *ConfigError; one that leaves the rest
// of a mapping readable is added to errs and reading goes on.
type strictYAML struct {
	file string // the name errors carry
	errs *errorList
}

// errorList collects the errors of one file.
type errorList struct {
	errs []*ConfigError
	// refused holds the mappings with a refused entry; consequence the
	// errors saying such a mapping lacks an entry, left out of the report.
	refused     map[ast.Node]bool
	consequence map[*ConfigError]bool
}

// errReported stands for errors already added to the file's errors.
var errReported = errors.New("the errors are reported")

// add records err unless it is errReported.
func (l *errorList) add(err error) {
	if errors.Is(err, errReported) {
		return
	}
	var ce *ConfigError
	if !errors.As(err, &ce) {
		ce = &ConfigError{Line: 1, Column: 1, Msg: err.Error()}
	}
	l.errs = append(l.errs, ce)
}

// result returns nil, the one error, or ConfigErrors.
func (l *errorList) result() error {
	if len(l.errs) == 0 {
		return nil
	}
	sort.SliceStable(l.errs, func(i, j int) bool {
		a, b := l.errs[i], l.errs[j]
		return a.Line < b.Line || a.Line == b.Line && a.Column < b.Column
	})
	var out []*ConfigError
	for _, e := range l.errs {
		if l.consequence[e] {
			continue
		}
		if n := len(out); n > 0 && *out[n-1] == *e {
			continue
		}
		out = append(out, e)
	}
	return configfile.Join(out)
}

func (y strictYAML) errAt(line, col int, format string, args ...any) error {
	return &ConfigError{File: y.file, Line: line, Column: col, Msg: fmt.Sprintf(format, args...)}
}

func (y strictYAML) errf(n ast.Node, format string, args ...any) error {
	line, col := nodePos(n)
	return y.errAt(line, col, format, args...)
}

// missing is errf for a mapping lacking an entry, unless one was refused.
func (y strictYAML) missing(n ast.Node, format string, args ...any) error {
	err := y.errf(n, format, args...)
	if y.errs.refused[n] {
		if y.errs.consequence == nil {
			y.errs.consequence = map[*ConfigError]bool{}
		}
		y.errs.consequence[err.(*ConfigError)] = true
	}
	return err
}

// refuse adds err, about an entry of mapping n, to y.errs.
func (y strictYAML) refuse(n ast.Node, err error) {
	if y.errs.refused == nil {
		y.errs.refused = map[ast.Node]bool{}
	}
	y.errs.refused[n] = true
	y.errs.add(err)
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

// document parses data and returns its one document's body, nil for
// none; yamlguard's bounds are checked before it is parsed.
func (y strictYAML) document(data []byte) (ast.Node, error) {
	f, err := yamlguard.Parse(data)
	var ge *yamlguard.Error
	if errors.As(err, &ge) {
		return nil, y.errAt(ge.Line, ge.Column, "%s", ge.Msg)
	}
	if err != nil {
		return nil, y.yamlError(err)
	}
	var body ast.Node
	for _, d := range f.Docs {
		if d.Body == nil {
			continue
		}
		if body != nil {
			return nil, y.errf(d.Body, "the file holds more than one YAML document; keep one")
		}
		body = d.Body
	}
	return body, nil
}

// yamlError turns a goccy/go-yaml error into a *ConfigError.
func (y strictYAML) yamlError(err error) error {
	var ye yaml.Error
	if errors.As(err, &ye) && ye.GetToken() != nil && ye.GetToken().Position != nil {
		pos := ye.GetToken().Position
		msg := ye.GetMessage()
		if key, line, ok := duplicateKey(msg); ok {
			return y.errAt(pos.Line, pos.Column, "duplicate key %s (first set on line %s)", key, line)
		}
		return y.errAt(pos.Line, pos.Column, "invalid YAML: %s", msg)
	}
	return y.errAt(1, 1, "invalid YAML: %s", err.Error())
}

// dupKeyRE matches goccy/go-yaml's duplicate-key message, which it gives
// only as text; if an upgrade rewords it, TestConfigErrors' duplicate_key
// fixture fails and the error falls back to "invalid YAML".
var dupKeyRE = regexp.MustCompile(`^mapping key ("[^"]*") already defined at \[(\d+):\d+\]`)

// duplicateKey reads the quoted key and first line of a duplicate-key
// message.
func duplicateKey(msg string) (quotedKey, firstLine string, ok bool) {
	m := dupKeyRE.FindStringSubmatch(msg)
	if m == nil {
		return "", "", false
	}
	return m[1], m[2], true
}

// field is one key: value of a mapping.
type field struct {
	key   string
	keyN  ast.Node
	value ast.Node
}

// fields returns the entries of mapping n, refusing keys outside known
// (none: any), duplicates, non-words, anchors, aliases and tags; a refused
// entry is reported and left out. Only a non-mapping fails the call.
func (y strictYAML) fields(n ast.Node, what string, known ...string) ([]field, error) {
	if err := y.plain(n); err != nil {
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
		return nil, y.errf(n, "%s must be a mapping of keys to values, not %s", what, kindOf(n))
	}
	out := make([]field, 0, len(vals))
	seen := map[string]bool{}
	for _, v := range vals {
		if err := y.plain(v.Key); err != nil {
			y.refuse(n, err)
			continue
		}
		k, ok := keyText(v.Key)
		if !ok && known == nil {
			k, ok = scalarText(v.Key) // a free key ("sources") may be a number
		}
		switch {
		case !ok && known != nil:
			y.refuse(n, y.errf(v.Key, "key %s of %s is %s, not a word; known keys: %s",
				keyShown(v.Key), what, kindOf(v.Key), strings.Join(known, ", ")))
			continue
		case !ok:
			y.refuse(n, y.errf(v.Key, "keys of %s must be plain words, not %s", what, kindOf(v.Key)))
			continue
		case seen[k]:
			y.refuse(n, y.errf(v.Key, "duplicate key %q in %s", k, what))
			continue
		case known != nil && !contains(known, k):
			y.refuse(n, y.errf(v.Key, "unknown key %q in %s; known keys: %s", k, what, strings.Join(known, ", ")))
			continue
		}
		seen[k] = true
		if err := y.plain(v.Value); err != nil {
			y.refuse(n, err)
			continue
		}
		out = append(out, field{key: k, keyN: v.Key, value: v.Value})
	}
	return out, nil
}

// keyShown is a key as written, for errors: a scalar's text, else "".
func keyShown(n ast.Node) string {
	if t, ok := scalarText(n); ok {
		return t
	}
	if tk := n.GetToken(); tk != nil && tk.Value != "" {
		return tk.Value
	}
	return `""`
}

// keyText returns a mapping key's text when it is a word, not a number,
// boolean or null.
func keyText(n ast.Node) (string, bool) {
	switch s := n.(type) {
	case *ast.StringNode:
		return s.Value, true
	case *ast.LiteralNode:
		return s.Value.Value, true
	}
	return "", false
}

// plain refuses anchors, aliases, tags and merge keys.
func (y strictYAML) plain(n ast.Node) error {
	switch n.(type) {
	case *ast.AnchorNode, *ast.AliasNode:
		return y.errf(n, "anchors and aliases are not supported in a descriptors file")
	case *ast.TagNode:
		return y.errf(n, "YAML tags are not supported in a descriptors file")
	case *ast.MergeKeyNode:
		return y.errf(n, "merge keys (<<) are not supported in a descriptors file")
	}
	return nil
}

// contains reports whether list holds s.
func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// kindOf names the kind of n for errors: "a mapping", "a string", ...
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

// str returns the text of a scalar; what names it in errors.
func (y strictYAML) str(n ast.Node, what string) (string, error) {
	if err := y.plain(n); err != nil {
		return "", err
	}
	s, ok := scalarText(n)
	if !ok {
		return "", y.errf(n, "%s must be a string, not %s", what, kindOf(n))
	}
	return s, nil
}

// integer returns a whole number in the int32 range.
func (y strictYAML) integer(n ast.Node, what string) (int, error) {
	in, ok := n.(*ast.IntegerNode)
	if !ok {
		return 0, y.errf(n, "%s must be a whole number, not %s", what, kindOf(n))
	}
	switch v := in.Value.(type) {
	case int64:
		if v > math.MaxInt32 || v < math.MinInt32 {
			return 0, y.errf(n, "%s %d is out of range", what, v)
		}
		return int(v), nil
	case uint64:
		if v > math.MaxInt32 {
			return 0, y.errf(n, "%s %d is out of range", what, v)
		}
		return int(v), nil
	}
	return 0, y.errf(n, "%s must be a whole number", what)
}

// boolean returns a true or false.
func (y strictYAML) boolean(n ast.Node, what string) (bool, error) {
	b, ok := n.(*ast.BoolNode)
	if !ok {
		return false, y.errf(n, "%s must be true or false, not %s", what, kindOf(n))
	}
	return b.Value, nil
}

// duration parses a Go duration string ("1s", "250ms"); a bare 0 is zero.
func (y strictYAML) duration(n ast.Node, what string) (time.Duration, error) {
	if in, ok := n.(*ast.IntegerNode); ok {
		if t := in.GetToken().Value; t == "0" {
			return 0, nil
		}
		return 0, y.errf(n, "%s %s has no unit: write a duration such as 1s or 500ms", what, in.GetToken().Value)
	}
	s, ok := n.(*ast.StringNode)
	if !ok {
		return 0, y.errf(n, "%s must be a duration such as 1s or 500ms, not %s", what, kindOf(n))
	}
	d, err := time.ParseDuration(s.Value)
	if err != nil {
		return 0, y.errf(n, "%s %q is not a duration such as 1s or 500ms", what, s.Value)
	}
	return d, nil
}
