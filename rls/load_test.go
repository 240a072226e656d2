package rls

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"github.com/flashgate/flashgate/window"
)

func TestLoadDirGood(t *testing.T) {
	c, err := LoadDir("testdata/good")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, d := range c.Domains() {
		names = append(names, d.Name)
	}
	want := []string{"basic", "buckets", "flashgate", "replaces", "shadow", "units", "unlimited", "wildcard"}
	if len(names) != len(want) {
		t.Fatalf("domains %v, want %v", names, want)
	}
	for i := range want {
		if names[i] != want[i] {
			t.Fatalf("domains %v, want %v", names, want)
		}
	}
	buckets := map[string]int{"small": 0, "large": window.DefaultBuckets, "chosen": 96, "exact": 0, "bucketed": window.DefaultBuckets}
	for _, r := range c.domains["buckets"].Rules() {
		if r.Buckets != buckets[r.Label()] || r.AutoBuckets != (r.Label() == "large") {
			t.Errorf("rule %s: %d buckets (auto %v), want %d", r.Label(), r.Buckets, r.AutoBuckets, buckets[r.Label()])
		}
	}
	units := c.domains["units"]
	windows := map[string]string{"per_hour": "1h0m0s", "per_day": "24h0m0s", "per_week": "168h0m0s", "five_minutes": "5m0s"}
	for _, r := range units.Rules() {
		if w, ok := windows[r.Label()]; !ok || r.Window.String() != w {
			t.Errorf("rule %s: window %s, want %s", r.Label(), r.Window, w)
		}
	}
}

// TestLoadDirRuntimeLayout: a directory holding config/ is read from
// config/, as ratelimit's RUNTIME_ROOT/RUNTIME_SUBDIRECTORY; files other
// than *.yaml and *.yml are ignored.
func TestLoadDirRuntimeLayout(t *testing.T) {
	c, err := LoadDir("testdata/runtime")
	if err != nil {
		t.Fatal(err)
	}
	if ds := c.Domains(); len(ds) != 1 || ds[0].Name != "runtime" {
		t.Fatalf("domains %v, want [runtime]", ds)
	}
}

// TestLoadDirConfigMap: a Kubernetes ConfigMap mount (files as symlinks into
// ..data) loads, and its dot entries are skipped.
func TestLoadDirConfigMap(t *testing.T) {
	dir := t.TempDir()
	data := filepath.Join(dir, "..2026_01_01")
	if err := os.Mkdir(data, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(data, "d.yaml"), []byte("domain: cm\ndescriptors:\n  - key: k\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Base(data), filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join("..data", "d.yaml"), filepath.Join(dir, "d.yaml")); err != nil {
		t.Fatal(err)
	}
	c, err := LoadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if ds := c.Domains(); len(ds) != 1 || ds[0].Name != "cm" {
		t.Fatalf("domains %v, want [cm]", ds)
	}
}

// TestConfigErrors: one fixture per thing ratelimit (or flashgate, where
// it says so) refuses, each reported as FILE:LINE:COL: sentence.
func TestConfigErrors(t *testing.T) {
	tests := map[string]string{ // fixture → regexp of the error
		"empty_domain":            `^testdata/bad/empty_domain\.yaml:1:1: config file cannot have an empty domain$`,
		"empty_key":               `^testdata/bad/empty_key\.yaml:5:9: descriptor has an empty key$`,
		"duplicate_descriptor":    `^testdata/bad/duplicate_descriptor\.yaml:6:5: duplicate descriptor composite key "d\.a_v"$`,
		"duplicate_yaml_key":      `^testdata/bad/duplicate_yaml_key\.yaml:4:5: mapping key "key" already defined`,
		"bad_unit":                `^testdata/bad/bad_unit\.yaml:5:7: invalid rate limit unit "fortnight"`,
		"month_unit":              `^testdata/bad/month_unit\.yaml:5:7: a window of 1 month is longer than flashgate's longest window, 168h0m0s`,
		"unlimited_with_unit":     `^testdata/bad/unlimited_with_unit\.yaml:6:7: an unlimited rate limit must not have a unit$`,
		"unlimited_with_requests": `^testdata/bad/unlimited_with_requests\.yaml:6:7: an unlimited rate limit must not have requests_per_unit$`,
		"unknown_key":             `^testdata/bad/unknown_key\.yaml:4:5: unknown field "ratelimit"`,
		"replaces_empty":          `^testdata/bad/replaces_empty\.yaml:8:11: replaces entry has an empty name$`,
		"replaces_self":           `^testdata/bad/replaces_self\.yaml:9:11: a rate limit cannot replace itself \("me"\)$`,
		"too_many_requests":       `^testdata/bad/too_many_requests\.yaml:4:29: requests_per_unit must be at most 1000000 per window, not 2000000$`,
		"zero_unit_multiplier":    `^testdata/bad/zero_unit_multiplier\.yaml:4:32: unit_multiplier must be at least 1$`,
		"share_threshold_exact":   `^testdata/bad/share_threshold_exact\.yaml:3:5: share_threshold applies to a wildcard value`,
		"non_map_list":            `^testdata/bad/non_map_list\.yaml:3:5: `,
		"negative_requests":       `^testdata/bad/negative_requests\.yaml:4:51: cannot unmarshal -1`,
		// flashgate's additions
		"mixed_forms":              `^testdata/bad/mixed_forms\.yaml:4:5: rate_limit mixes \{requests, window\} with \{unit, requests_per_unit\}`,
		"subsecond_window":         `^testdata/bad/subsecond_window\.yaml:4:31: window "1500ms": in a ratelimit config, a whole number of seconds`,
		"window_without_requests":  `^testdata/bad/window_without_requests\.yaml:4:5: rate_limit needs requests$`,
		"bad_failure_mode":         `^testdata/bad/bad_failure_mode\.yaml:4:5: failure_mode "open" must be local, allow or deny$`,
		"local_share_above_limit":  `^testdata/bad/local_share_above_limit\.yaml:4:5: local_share 5 is more than the 2 requests per window of rule "a"$`,
		"zero_local_share":         `^testdata/bad/zero_local_share\.yaml:4:5: local_share must be between 1 and 1000000, not 0 \(omit it`,
		"ban_too_long":             `^testdata/bad/ban_too_long\.yaml:4:38: ban duration 8761h0m0s is longer than the maximum of 8760h0m0s \(one year\)$`,
		"ban_negative_duration":    `^testdata/bad/ban_negative_duration\.yaml:4:38: ban duration -5m0s must not be negative$`,
		"ban_zero_window":          `^testdata/bad/ban_zero_window\.yaml:4:25: ban window must be positive, not 0s$`,
		"ban_threshold_too_large":  `^testdata/bad/ban_threshold_too_large\.yaml:4:11: ban threshold must be at most 2147483647, not 3000000000$`,
		"lease_too_long":           `^testdata/bad/lease_too_long\.yaml:4:13: lease for 2s must be between 1ms and 1s`,
		"lease_without_rate_limit": `^testdata/bad/lease_without_rate_limit\.yaml:4:5: lease is set on a descriptor without rate_limit$`,
		"bad_algorithm":            `^testdata/bad/bad_algorithm\.yaml:4:52: algorithm "fixed" must be auto, exact or buckets$`,
		"zero_buckets":             `^testdata/bad/zero_buckets\.yaml:4:52: buckets must be between 1 and 1000, not 0`,
		"exact_with_buckets":       `^testdata/bad/exact_with_buckets\.yaml:4:61: buckets is set with algorithm: exact; omit one of them$`,
		"empty_algorithm":          `^testdata/bad/empty_algorithm\.yaml:4:43: algorithm "" must be auto, exact or buckets$`,
		"zero_requests":            `^testdata/bad/zero_requests\.yaml:4:18: requests must be at least 1, not 0$`,
		// ext_authz's own keys: Envoy sends the descriptors
		"sources": `^testdata/bad/sources\.yaml:2:1: unknown field "sources"`,
		// a key YAML reads as a number is reported, not skipped
		"non_string_key": `^testdata/bad/non_string_key\.yaml:1:1: key 0\.25 is a number, not a field name; known fields: domain, descriptors$`,
		// nesting bombs, refused before they are parsed
		"nested_flow":  `^testdata/bad/nested_flow\.yaml:1:65: the YAML is nested deeper than 64 levels$`,
		"nested_block": `^testdata/bad/nested_block\.yaml:66:129: the YAML is nested deeper than 64 levels$`,
	}
	for name, want := range tests {
		t.Run(name, func(t *testing.T) {
			path := "testdata/bad/" + name + ".yaml"
			data, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			_, err = ParseFiles([]File{{Name: path, Data: data}})
			if err == nil {
				t.Fatal("no error")
			}
			if _, ok := err.(*ConfigError); !ok {
				t.Errorf("error %T, want *ConfigError", err)
			}
			if !regexp.MustCompile(want).MatchString(err.Error()) {
				t.Fatalf("error %q does not match %q", err, want)
			}
		})
	}
	t.Run("duplicate_domain", func(t *testing.T) {
		_, err := LoadDir("testdata/bad_duplicate_domain")
		want := `^testdata/bad_duplicate_domain/b\.yaml:1:1: duplicate domain "twice" \(also in testdata/bad_duplicate_domain/a\.yaml\)$`
		if err == nil || !regexp.MustCompile(want).MatchString(err.Error()) {
			t.Fatalf("error %v, want %q", err, want)
		}
	})
	t.Run("every fixture has a case", func(t *testing.T) {
		fs, _ := filepath.Glob("testdata/bad/*.yaml")
		for _, f := range fs {
			if _, ok := tests[filepath.Base(f[:len(f)-len(".yaml")])]; !ok {
				t.Errorf("fixture %s has no case", f)
			}
		}
	})
	t.Run("empty directory", func(t *testing.T) {
		if _, err := LoadDir(t.TempDir()); err == nil {
			t.Fatal("no error")
		}
	})
}

// TestFlashgateAdditions: flashgate's rate_limit form and its per-rule
// settings load into the rules, nested descriptors inheriting them.
func TestFlashgateAdditions(t *testing.T) {
	c, err := LoadDir("testdata/good")
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, r := range c.domains["flashgate"].Rules() {
		got[r.Label()] = fmt.Sprintf("%d/%s %s×%d failure=%s share=%d ban=%v",
			r.RequestsPerUnit, r.Window, r.Unit, r.UnitMultiplier, r.FailureMode, r.LocalShare, r.Ban)
	}
	want := map[string]string{
		"api_key":     "2/1m30s SECOND×90 failure=default share=0 ban=<nil>",
		"tenant.user": "2/1h0m0s HOUR×1 failure=deny share=1 ban=&{3 10s 1m0s}",
		"quiet":       "2/1m0s MINUTE×1 failure=allow share=0 ban=<nil>",
		"device":      "1/1s SECOND×1 failure=default share=0 ban=&{2 0s 0s}",
		"device.fp":   "1/1s SECOND×1 failure=default share=0 ban=&{0 0s 0s}",
	}
	for k, w := range want {
		if got[k] != w {
			t.Errorf("rule %s: %s, want %s", k, got[k], w)
		}
	}
}

// TestLease: lease: {for: D} on a ratelimit descriptor; a limit its size
// would bucket stays an exact log when leased.
func TestLease(t *testing.T) {
	cfg, err := ParseFiles([]File{{Name: "lease.yaml", Data: []byte(`domain: d
descriptors:
  - key: claim
    lease: {for: 50ms}
    rate_limit: {unit: second, requests_per_unit: 50000}
  - key: other
    rate_limit: {unit: second, requests_per_unit: 5}
`)}})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]time.Duration{"claim": 50 * time.Millisecond, "other": 0}
	for _, r := range cfg.Domain("d").Rules() {
		if r.LeaseFor() != want[r.Path] {
			t.Errorf("rule %s: lease %s, want %s", r.Path, r.LeaseFor(), want[r.Path])
		}
		if r.Lease > 0 && r.Buckets != 0 {
			t.Errorf("rule %s: leased on %d buckets, want an exact log", r.Path, r.Buckets)
		}
	}
}
