package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
)

// TestBenchRLS: flashgate-bench --api rls sends ShouldRateLimit requests of one
// descriptor per user to serve --rls-config and counts OK and OVER_LIMIT
// answers: one user, 2 per minute, so exactly 2 are allowed.
func TestBenchRLS(t *testing.T) {
	// A ratelimit runtime directory (DIR/config/*.yaml): domain edge, 2 per
	// minute per remote address; and a second domain of two keys of
	// different limits, the tighter one binding.
	dir := t.TempDir()
	if err := os.Mkdir(filepath.Join(dir, "config"), 0o755); err != nil {
		t.Fatal(err)
	}
	for file, yaml := range map[string]string{
		"edge.yaml": "domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit:\n      unit: minute\n      requests_per_unit: 2\n",
		"pair.yaml": "domain: pair\ndescriptors:\n  - key: a\n    rate_limit: {unit: minute, requests_per_unit: 3}\n" +
			"  - key: b\n    rate_limit: {unit: minute, requests_per_unit: 1}\n",
	} {
		if err := os.WriteFile(filepath.Join(dir, "config", file), []byte(yaml), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	addr, _ := startServe(t, "--rls-config", dir, "--key-prefix", "benchrls")
	r := benchJSON(t, "--addr", addr, "--api", "rls", "--domain", "edge", "--descriptor-key", "remote_address",
		"--duration", "1s", "--concurrency", "2", "--users", "1", "--quiet")
	checkBenchInvariants(t, r)
	if r.API != "rls" {
		t.Errorf("api %q, want rls", r.API)
	}
	if r.Allowed != 2 || r.Denied != r.Requests-2 {
		t.Errorf("allowed %d, denied %d of %d: want 2 allowed, the rest denied", r.Allowed, r.Denied, r.Requests)
	}
	// Two descriptors per request, a 3/min and a 1/min one: the user is
	// allowed once, by the tighter limit, which only the second descriptor
	// carries; and that once is recorded under the first descriptor too, so
	// the first alone then allows 2 more, not 3.
	for _, tc := range []struct {
		keys    string
		allowed uint64
	}{{"a,b", 1}, {"a", 2}} {
		r = benchJSON(t, "--addr", addr, "--api", "rls", "--domain", "pair", "--descriptor-key", tc.keys,
			"--duration", "500ms", "--concurrency", "1", "--users", "1", "--quiet")
		checkBenchInvariants(t, r)
		if r.Requests <= tc.allowed {
			t.Fatalf("descriptors %s: only %d requests in 500ms", tc.keys, r.Requests)
		}
		if r.Allowed != tc.allowed || r.Denied != r.Requests-tc.allowed {
			t.Errorf("descriptors %s: allowed %d, denied %d of %d; want %d allowed", tc.keys, r.Allowed, r.Denied, r.Requests, tc.allowed)
		}
	}
	// A domain serve does not know: ratelimit's answer is OK, no limit.
	r = benchJSON(t, "--addr", addr, "--api", "rls", "--domain", "nowhere",
		"--duration", "300ms", "--concurrency", "1", "--users", "1", "--quiet")
	if r.Errors != 0 || r.Denied != 0 || r.Allowed == 0 {
		t.Errorf("unknown domain: %+v, want every request allowed", r)
	}
}

func TestBenchRLSOptions(t *testing.T) {
	for _, args := range [][]string{
		{"--api", "grpc"},
		{"--api", "rls", "--shape", "envoy"},
		{"--api", "rls", "--domain", ""},
		{"--api", "rls", "--descriptor-key", "uid,,ip"},
	} {
		_, _, err := runArgs(append([]string{"--addr", "127.0.0.1:1", "--duration", "1s"}, args...)...)
		if err == nil || strings.Contains(err.Error(), "cannot reach") {
			t.Errorf("flashgate-bench %v: err %v, want the option refused", args, err)
		}
	}
}

func TestRawCodecReadsOverallCode(t *testing.T) {
	for want, resp := range map[int32]*rlsv3.RateLimitResponse{
		0: {},
		1: {OverallCode: rlsv3.RateLimitResponse_OK},
		2: {OverallCode: rlsv3.RateLimitResponse_OVER_LIMIT, Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{
			{Code: rlsv3.RateLimitResponse_OVER_LIMIT, LimitRemaining: 0},
		}, RawBody: []byte("over")},
	} {
		b, err := proto.Marshal(resp)
		if err != nil {
			t.Fatal(err)
		}
		a := checkAnswer{rls: true}
		if err := (rawCodec{}).Unmarshal(mem.BufferSlice{mem.SliceBuffer(b)}, &a); err != nil {
			t.Fatal(err)
		}
		if a.code != want || a.allowed() != (want == 1) {
			t.Errorf("%v: code %d allowed %v, want %d", resp, a.code, a.allowed(), want)
		}
	}
	// An authz answer of code 1 (CANCELLED) is not an allowed one.
	if (checkAnswer{code: 1}).allowed() {
		t.Error("Check status 1 read as allowed")
	}
}
