package rls

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/flashgate/flashgate/window/memory"
)

// TestRatelimitOwnConfigs: ratelimit's own example and test configs
// (testdata/ratelimit, copied unchanged) load, metadata and quota_mode
// included, and enforce what they say; a quota_mode rule is enforced as an
// ordinary limit, and the server logs so when it installs them.
func TestRatelimitOwnConfigs(t *testing.T) {
	for _, dir := range []string{"examples", "metadata", "wildcard"} {
		if _, err := LoadDir("testdata/ratelimit/" + dir); err != nil {
			t.Fatalf("%s: %v", dir, err)
		}
	}
	cfg, err := LoadDir("testdata/ratelimit/examples")
	if err != nil {
		t.Fatal(err)
	}
	var log bytes.Buffer
	newMemoryServer(t, cfg, func(o *testOptions) { o.Logger = slog.New(slog.NewTextHandler(&log, nil)) })
	if got := log.String(); !strings.Contains(got, "quota_mode is enforced as an ordinary limit") ||
		!strings.Contains(got, "rl:service_service_1") || !strings.Contains(got, "rl:service_service_2") {
		t.Errorf("log %q: want the quota_mode warning naming both rules", got)
	}
	for name, steps := range map[string][]step{
		"quota_mode: an ordinary limit": {
			{req: request("rl", desc("service", "service_1")), code: ok, sts: []st{{ok, 1, 0}}},
			{req: request("rl", desc("service", "service_1")), code: over, sts: []st{{over, 1, 0}}},
			{req: request("rl", desc("service", "service_2")), times: 2, code: ok, sts: []st{{ok, 2, -1}}},
			{req: request("rl", desc("service", "service_2")), code: over, sts: []st{{over, 2, 0}}},
		},
		"nested with replaces": {
			{req: request("rl", desc("source_cluster", "proxy", "destination_cluster", "mock")), code: ok, sts: []st{{ok, 1, 0}}},
			{req: request("rl", desc("source_cluster", "proxy", "destination_cluster", "mock")), code: over, sts: []st{{over, 1, 0}}},
			// bkthomps (1 a minute) is replaced by the destination's 2
			{req: request("rl", desc("foo", "f", "bar", "bkthomps"), desc("source_cluster", "proxy", "destination_cluster", "bkthomps")),
				times: 2, code: ok, sts: []st{{ok, 0, 0}, {ok, 2, -1}}},
		},
		"a value blocked with 0": {
			{req: request("rl", desc("foo", "f", "bar", "banned")), code: over, sts: []st{{over, 0, 0}}},
		},
		"mongo_cps": {
			{req: request("mongo_cps", desc("database", "users")), code: ok, sts: []st{{ok, 500, 499}}},
			{req: request("mongo_cps", desc("database", "other")), code: ok, sts: []st{{ok, 0, 0}}},
		},
	} {
		t.Run(name, func(t *testing.T) {
			s, _ := newMemoryServer(t, cfg, nil)
			run(t, s, steps)
		})
	}
}

// run calls s with each step and checks its answer.
func run(t *testing.T, s *Server, steps []step) {
	t.Helper()
	for i, c := range steps {
		for k := range max(c.times, 1) {
			resp, err := s.ShouldRateLimit(context.Background(), c.req)
			if err != nil {
				t.Fatalf("call %d (#%d): %v", i, k+1, err)
			}
			checkResponse(t, fmt.Sprintf("call %d (#%d)", i, k+1), resp, c)
		}
	}
}

// TestMetadataIgnored: metadata takes any YAML (maps, lists, scalars) on
// any descriptor, and changes nothing.
func TestMetadataIgnored(t *testing.T) {
	with, err := ParseFiles([]File{{Name: "m.yaml", Data: []byte(`domain: m
descriptors:
  - key: k
    metadata:
      owner: {team: payments, tags: [a, b], weight: 2.5, on: true}
      unknown_anything: null
    rate_limit: {unit: minute, requests_per_unit: 2}
    descriptors:
      - key: sub
        metadata: [1, 2]
        rate_limit: {unit: minute, requests_per_unit: 1}
`)}})
	if err != nil {
		t.Fatal(err)
	}
	s, _ := newMemoryServer(t, with, nil)
	run(t, s, []step{
		{req: request("m", desc("k", "v")), times: 2, code: ok, sts: []st{{ok, 2, -1}}},
		{req: request("m", desc("k", "v")), code: over, sts: []st{{over, 2, 0}}},
		{req: request("m", desc("k", "v", "sub", "x")), code: ok, sts: []st{{ok, 1, 0}}},
	})
}

// TestWildcards: ratelimit's wildcard semantics (its test/config
// wildcard.yaml and TestWildcardConfig): each * matches any run of
// characters, none included, the parts in order without overlap; each
// matching value has its own bucket unless share_threshold.
func TestWildcards(t *testing.T) {
	cfg, err := LoadDir("testdata/ratelimit/wildcard")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		entries []string
		limit   uint32 // 0: no match
	}{
		{[]string{"wild", "foo1"}, 20},
		{[]string{"wild", "foo"}, 20},
		{[]string{"wild", "bar"}, 0},
		{[]string{"noWild", "foo1"}, 0},
		{[]string{"noVal", "anything"}, 20},
		{[]string{"midWild", "barab"}, 20},
		{[]string{"midWild", "bar123b"}, 20},
		{[]string{"midWild", "barb"}, 20},
		{[]string{"midWild", "bara"}, 0},
		{[]string{"midWild", "xbarb"}, 0},
		{[]string{"midWild", "bar"}, 0}, // "bar" and "b" may not overlap
		{[]string{"multiWild", "foo123bar456baz"}, 10},
		{[]string{"multiWild", "foobarbaz"}, 10},
		{[]string{"multiWild", "foo123baz"}, 0},
		{[]string{"multiWild", "bar456baz"}, 0},
		{[]string{"multiWild", "foobazbar"}, 0}, // out of order
		{[]string{"nestedWild", "val1", "wild", "goo2"}, 20},
		{[]string{"nestedWild", "val2", "wild", "goo2"}, 0},
	} {
		m := cfg.domains["test-domain"].lookup(desc(tc.entries...))
		var got uint32
		if r := m.limit(); r != nil {
			got = r.RequestsPerUnit
		}
		if got != tc.limit {
			t.Errorf("%v: limit %d, want %d", tc.entries, got, tc.limit)
		}
	}

	// A bucket per value, or one for all with share_threshold; a key that
	// merely starts like the pattern's (ratelimit compares key_value
	// strings) does not match: keys compare whole.
	shared, err := ParseFiles([]File{{Name: "w.yaml", Data: []byte(`domain: w
descriptors:
  - key: route
    value: /v*/users
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: file
    value: files/*.pdf
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 2}
`)}})
	if err != nil {
		t.Fatal(err)
	}
	mem, err := memory.New(memory.Options{})
	if err != nil {
		t.Fatal(err)
	}
	s := newServer(t, shared, testOptions{coreOptions: coreOptions{Limiter: mem, Registerer: prometheus.NewRegistry()}})
	run(t, s, []step{
		{req: request("w", desc("route", "/v1/users")), code: ok, sts: []st{{ok, 1, 0}}},
		{req: request("w", desc("route", "/v1/users")), code: over, sts: []st{{over, 1, 0}}},
		{req: request("w", desc("route", "/v2/users")), code: ok, sts: []st{{ok, 1, 0}}},
		{req: request("w", desc("route", "/v2/orders")), code: ok, sts: []st{{ok, 0, 0}}},
		{req: request("w", desc("file", "files/a.pdf")), code: ok, sts: []st{{ok, 2, 1}}},
		{req: request("w", desc("file", "files/b.pdf")), code: ok, sts: []st{{ok, 2, 0}}},
		{req: request("w", desc("file", "files/c.pdf")), code: over, sts: []st{{over, 2, 0}}},
		{req: request("w", desc("file", "files/c.csv")), code: ok, sts: []st{{ok, 0, 0}}},
	})
}
