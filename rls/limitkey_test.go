package rls

import (
	"context"
	"errors"
	"strings"
	"testing"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"

	"github.com/flashgate/flashgate/window"
)

// TestLimitKeyIsTheServersKey: LimitKey returns the key of the hit the
// server makes for a request carrying the descriptor, and its rule.
func TestLimitKeyIsTheServersKey(t *testing.T) {
	cfg := loadGood(t)
	keys, err := window.NewKeys("lk")
	if err != nil {
		t.Fatal(err)
	}
	tests := map[string]struct {
		domain string
		desc   *ratelimitv3.RateLimitDescriptor
		limit  window.Limit
	}{
		"value-less key":      {"basic", desc("remote_address", "1.2.3.4"), window.Limit{Requests: 3, Window: 60e9}},
		"exact value":         {"basic", desc("remote_address", "10.0.0.1"), window.Limit{Requests: 5, Window: 60e9}},
		"nested":              {"basic", desc("message_type", "marketing", "to_number", "+33 6 12"), window.Limit{Requests: 2, Window: 60e9}},
		"wildcard":            {"wildcard", desc("path", "/api/x"), window.Limit{Requests: 2, Window: 60e9}},
		"shared wildcard":     {"wildcard", desc("files", "files/a.txt"), window.Limit{Requests: 3, Window: 60e9}},
		"flashgate additions": {"flashgate", desc("tenant", "t1", "user", "u1"), window.Limit{Requests: 2, Window: 3600e9}},
		"limit override":      {"basic", withLimit(desc("remote_address", "1.2.3.4"), 7, typev3.RateLimitUnit_HOUR), window.Limit{Requests: 7, Window: 3600e9}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			key, r, err := cfg.LimitKey(keys, tc.domain, tc.desc)
			if err != nil {
				t.Fatal(err)
			}
			if got := r.WindowLimit(); got != tc.limit {
				t.Errorf("limit %+v, want %+v", got, tc.limit)
			}
			rec := &recorder{}
			s, _ := newMemoryServer(t, cfg, func(o *testOptions) { o.Limiter, o.Keys = rec, keys })
			if _, err := s.ShouldRateLimit(context.Background(), request(tc.domain, tc.desc)); err != nil {
				t.Fatal(err)
			}
			if len(rec.hits) != 1 || len(rec.hits[0]) != 1 {
				t.Fatalf("hits %+v, want one", rec.hits)
			}
			if got := rec.hits[0][0].Key; got != key {
				t.Errorf("LimitKey %q, the server's key %q", key, got)
			}
		})
	}
	// A shared wildcard: every value it matches is one key.
	k1, _, _ := cfg.LimitKey(keys, "wildcard", desc("files", "files/a"))
	k2, _, _ := cfg.LimitKey(keys, "wildcard", desc("files", "files/b"))
	if k1 != k2 {
		t.Errorf("share_threshold: keys %q and %q differ", k1, k2)
	}
}

// TestLimitKeyErrors: a descriptor no window counts is an error that says
// why.
func TestLimitKeyErrors(t *testing.T) {
	cfg := loadGood(t)
	many := desc()
	for range MaxEntries + 1 {
		many.Entries = append(many.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: "k", Value: "v"})
	}
	tests := map[string]struct {
		domain string
		desc   *ratelimitv3.RateLimitDescriptor
		want   string
	}{
		"unknown domain":  {"nope", desc("a", "b"), `unknown domain "nope"`},
		"no entries":      {"basic", desc(), "at least one entry"},
		"too many":        {"basic", many, "more than a request's descriptor may carry"},
		"no rule":         {"basic", desc("key", "value"), `no rule of domain basic limits the descriptor (key="value")`},
		"unknown key":     {"basic", desc("nope", "x"), "no rule of domain basic"},
		"unlimited":       {"unlimited", desc("ldap", "x"), "is unlimited"},
		"blocked":         {"basic", desc("remote_address", "50.0.0.5"), "requests_per_unit: 0"},
		"deeper than any": {"basic", desc("remote_address", "1.2.3.4", "x", "y"), "no rule"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			_, _, err := cfg.LimitKey(window.Keys{}, tc.domain, tc.desc)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want one containing %q", err, tc.want)
			}
			want := ErrNotCounted
			if name == "unknown domain" {
				want = ErrUnknownDomain
			}
			if !errors.Is(err, want) {
				t.Errorf("err = %v, want one wrapping %v", err, want)
			}
		})
	}
}
