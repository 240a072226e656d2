package descriptors

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/flashgate/flashgate/window"
)

// TestConfigErrors loads every fixture of testdata/config and checks the
// exact position and sentence of its error.
func TestConfigErrors(t *testing.T) {
	tests := map[string]string{
		"anchor":                  "4:17: anchors and aliases are not supported in a descriptors file",
		"bad_algorithm":           `4:54: algorithm "fixed" must be auto, exact or buckets`,
		"bad_ban":                 "5:22: ban threshold must be at least 1, not 0",
		"ban_negative_duration":   "5:48: ban duration -5m0s must not be negative",
		"ban_too_long":            "5:21: ban duration 2562047h0m0s is longer than the maximum of 8760h0m0s (one year)",
		"ban_empty":               "5:10: ban is empty: write ban: {} for the penalty box of serve's --ban-* flags, or set threshold, window, duration",
		"ban_threshold_too_large": "5:22: threshold 3000000000 is out of range",
		"bad_duration":            `4:39: window "1 sec" is not a duration such as 1s or 500ms`,
		"bad_failure_mode":        `4:19: failure_mode "open" must be local, allow or deny`,
		"bad_header_name":         `3:40: header_name "x uid" is not a valid HTTP header name`,
		"bad_on_missing":          `4:17: on_missing "allow" must be skip or deny`,
		"bad_path_case":           `2:12: path_case "upper" must be sensitive or insensitive`,
		"path_value_query":        `4:12: value "/api/login?next=1": a path value cannot hold ? or #: a path is matched without its query`,
		"path_value_relative":     `4:12: value "api/login": a path value must begin with /`,
		"path_value_parameter":    `4:12: value "/api/login;jsessionid=*": a path value cannot hold ;: a path is matched without its ; parameters`,
		"bad_rule_name":           `4:11: rule name "per ip" must be 1 to 64 characters of A-Z a-z 0-9 . _ -`,
		"bad_shadow_mode":         "4:18: shadow_mode must be true or false, not a string",
		"bad_trusted_hops":        "2:27: trusted_hops -1 must be between 0 and 16",
		"bad_unit":                `4:24: unit "fortnight" must be second, minute, hour or day`,
		"bad_value_pattern":       `4:12: value "/api/*/coupon" has a * that is not at the end; only a trailing * (prefix match) is supported`,
		"bad_yaml":                "4:17: invalid YAML: could not find flow mapping end token '}'",
		"descriptors_not_list":    "3:3: descriptors must be a list, not a mapping",
		"duplicate_key":           `5:5: duplicate key "rate_limit" (first set on line 4)`,
		"duplicate_rule_name":     `9:11: rule name "limit" is already used by the rule on line 5`,
		"empty_domain":            "1:9: domain is empty",
		"empty_file":              "1:1: the file is empty: it needs at least domain and descriptors",
		"exact_with_buckets":      "4:70: buckets is set with algorithm: exact; omit one of them",
		"empty_value":             "4:12: value is empty: omit value to limit per request value",
		"key_reused_in_path":      `6:14: descriptor key "path" is already used by an enclosing descriptor`,
		"lease_too_long":          "6:18: lease for 2s must be between 1ms and 1s, in whole microseconds",
		"lease_bucketed":          "6:12: a lease needs an exact window: 2000/1s in 60 buckets is bucketed (set algorithm: exact)",
		"local_share_not_number":  "4:18: local_share must be a whole number, not a string",
		"local_share_over_limit":  `5:18: local_share 3 is more than the 2 requests per window of rule "coupon_per_ip"`,
		"local_share_too_large":   "4:18: local_share must be between 1 and 1000000, not 2000000 (omit it to share the limit evenly among the live sidecars)",
		"missing_domain":          "1:1: domain is missing: name the rules' domain, such as domain: flashsale",
		"mixed_rate_limit":        "4:17: rate_limit mixes {requests, window} with {unit, requests_per_unit}: use one form",
		"negative_limit":          "4:28: requests must be at least 1, not -3",
		"nested_block":            "66:129: the YAML is nested deeper than 64 levels",
		"nested_flow":             "1:65: the YAML is nested deeper than 64 levels",
		"non_string_key":          "2:1: key 0.25 of the descriptors file is a number, not a word; known keys: domain, sources, client_ip, path_case, descriptors",
		"no_rate_limit":           `3:5: descriptor "remote_address" has neither rate_limit nor nested descriptors`,
		"reserved_rule_name":      `4:11: rule name "rls.edge" begins with "rls.", which is reserved for the ratelimit service's domains: set another name`,
		"requests_not_number":     "4:28: requests must be a whole number, not a string",
		"short_window":            "4:39: window 100µs: must be at least 1ms",
		"too_many_requests":       "4:28: requests must be at most 1000000 per window, not 2000000",
		"two_documents":           "6:1: the file holds more than one YAML document; keep one",
		"undeclared_key":          `3:10: descriptor key "uid" has no source: declare it under sources (for example uid: {request_headers: {header_name: x-uid}})`,
		"unknown_key":             `4:5: unknown key "rate_limt" in a descriptor; known keys: key, value, name, rate_limit, shadow_mode, failure_mode, local_share, ban, on_missing, lease, descriptors`,
		"unknown_source":          `3:9: unknown source "cookie"; known sources: request_headers, remote_address, request_path, request_method, authority, context_extension`,
		"unknown_top_key":         `2:1: unknown key "descriptor" in the descriptors file; known keys: domain, sources, client_ip, path_case, descriptors`,
		"unused_source":           `4:3: source "devcie" is not used by any descriptor`,
		"window_without_unit":     "4:39: window 60 has no unit: write a duration such as 1s or 500ms",
		"zero_buckets":            "4:52: buckets must be between 1 and 1000, not 0 (algorithm: exact keeps an exact log)",
		"zero_limit":              "4:28: requests must be at least 1, not 0",
		"zero_requests_per_unit":  "4:51: requests_per_unit must be at least 1, not 0",
		"zero_local_share":        "4:18: local_share must be between 1 and 1000000, not 0 (omit it to share the limit evenly among the live sidecars)",
	}
	files, err := filepath.Glob("testdata/config/*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if len(files) != len(tests) {
		var names []string
		for _, f := range files {
			names = append(names, strings.TrimSuffix(filepath.Base(f), ".yaml"))
		}
		sort.Strings(names)
		t.Errorf("%d fixtures, %d table entries: %v", len(files), len(tests), names)
	}
	for name, want := range tests {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join("testdata", "config", name+".yaml")
			_, err := LoadFile(path)
			if err == nil {
				t.Fatalf("LoadFile(%s) succeeded", path)
			}
			var ce *ConfigError
			if !errors.As(err, &ce) {
				t.Fatalf("error %v is %T, not *ConfigError", err, err)
			}
			if got := err.Error(); got != path+":"+want {
				t.Errorf("got  %s\nwant %s:%s", got, path, want)
			}
		})
	}
}

func TestExampleConfig(t *testing.T) {
	c, err := ExampleConfig()
	if err != nil {
		t.Fatal(err)
	}
	shipped, err := os.ReadFile("flashsale.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(shipped, ExampleYAML()) {
		t.Error("ExampleYAML differs from flashsale.yaml")
	}
	if c.Domain != "flashsale" || c.ClientIP.TrustedHops != 0 {
		t.Errorf("domain %q, hops %d", c.Domain, c.ClientIP.TrustedHops)
	}
	want := map[string]window.Limit{
		"coupon_per_uid":    {Requests: 5, Window: time.Second},
		"coupon_per_device": {Requests: 10, Window: time.Second},
		"per_ip":            {Requests: 100, Window: time.Second},
	}
	if len(c.Rules) != len(want) {
		t.Fatalf("%d rules, want %d", len(c.Rules), len(want))
	}
	for _, r := range c.Rules {
		if r.Limit != want[r.Name] {
			t.Errorf("rule %s: limit %v, want %v", r.Name, r.Limit, want[r.Name])
		}
	}
	var b bytes.Buffer
	if err := c.WriteTable(&b); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"coupon_per_uid", `path starting "/api/coupon/"`, "header x-uid", "5/1s", "client IP", "100/1s"} {
		if !strings.Contains(b.String(), s) {
			t.Errorf("table lacks %q:\n%s", s, b.String())
		}
	}
	t.Logf("\n%s", b.String())
}

// TestLocalShare: local_share defaults to 0, is inherited by nested
// descriptors like failure_mode, a nested descriptor may override it, and
// the table shows it.
func TestLocalShare(t *testing.T) {
	cfg := parse(t, localShareYAML(t))
	want := map[string]int{"inherited": 2, "overridden": 10, "default": 0}
	var got []string
	for _, r := range cfg.Rules {
		got = append(got, r.Name)
		if r.LocalShare != want[r.Name] {
			t.Errorf("rule %s: LocalShare %d, want %d", r.Name, r.LocalShare, want[r.Name])
		}
	}
	if len(got) != len(want) {
		t.Errorf("rules %q, want the %d of %v", got, len(want), want)
	}
	var b strings.Builder
	if err := cfg.WriteTable(&b); err != nil || !strings.Contains(b.String(), "local_share=2") {
		t.Errorf("table (error %v) lacks local_share=2:\n%s", err, b.String())
	}
}

// TestLease: lease: {for: D} on a rule; a large limit that would be
// bucketed by its size stays an exact log when leased; a rule without it
// has none.
func TestLease(t *testing.T) {
	b, err := os.ReadFile("testdata/lease.yaml")
	if err != nil {
		t.Fatal(err)
	}
	cfg := parse(t, string(b))
	want := map[string]time.Duration{"claims": 50 * time.Millisecond, "big": 20 * time.Millisecond, "per_ip": 0}
	for _, r := range cfg.Rules {
		if r.LeaseFor() != want[r.Name] {
			t.Errorf("rule %s: lease %s, want %s", r.Name, r.LeaseFor(), want[r.Name])
		}
		if r.Lease > 0 && r.Limit.Buckets != 0 {
			t.Errorf("rule %s: leased on %s, want an exact log", r.Name, r.Limit)
		}
	}
	var tb strings.Builder
	if err := cfg.WriteTable(&tb); err != nil || !strings.Contains(tb.String(), "lease=50ms") {
		t.Errorf("table (error %v) lacks lease=50ms:\n%s", err, tb.String())
	}
}

// TestEveryConfigError: a file with several mistakes reports every one at
// its position, in file order (two unknown keys of one descriptor, every
// field of one descriptor, and a bad key or value with the rest of its
// descriptor included), each bad descriptor left out without hiding its
// siblings; past MaxErrors the list ends with how many more there are.
func TestEveryConfigError(t *testing.T) {
	known := "known keys: key, value, name, rate_limit, shadow_mode, failure_mode, local_share, ban, on_missing, lease, descriptors"
	var overTwenty []string
	for i := range MaxErrors {
		overTwenty = append(overTwenty, fmt.Sprintf(":%d:28: requests must be at least 1, not 0", 5+3*i))
	}
	tests := map[string][]string{
		"five_mistakes": {
			`:3:40: header_name "x uid" is not a valid HTTP header name`,
			`:6:5: unknown key "zzz" in a descriptor; ` + known,
			`:7:5: unknown key "aaa" in a descriptor; ` + known,
			":8:28: requests must be at least 1, not 0",
			`:10:19: failure_mode "open" must be local, allow or deny`,
			`:11:39: window "1 sec" is not a duration such as 1s or 500ms`,
		},
		"every_field": {
			`:6:11: rule name "bad name!" must be 1 to 64 characters of A-Z a-z 0-9 . _ -`,
			`:7:19: failure_mode "open" must be local, allow or deny`,
			`:8:17: on_missing "maybe" must be skip or deny`,
			":9:18: local_share must be between 1 and 1000000, not 0 (omit it to share the limit evenly among the live sidecars)",
			":10:18: shadow_mode must be true or false, not a number",
			":11:28: requests must be at least 1, not 0",
			`:11:39: window "1 sec" is not a duration such as 1s or 500ms`,
			`:11:57: algorithm "fast" must be auto, exact or buckets`,
		},
		"key_and_value": {
			`:3:10: descriptor key "nosrc" has no source: declare it under sources (for example nosrc: {request_headers: {header_name: x-nosrc}})`,
			`:4:12: value "a*b" has a * that is not at the end; only a trailing * (prefix match) is supported`,
			":5:52: buckets must be between 1 and 1000, not 0 (algorithm: exact keeps an exact log)",
			":7:12: value is empty: omit value to limit per request value",
			`:9:14: descriptor key "path" is already used by an enclosing descriptor`,
			`:10:28: unit "fortnight" must be second, minute, hour or day`,
			":10:58: requests_per_unit must be at least 1, not 0",
		},
		"no_key": {
			":3:5: a descriptor needs a key",
			`:4:11: rule name "bad name" must be 1 to 64 characters of A-Z a-z 0-9 . _ -`,
			":5:28: requests must be at least 1, not 0",
			`:6:5: unknown key "kye" in a descriptor; ` + known,
			":8:5: a descriptor needs a key",
		},
		"no_domain": {
			":1:1: domain is missing: name the rules' domain, such as domain: flashsale",
			":3:28: requests must be at least 1, not 0",
		},
		"over_twenty": overTwenty,
	}
	more := map[string]int{"over_twenty": 5}
	files, err := filepath.Glob("testdata/many/*.yaml")
	if err != nil || len(files) != len(tests) {
		t.Errorf("%d fixtures (%v), %d table entries", len(files), err, len(tests))
	}
	for name, want := range tests {
		t.Run(name, func(t *testing.T) {
			path := "testdata/many/" + name + ".yaml"
			var lines []string
			for _, w := range want {
				lines = append(lines, path+w)
			}
			if n := more[name]; n > 0 {
				lines = append(lines, fmt.Sprintf("and %d more", n))
			}
			_, err := LoadFile(path)
			var errs ConfigErrors
			if !errors.As(err, &errs) {
				t.Fatalf("LoadFile: %v (%T), want ConfigErrors", err, err)
			}
			if got := err.Error(); got != strings.Join(lines, "\n") {
				t.Fatalf("errors:\n%s\nwant:\n%s", got, strings.Join(lines, "\n"))
			}
			if errs.Len() != len(want)+more[name] {
				t.Errorf("Len %d, want %d", errs.Len(), len(want)+more[name])
			}
			var first *ConfigError
			if !errors.As(err, &first) || first != errs.List[0] {
				t.Errorf("errors.As finds %v, want the first error", first)
			}
		})
	}
}

// TestConfigErrorsBounded: at most MaxErrors errors are reported, the
// first ones of the file.
func TestConfigErrorsBounded(t *testing.T) {
	var b strings.Builder
	b.WriteString("domain: d\ndescriptors:\n")
	for i := range 50 {
		fmt.Fprintf(&b, "  - key: remote_address\n    name: r%d\n    typo: 1\n    rate_limit: {requests: 1, window: 1s}\n", i)
	}
	_, err := ParseConfig("d.yaml", []byte(b.String()))
	var errs ConfigErrors
	if !errors.As(err, &errs) || len(errs.List) != MaxErrors || errs.More != 50-MaxErrors {
		t.Fatalf("%v, want %d errors listed and %d more", err, MaxErrors, 50-MaxErrors)
	}
	if errs.List[0].Line != 5 || errs.List[MaxErrors-1].Line != 5+4*(MaxErrors-1) {
		t.Errorf("lines %d to %d, want the first ones", errs.List[0].Line, errs.List[MaxErrors-1].Line)
	}
}

// localShareYAML returns testdata/local_share.yaml: local_share set on a
// parent, overridden on one nested rule, a third rule left to the default.
func localShareYAML(t testing.TB) string {
	t.Helper()
	b, err := os.ReadFile("testdata/local_share.yaml")
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
