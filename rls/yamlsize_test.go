package rls

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

// TestAliasesShareDescriptors: anchors and aliases, which ratelimit's YAML
// accepts, share a descriptor between keys.
func TestAliasesShareDescriptors(t *testing.T) {
	const y = `
domain: shared
descriptors:
  - key: tenant
    value: a
    rate_limit: &perMinute {unit: minute, requests_per_unit: 7}
  - key: tenant
    value: b
    rate_limit: *perMinute
`
	cfg, err := ParseFiles([]File{{Name: "shared.yaml", Data: []byte(y)}})
	if err != nil {
		t.Fatalf("a config sharing a rate_limit by alias: %v", err)
	}
	var rules []string
	for _, d := range cfg.Domains() {
		for _, r := range d.Rules() {
			rules = append(rules, fmt.Sprintf("%s %d/%s", r.Path, r.RequestsPerUnit, r.Window))
		}
	}
	if want := []string{"tenant_a 7/1m0s", "tenant_b 7/1m0s"}; strings.Join(rules, ",") != strings.Join(want, ",") {
		t.Fatalf("rules %q, want %q", rules, want)
	}
}

// TestAliasBombRefused: a small file whose nested aliases expand past
// MaxExpandedNodes is refused at once, before it is decoded.
func TestAliasBombRefused(t *testing.T) {
	var b strings.Builder
	b.WriteString("domain: bomb\nl0: &l0 [x, x, x, x, x, x, x, x, x, x]\n")
	for i := 1; i <= 9; i++ {
		fmt.Fprintf(&b, "l%d: &l%d [", i, i)
		for j := range 10 {
			if j > 0 {
				b.WriteString(", ")
			}
			fmt.Fprintf(&b, "*l%d", i-1)
		}
		b.WriteString("]\n")
	}
	start := time.Now()
	_, err := ParseFiles([]File{{Name: "bomb.yaml", Data: []byte(b.String())}})
	var ce *ConfigError
	if !errors.As(err, &ce) || !strings.Contains(err.Error(), "aliases expand to more than") {
		t.Fatalf("a %d-byte alias bomb: %v, want a ConfigError on its expansion", b.Len(), err)
	}
	t.Logf("refused in %s: %v", time.Since(start), err)
}

// TestAnchorRedefinedRefused: an anchor name defined twice is refused: an
// alias names the anchor before it, and a later redefinition (an empty
// list, say) must not let a shared tree of rules pass as small.
func TestAnchorRedefinedRefused(t *testing.T) {
	const y = `
domain: twice
descriptors:
  - key: a
    descriptors: &L0
      - key: x
        rate_limit: {unit: minute, requests_per_unit: 1}
  - key: b
    descriptors: *L0
  - key: c
    descriptors: &L0 []
`
	_, err := ParseFiles([]File{{Name: "twice.yaml", Data: []byte(y)}})
	var ce *ConfigError
	if !errors.As(err, &ce) || !strings.Contains(err.Error(), "anchor &L0 is defined twice") {
		t.Fatalf("a redefined anchor: %v, want a ConfigError naming it", err)
	}
}
