package enforce_test

import (
	"testing"

	"github.com/flashgate/flashgate/enforce"
)

func TestParseFailureMode(t *testing.T) {
	tests := map[string]struct {
		in   string
		want enforce.FailureMode
		ok   bool
	}{
		"local":      {"local", enforce.FailureLocal, true},
		"allow":      {"allow", enforce.FailureAllow, true},
		"deny":       {"deny", enforce.FailureDeny, true},
		"empty":      {"", enforce.FailureDefault, false},
		"upper case": {"DENY", enforce.FailureDefault, false},
		"default":    {"default", enforce.FailureDefault, false},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := enforce.ParseFailureMode(tc.in)
			if got != tc.want || (err == nil) != tc.ok {
				t.Fatalf("ParseFailureMode(%q) = %v, %v", tc.in, got, err)
			}
			if tc.ok && got.String() != tc.in {
				t.Errorf("String() = %q, want %q", got.String(), tc.in)
			}
		})
	}
	if s := enforce.FailureDefault.String(); s != "default" {
		t.Errorf("FailureDefault.String() = %q", s)
	}
}

func TestValidHeaderName(t *testing.T) {
	long := make([]byte, 257)
	for i := range long {
		long[i] = 'a'
	}
	tests := map[string]struct {
		in string
		ok bool
	}{
		"token":         {"x-uid", true},
		"mixed case":    {"X-Device-FP", true},
		"pseudo":        {":authority", true},
		"symbols":       {"a!#$%&'*+-.^_`|~z", true},
		"256 bytes":     {string(long[:256]), true},
		"257 bytes":     {string(long), false},
		"empty":         {"", false},
		"colon only":    {":", false},
		"space":         {"x uid", false},
		"colon inside":  {"x:uid", false},
		"non-ASCII":     {"x-ü", false},
		"double pseudo": {"::path", false},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if got := enforce.ValidHeaderName(tc.in); got != tc.ok {
				t.Fatalf("ValidHeaderName(%q) = %v, want %v", tc.in, got, tc.ok)
			}
		})
	}
}
