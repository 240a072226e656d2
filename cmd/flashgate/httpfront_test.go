package main

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/flashgate/flashgate/internal/checkreq"
)

// TestServeHTTPFront: serve --http-authz-addr answers checks over HTTP
// (check --api http) with the ext_authz server's rules and buckets: 5
// admissions then a 429, the same user then denied over gRPC too; its
// listener and rejections are on /metrics; a request outside the path
// prefix is a 400.
func TestServeHTTPFront(t *testing.T) {
	s := startServe(t, "--config", exampleStretched(t), "--http-authz-addr", "127.0.0.1:0", "--http-authz-path-prefix", "/authz/")
	waitFor(t, eventually, "SERVING", func() bool { return s.Serving() })
	if s.httpAuthzAddr == "" {
		t.Fatal("serve reports no HTTP front-end address")
	}
	out, _, err := runCmd(t, context.Background(), "check", "--api", "http", "--addr", s.httpAuthzAddr,
		"--path", "/authz/api/coupon/7?x=1", "--method", "post", "-H", "x-uid: alice", "-n", "6", "--json")
	if err != nil {
		t.Fatalf("check --api http: %v\n%s", err, out)
	}
	var res []checkreq.Result
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		var r checkreq.Result
		if err := json.Unmarshal([]byte(l), &r); err != nil {
			t.Fatalf("%q: %v", l, err)
		}
		res = append(res, r)
	}
	if len(res) != 6 {
		t.Fatalf("%d answers, want 6:\n%s", len(res), out)
	}
	for i, r := range res[:5] {
		if !r.Allowed || r.Status != 200 || r.Headers["x-ratelimit-limit"] != "5" {
			t.Errorf("answer %d: %+v, want 200 with x-ratelimit-limit 5", i+1, r)
		}
	}
	if r := res[5]; r.Allowed || r.Status != 429 || r.Headers["retry-after"] == "" || !strings.Contains(r.Body, "coupon_per_uid") {
		t.Errorf("answer 6: %+v, want a 429 of coupon_per_uid with retry-after", r)
	}
	// One server decides both front-ends: alice is out over gRPC too.
	if l := checkLines(t, s.grpcAddr, "alice", 1); !strings.Contains(l[0], " denied 429 ") {
		t.Errorf("alice over gRPC after 5 over HTTP: %q, want denied", l[0])
	}
	// A path outside the prefix is no check.
	out, _, err = runCmd(t, context.Background(), "check", "--api", "http", "--addr", "http://"+s.httpAuthzAddr, "--path", "/api/coupon/7")
	if err == nil || !strings.Contains(out, "error") || !strings.Contains(out, "400") {
		t.Errorf("check outside the prefix: %v, %q; want a failed check with 400", err, out)
	}
	_, metrics := httpGet(t, "http://"+s.httpAddr+"/metrics")
	for _, want := range []string{
		`flashgate_conns_open{listener="http_authz"}`,
		`flashgate_http_authz_rejected_total{reason="outside_prefix"} 1`,
		`flashgate_http_authz_rejected_total{reason="check_failed"} 0`,
		`flashgate_checks_total{decision="denied",domain="flashsale",rule="coupon_per_uid"} 2`,
	} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	if err := s.stop(); err != nil {
		t.Fatalf("serve: %v", err)
	}
	if _, err := http.Get("http://" + s.httpAuthzAddr + "/authz/x"); err == nil {
		t.Error("the HTTP front-end still answers after serve stopped")
	}
}

// TestServeHTTPFrontWarnsOfContextExtensions: rules that read Envoy's
// context_extensions, which no HTTP check carries, are named at start.
func TestServeHTTPFrontWarnsOfContextExtensions(t *testing.T) {
	file := filepath.Join(t.TempDir(), "rules.yaml")
	rules := `domain: d
sources:
  route: {context_extension: {key: route}}
  uid: {request_headers: {header_name: x-uid}}
descriptors:
  - key: route
    value: coupon
    descriptors:
      - key: uid
        name: per_route_uid
        rate_limit: {requests: 5, window: 1s}
  - key: uid
    name: plain_uid
    rate_limit: {requests: 5, window: 1s}
`
	if err := os.WriteFile(file, []byte(rules), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, front := range []bool{false, true} {
		args := []string{"--config", file}
		if front {
			args = append(args, "--http-authz-addr", "127.0.0.1:0")
		}
		s := startServe(t, args...)
		if err := s.stop(); err != nil {
			t.Fatalf("serve: %v", err)
		}
		logs := s.logs.String()
		warned := strings.Contains(logs, "context_extensions") && strings.Contains(logs, "per_route_uid")
		if warned != front || strings.Contains(logs, "plain_uid]") {
			t.Errorf("front-end %v: warned %v of the context_extensions rules (only per_route_uid); logs:\n%s", front, warned, logs)
		}
	}
}

// TestCheckHTTPFlags: over HTTP the peer, scheme and route are the
// connection's; --addr must be given.
func TestCheckHTTPFlags(t *testing.T) {
	for _, args := range [][]string{
		{"--addr", "127.0.0.1:1", "--ip", "192.0.2.1"},
		{"--addr", "127.0.0.1:1", "--scheme", "https"},
		{"--addr", "127.0.0.1:1", "--context-extension", "a=b"},
		{},
		{"--addr", "ftp://x"},
	} {
		all := append([]string{"check", "--api", "http", "--path", "/x"}, args...)
		if _, _, err := runCmd(t, context.Background(), all...); err == nil {
			t.Errorf("%v: no error", all)
		}
	}
	if _, _, err := runCmd(t, context.Background(), "check", "--api", "rls", "--path", "/x"); err == nil || !strings.Contains(err.Error(), "--api") {
		t.Errorf("--api rls: %v, want an error naming --api", err)
	}
}
