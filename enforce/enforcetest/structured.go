package enforcetest

import (
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// This file is a strict RFC 8941 List parser (section 4.2), so that the
// tests read the RateLimit fields as a client would.

// Kind is the type of a bare item.
type Kind uint8

const (
	KindInteger Kind = iota + 1
	KindDecimal
	KindString
	KindToken
	KindByteSequence
	KindBoolean
)

// String names the kind as RFC 8941 does.
func (k Kind) String() string {
	switch k {
	case KindInteger:
		return "Integer"
	case KindDecimal:
		return "Decimal"
	case KindString:
		return "String"
	case KindToken:
		return "Token"
	case KindByteSequence:
		return "Byte Sequence"
	case KindBoolean:
		return "Boolean"
	}
	return "none"
}

// Value is a bare item: Int, Dec, Str (String, Token or decoded Byte
// Sequence) or Bool.
type Value struct {
	Kind Kind
	Int  int64
	Dec  float64
	Str  string
	Bool bool
}

// Param is one parameter of an item; a key without a value is Boolean true.
type Param struct {
	Key   string
	Value Value
}

// Item is a List member: a bare item, or with Inner an Inner List, with
// Params.
type Item struct {
	Value      Value
	Inner      bool
	InnerItems []Item
	Params     []Param
}

// Param returns the value of parameter key.
func (it Item) Param(key string) (Value, bool) {
	for _, p := range it.Params {
		if p.Key == key {
			return p.Value, true
		}
	}
	return Value{}, false
}

// ParseList parses s as an RFC 8941 List; an empty value is the empty List.
func ParseList(s string) ([]Item, error) {
	p := &sfParser{s: s}
	p.skipSP()
	var out []Item
	for !p.done() {
		var it Item
		var err error
		if p.peek() == '(' {
			it, err = p.innerList()
		} else {
			it, err = p.item()
		}
		if err != nil {
			return nil, err
		}
		out = append(out, it)
		p.skipOWS()
		if p.done() {
			return out, nil
		}
		if p.next() != ',' {
			return nil, p.errorf("expected ',' after a list member")
		}
		p.skipOWS()
		if p.done() {
			return nil, p.errorf("trailing comma")
		}
	}
	return out, nil
}

type sfParser struct {
	s string
	i int
}

func (p *sfParser) done() bool { return p.i >= len(p.s) }

func (p *sfParser) peek() byte {
	if p.done() {
		return 0
	}
	return p.s[p.i]
}

func (p *sfParser) next() byte {
	c := p.peek()
	p.i++
	return c
}

func (p *sfParser) skipSP() {
	for !p.done() && p.s[p.i] == ' ' {
		p.i++
	}
}

func (p *sfParser) skipOWS() {
	for !p.done() && (p.s[p.i] == ' ' || p.s[p.i] == '\t') {
		p.i++
	}
}

func (p *sfParser) errorf(format string, args ...any) error {
	return fmt.Errorf("structured field %q at byte %d: %s", p.s, p.i, fmt.Sprintf(format, args...))
}

// innerList parses an Inner List and its parameters (4.2.1.2).
func (p *sfParser) innerList() (Item, error) {
	if p.next() != '(' {
		return Item{}, p.errorf("expected '('")
	}
	it := Item{Inner: true, InnerItems: []Item{}}
	for !p.done() {
		p.skipSP()
		if p.peek() == ')' {
			p.i++
			params, err := p.params()
			if err != nil {
				return Item{}, err
			}
			it.Params = params
			return it, nil
		}
		m, err := p.item()
		if err != nil {
			return Item{}, err
		}
		it.InnerItems = append(it.InnerItems, m)
		if c := p.peek(); c != ' ' && c != ')' {
			return Item{}, p.errorf("expected ' ' or ')' in an inner list")
		}
	}
	return Item{}, p.errorf("inner list not closed")
}

// item parses an Item: a bare item and its parameters (4.2.3).
func (p *sfParser) item() (Item, error) {
	v, err := p.bareItem()
	if err != nil {
		return Item{}, err
	}
	params, err := p.params()
	if err != nil {
		return Item{}, err
	}
	return Item{Value: v, Params: params}, nil
}

// params parses Parameters (4.2.3.2); a repeated key keeps its first place.
func (p *sfParser) params() ([]Param, error) {
	var out []Param
	for p.peek() == ';' {
		p.i++
		p.skipSP()
		key, err := p.key()
		if err != nil {
			return nil, err
		}
		v := Value{Kind: KindBoolean, Bool: true}
		if p.peek() == '=' {
			p.i++
			if v, err = p.bareItem(); err != nil {
				return nil, err
			}
		}
		replaced := false
		for j := range out {
			if out[j].Key == key {
				out[j].Value, replaced = v, true
			}
		}
		if !replaced {
			out = append(out, Param{Key: key, Value: v})
		}
	}
	return out, nil
}

// key parses a Key (4.2.3.3).
func (p *sfParser) key() (string, error) {
	c := p.peek()
	if !(c >= 'a' && c <= 'z' || c == '*') {
		return "", p.errorf("a key must begin with a lower-case letter or '*'")
	}
	start := p.i
	for !p.done() {
		c := p.s[p.i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_' || c == '-' || c == '.' || c == '*') {
			break
		}
		p.i++
	}
	return p.s[start:p.i], nil
}

// bareItem parses a Bare Item (4.2.3.1).
func (p *sfParser) bareItem() (Value, error) {
	c := p.peek()
	switch {
	case c == '-' || c >= '0' && c <= '9':
		return p.number()
	case c == '"':
		return p.str()
	case c == '*' || c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z':
		return p.token(), nil
	case c == ':':
		return p.bytes()
	case c == '?':
		return p.boolean()
	}
	return Value{}, p.errorf("no bare item here")
}

// number parses an Integer or a Decimal (4.2.4).
func (p *sfParser) number() (Value, error) {
	neg := false
	if p.peek() == '-' {
		neg = true
		p.i++
	}
	if c := p.peek(); c < '0' || c > '9' {
		return Value{}, p.errorf("a number needs a digit")
	}
	start := p.i
	dot := -1
	for !p.done() {
		c := p.s[p.i]
		switch {
		case c >= '0' && c <= '9':
		case c == '.' && dot < 0:
			if p.i-start > 12 {
				return Value{}, p.errorf("a decimal has at most 12 integer digits")
			}
			dot = p.i
		default:
			goto end
		}
		p.i++
		if dot < 0 && p.i-start > 15 {
			return Value{}, p.errorf("an integer has at most 15 digits")
		}
		if dot >= 0 && p.i-start > 16 {
			return Value{}, p.errorf("a decimal has at most 16 characters")
		}
	}
end:
	num := p.s[start:p.i]
	if dot < 0 {
		n, err := strconv.ParseInt(num, 10, 64)
		if err != nil {
			return Value{}, p.errorf("integer: %v", err)
		}
		if neg {
			n = -n
		}
		return Value{Kind: KindInteger, Int: n}, nil
	}
	if frac := p.i - dot - 1; frac < 1 || frac > 3 {
		return Value{}, p.errorf("a decimal has 1 to 3 fractional digits")
	}
	d, err := strconv.ParseFloat(num, 64)
	if err != nil {
		return Value{}, p.errorf("decimal: %v", err)
	}
	if neg {
		d = -d
	}
	return Value{Kind: KindDecimal, Dec: d}, nil
}

// str parses a String (4.2.5).
func (p *sfParser) str() (Value, error) {
	p.i++
	var b strings.Builder
	for !p.done() {
		c := p.next()
		switch {
		case c == '\\':
			if p.done() {
				return Value{}, p.errorf("a string ends in a backslash")
			}
			e := p.next()
			if e != '"' && e != '\\' {
				return Value{}, p.errorf("a string escapes only '\"' and '\\'")
			}
			b.WriteByte(e)
		case c == '"':
			return Value{Kind: KindString, Str: b.String()}, nil
		case c < 0x20 || c > 0x7e:
			return Value{}, p.errorf("a string holds printable ASCII only")
		default:
			b.WriteByte(c)
		}
	}
	return Value{}, p.errorf("string not closed")
}

// token parses a Token (4.2.6).
func (p *sfParser) token() Value {
	start := p.i
	p.i++
	for !p.done() {
		c := p.s[p.i]
		if !(isTchar(c) || c == ':' || c == '/') {
			break
		}
		p.i++
	}
	return Value{Kind: KindToken, Str: p.s[start:p.i]}
}

func isTchar(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
}

// bytes parses a Byte Sequence (4.2.7), "=" padding optional.
func (p *sfParser) bytes() (Value, error) {
	p.i++
	end := strings.IndexByte(p.s[p.i:], ':')
	if end < 0 {
		return Value{}, p.errorf("byte sequence not closed")
	}
	enc := p.s[p.i : p.i+end]
	for i := 0; i < len(enc); i++ {
		c := enc[i]
		if !(c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '+' || c == '/' || c == '=') {
			return Value{}, p.errorf("a byte sequence holds base64 only")
		}
	}
	p.i += end + 1
	dec, err := base64.StdEncoding.DecodeString(enc)
	if err != nil {
		dec, err = base64.RawStdEncoding.DecodeString(strings.TrimRight(enc, "="))
	}
	if err != nil {
		return Value{}, p.errorf("byte sequence: %v", err)
	}
	return Value{Kind: KindByteSequence, Str: string(dec)}, nil
}

// boolean parses a Boolean (4.2.8).
func (p *sfParser) boolean() (Value, error) {
	p.i++
	switch p.next() {
	case '1':
		return Value{Kind: KindBoolean, Bool: true}, nil
	case '0':
		return Value{Kind: KindBoolean}, nil
	}
	p.i--
	return Value{}, p.errorf("a boolean is ?0 or ?1")
}

// errEmpty: a field that must hold a List holds none.
var errEmpty = errors.New("empty list")
