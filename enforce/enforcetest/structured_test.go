package enforcetest

import (
	"fmt"
	"strings"
	"testing"
)

// show renders parsed items compactly for comparison.
func show(items []Item) string {
	var b strings.Builder
	for i, it := range items {
		if i > 0 {
			b.WriteString("|")
		}
		if it.Inner {
			b.WriteString("(")
			b.WriteString(show(it.InnerItems))
			b.WriteString(")")
		} else {
			b.WriteString(showValue(it.Value))
		}
		for _, p := range it.Params {
			fmt.Fprintf(&b, ";%s=%s", p.Key, showValue(p.Value))
		}
	}
	return b.String()
}

func showValue(v Value) string {
	switch v.Kind {
	case KindInteger:
		return fmt.Sprint(v.Int)
	case KindDecimal:
		return fmt.Sprintf("%gD", v.Dec)
	case KindString:
		return fmt.Sprintf("%q", v.Str)
	case KindToken:
		return "T" + v.Str
	case KindByteSequence:
		return fmt.Sprintf("B%q", v.Str)
	case KindBoolean:
		return fmt.Sprint(v.Bool)
	}
	return "?"
}

func TestParseListAccepts(t *testing.T) {
	tests := map[string]struct{ in, want string }{
		"empty":                {"", ""},
		"spaces only":          {"   ", ""},
		"policy":               {`"coupon_per_uid";q=5;w=1`, `"coupon_per_uid";q=5;w=1`},
		"two items, OWS":       {`"a";r=0;t=1 ,	"b";r=3;t=60`, `"a";r=0;t=1|"b";r=3;t=60`},
		"leading SP":           {`  "a";q=1`, `"a";q=1`},
		"trailing SP":          {`"a";q=1  `, `"a";q=1`},
		"escapes":              {`"a\"b\\c"`, `"a\"b\\c"`},
		"empty string":         {`""`, `""`},
		"token":                {`foo/bar:baz*`, `Tfoo/bar:baz*`},
		"token star":           {`*x`, `T*x`},
		"integer bounds":       {`999999999999999, -999999999999999`, `999999999999999|-999999999999999`},
		"decimal":              {`1.5, -0.001, 123456789012.123`, `1.5D|-0.001D|1.23456789012123e+11D`},
		"booleans":             {`?1, ?0`, `true|false`},
		"bytes":                {`:aGVsbG8=:`, `B"hello"`},
		"bytes unpadded":       {`:aGVsbG8:`, `B"hello"`},
		"param boolean":        {`a;x;y=?0`, `Ta;x=true;y=false`},
		"param SP after ;":     {`a; x=1`, `Ta;x=1`},
		"param overwritten":    {`a;x=1;y=2;x=3`, `Ta;x=3;y=2`},
		"param key chars":      {`a;*k_-.9=1`, `Ta;*k_-.9=1`},
		"inner list":           {`("a" b);p=1, ()`, `("a"|Tb);p=1|()`},
		"inner list SP":        {`(  1   2 )`, `(1|2)`},
		"inner item params":    {`(a;x=1 b)`, `(Ta;x=1|Tb)`},
		"ratelimit -10 sample": {`"default";r=50;t=30`, `"default";r=50;t=30`},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			items, err := ParseList(tc.in)
			if err != nil {
				t.Fatalf("ParseList(%q): %v", tc.in, err)
			}
			if got := show(items); got != tc.want {
				t.Errorf("ParseList(%q) = %s, want %s", tc.in, got, tc.want)
			}
		})
	}
}

func TestParseListRejects(t *testing.T) {
	for name, in := range map[string]string{
		"trailing comma":              `"a",`,
		"trailing comma SP":           `"a", `,
		"leading comma":               `,"a"`,
		"double comma":                `"a",,"b"`,
		"leading tab":                 "\t\"a\"",
		"no comma":                    `"a" "b"`,
		"unclosed string":             `"abc`,
		"bad escape":                  `"a\n"`,
		"trailing backslash":          `"a\`,
		"control char in string":      "\"a\x01\"",
		"non-ASCII in string":         "\"caf\xc3\xa9\"",
		"integer too long":            `1234567890123456`,
		"decimal too many int digits": `1234567890123.1`,
		"decimal 4 fraction digits":   `1.1234`,
		"decimal ends in dot":         `1.`,
		"sign alone":                  `-`,
		"sign then letter":            `-a`,
		"two dots":                    `1.2.3`,
		"boolean bad":                 `?2`,
		"boolean empty":               `?`,
		"bytes unclosed":              `:aGVsbG8=`,
		"bytes bad char":              `:aGV*bG8=:`,
		"bytes bad base64":            `:a===:`,
		"key upper case":              `a;Q=1`,
		"key digit first":             `a;1=1`,
		"param SP before ;":           `a ;x=1`,
		"param SP after =":            `a;x= 1`,
		"param empty value":           `a;x=`,
		"inner list unclosed":         `(a b`,
		"inner list no SP":            `(a"b")`,
		"inner list tab":              "(a\tb)",
		"bare item missing":           `;q=1`,
		"token bad first char":        `#a`,
		"garbage after item":          `"a"x`,
		"semicolon garbage":           `"a";`,
		"SP then garbage":             `"a" x`,
	} {
		t.Run(name, func(t *testing.T) {
			if items, err := ParseList(in); err == nil {
				t.Errorf("ParseList(%q) = %s, want an error", in, show(items))
			}
		})
	}
}
