package httpauthz_test

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
)

// A small strict parser of RFC 8941 structured-field lists, enough for the
// IETF RateLimit fields: items whose bare item and parameter values are
// integers, decimals, strings, tokens or booleans (no inner lists, no byte
// sequences). enforce/enforcetest's parser replaces it once both are in
// one tree.

// sfItem is one list member: Value is a string's or token's text, or an
// integer's digits; Params hold the parameters' values the same way
// ("?1" for a true boolean).
type sfItem struct {
	Value  string
	String bool // Value was an sf-string
	Params map[string]string
}

// parseSFList parses a whole field value as an sf-list.
func parseSFList(s string) ([]sfItem, error) {
	p := sfParser{s: strings.Trim(s, " ")}
	var out []sfItem
	if p.s == "" {
		return nil, nil
	}
	for {
		it, err := p.item()
		if err != nil {
			return nil, err
		}
		out = append(out, it)
		p.ows()
		if p.done() {
			return out, nil
		}
		if p.s[p.i] != ',' {
			return nil, fmt.Errorf("at %d: want ',' between members", p.i)
		}
		p.i++
		p.ows()
		if p.done() {
			return nil, errors.New("trailing comma")
		}
	}
}

type sfParser struct {
	s string
	i int
}

func (p *sfParser) done() bool { return p.i >= len(p.s) }

func (p *sfParser) ows() {
	for !p.done() && (p.s[p.i] == ' ' || p.s[p.i] == '\t') {
		p.i++
	}
}

func (p *sfParser) item() (sfItem, error) {
	v, str, err := p.bare()
	if err != nil {
		return sfItem{}, err
	}
	it := sfItem{Value: v, String: str, Params: map[string]string{}}
	for !p.done() && p.s[p.i] == ';' {
		p.i++
		for !p.done() && p.s[p.i] == ' ' {
			p.i++
		}
		k := p.key()
		if k == "" {
			return sfItem{}, fmt.Errorf("at %d: want a parameter key", p.i)
		}
		val := "?1"
		if !p.done() && p.s[p.i] == '=' {
			p.i++
			if val, _, err = p.bare(); err != nil {
				return sfItem{}, err
			}
		}
		it.Params[k] = val
	}
	return it, nil
}

// key reads a key: lcalpha or "*", then lcalpha, digits, "_-.*".
func (p *sfParser) key() string {
	start := p.i
	for !p.done() {
		c := p.s[p.i]
		first := p.i == start
		if 'a' <= c && c <= 'z' || c == '*' || !first && ('0' <= c && c <= '9' || strings.IndexByte("_-.", c) >= 0) {
			p.i++
			continue
		}
		break
	}
	return p.s[start:p.i]
}

// bare reads a bare item; str reports an sf-string.
func (p *sfParser) bare() (v string, str bool, err error) {
	if p.done() {
		return "", false, errors.New("want an item, got the end")
	}
	switch c := p.s[p.i]; {
	case c == '"':
		var b strings.Builder
		for p.i++; !p.done(); p.i++ {
			c := p.s[p.i]
			switch {
			case c == '\\':
				p.i++
				if p.done() || p.s[p.i] != '"' && p.s[p.i] != '\\' {
					return "", false, fmt.Errorf("at %d: bad escape", p.i)
				}
				b.WriteByte(p.s[p.i])
			case c == '"':
				p.i++
				return b.String(), true, nil
			case c < 0x20 || c > 0x7e:
				return "", false, fmt.Errorf("at %d: byte %#x in a string", p.i, c)
			default:
				b.WriteByte(c)
			}
		}
		return "", false, errors.New("unterminated string")
	case c == '-' || '0' <= c && c <= '9':
		start := p.i
		p.i++
		for !p.done() && ('0' <= p.s[p.i] && p.s[p.i] <= '9' || p.s[p.i] == '.') {
			p.i++
		}
		num := p.s[start:p.i]
		intPart, frac, dec := strings.Cut(strings.TrimPrefix(num, "-"), ".")
		switch {
		case intPart == "" || !dec && len(intPart) > 15:
			return "", false, fmt.Errorf("bad integer %q", num)
		case dec && (len(intPart) > 12 || frac == "" || len(frac) > 3 || strings.Contains(frac, ".")):
			return "", false, fmt.Errorf("bad decimal %q", num)
		}
		return num, false, nil
	case c == '?':
		if p.i+1 < len(p.s) && (p.s[p.i+1] == '0' || p.s[p.i+1] == '1') {
			p.i += 2
			return p.s[p.i-2 : p.i], false, nil
		}
		return "", false, fmt.Errorf("at %d: bad boolean", p.i)
	case 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || c == '*':
		start := p.i
		for p.i++; !p.done() && (isTchar(p.s[p.i]) || p.s[p.i] == ':' || p.s[p.i] == '/'); p.i++ {
		}
		return p.s[start:p.i], false, nil
	default:
		return "", false, fmt.Errorf("at %d: unexpected %q", p.i, c)
	}
}

func isTchar(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
}

// intParam returns parameter k of it as an integer.
func intParam(it sfItem, k string) (int64, error) {
	v, ok := it.Params[k]
	if !ok {
		return 0, fmt.Errorf("no parameter %s", k)
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("parameter %s=%s is not an integer", k, v)
	}
	return n, nil
}

// TestSFList: the parser accepts the draft's examples and refuses what
// RFC 8941 refuses.
func TestSFList(t *testing.T) {
	good := map[string]int{
		`"default";q=100;w=10`:                   1,
		`"a";r=0;t=1, "b";r=5;t=10`:              2,
		`  "sp";q=1;w=1  `:                       1,
		`tok;x=?1;y="s\"q";z=-1.5, "s"`:          2,
		`"burst";q=100;w=1,"day";q=1000;w=86400`: 2,
	}
	for in, n := range good {
		items, err := parseSFList(in)
		if err != nil || len(items) != n {
			t.Errorf("parseSFList(%q) = %v, %v; want %d items", in, items, err, n)
		}
	}
	items, _ := parseSFList(`"a";r=0;t=1`)
	if it := items[0]; it.Value != "a" || !it.String || it.Params["r"] != "0" || it.Params["t"] != "1" {
		t.Errorf("parsed %+v", it)
	}
	for _, bad := range []string{`"a",`, `"a" "b"`, `"a;q=1`, `"a";Q=1`, `"a";q=`, `"a";q=1.`, `"a";q=1234567890123456`, "\"a\x01\"", `"a\x"`, `(inner)`, `"a";=1`} {
		if items, err := parseSFList(bad); err == nil {
			t.Errorf("parseSFList(%q) = %v, want an error", bad, items)
		}
	}
}
