package window

import (
	"strings"
	"testing"
)

// TestKeyBytes: KeyBytes builds the same key as Key, for verbatim, hashed
// (unsafe alphabet) and long values.
func TestKeyBytes(t *testing.T) {
	k, err := NewKeys("fgtest")
	if err != nil {
		t.Fatal(err)
	}
	tests := map[string]struct{ rule, value string }{
		"verbatim":      {"per_uid", "user-1"},
		"empty":         {"per_uid", ""},
		"unsafe":        {"coupon", "13:/api/coupon/*6:user-1"},
		"hash tag":      {"coupon", "{x}"},
		"long verbatim": {"per_uid", strings.Repeat("a", MaxVerbatim+1)},
		"max verbatim":  {"per_uid", strings.Repeat("a", MaxVerbatim)},
		"long rule":     {strings.Repeat("r", MaxVerbatim+5), "v"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			want := k.Key(tc.rule, tc.value)
			if got := k.KeyBytes(tc.rule, []byte(tc.value)); got != want {
				t.Errorf("KeyBytes(%q, %q) = %q, want %q", tc.rule, tc.value, got, want)
			}
			if len(want) > MaxKeyLen {
				t.Errorf("key %q is longer than MaxKeyLen", want)
			}
		})
	}
}

func TestSafeName(t *testing.T) {
	tests := map[string]bool{
		"":                true,
		"per_uid-1.v2":    true,
		"ABCxyz0189":      true,
		"per ip":          false,
		"a:b":             false,
		"{tag}":           false,
		"caf\u00e9":       false,
		"/api/coupon/*":   false,
		"x\x00y":          false,
		"#hashed-segment": false,
	}
	for s, want := range tests {
		if got := SafeName(s); got != want {
			t.Errorf("SafeName(%q) = %v, want %v", s, got, want)
		}
	}
}

// BenchmarkKeysKey: building one limit key.
func BenchmarkKeysKey(b *testing.B) {
	k := Keys{}
	b.ReportAllocs()
	for b.Loop() {
		_ = k.Key("coupon_per_uid", "user-12345678")
	}
}
