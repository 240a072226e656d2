package main

import (
	"context"
	"encoding/json"
	"regexp"
	"strings"
	"testing"
	"time"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"github.com/flashgate/flashgate/internal/checkreq"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
)

// TestServeRLSOnly: serve with --rls-config and no --config is a ratelimit
// service only: ShouldRateLimit answers (asked by check --api rls, lines
// and JSON), while ext_authz is not served (Check is UNIMPLEMENTED, its
// health unknown) and the built-in example is neither enforced nor
// announced. With --config too, both are served.
func TestServeRLSOnly(t *testing.T) {
	s := startServe(t, "--rls-config", rlsDir(t))
	waitFor(t, eventually, "SERVING", func() bool { return grpcHealth(t, s.grpcAddr) == healthpb.HealthCheckResponse_SERVING })

	out, _, err := runCmd(t, context.Background(), "check", "--api", "rls", "--addr", s.grpcAddr, "--domain", "edge",
		"--entry", "remote_address=203.0.113.7", "-n", "3", "--timeout", "10s")
	if err != nil {
		t.Fatalf("check --api rls: %v\n%s", err, out)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	want := []*regexp.Regexp{
		regexp.MustCompile(`^#1 allowed 200 \S+ .* descriptors: OK 2/minute remaining=1 reset=60s$`),
		regexp.MustCompile(`^#2 allowed 200 \S+ .* descriptors: OK 2/minute remaining=0 reset=(59|60)s$`), // 59 when over a second passed since #1
		regexp.MustCompile(`^#3 denied 429 \S+ .*retry-after: \d+.* body: \{.* descriptors: OVER_LIMIT 2/minute remaining=0 reset=\d+s$`),
	}
	if len(lines) != len(want) {
		t.Fatalf("%d lines, want %d:\n%s", len(lines), len(want), out)
	}
	for i, re := range want {
		if !re.MatchString(lines[i]) {
			t.Errorf("line %d:\n%s\nwant %s", i+1, lines[i], re)
		}
	}
	out, _, err = runCmd(t, context.Background(), "check", "--api", "rls", "--addr", s.grpcAddr, "--domain", "edge",
		"--entry", "remote_address=203.0.113.8", "--json", "--timeout", "10s")
	if err != nil {
		t.Fatalf("check --api rls --json: %v\n%s", err, out)
	}
	var res checkreq.Result
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if !res.Allowed || res.Code != "OK" || len(res.Statuses) != 1 || res.Statuses[0] != (checkreq.RLSStatus{Code: "OK", Limit: 2, Unit: "minute", Remaining: 1, ResetSeconds: 60}) {
		t.Errorf("JSON answer %+v", res)
	}

	// ext_authz is not served.
	_, _, err = runCmd(t, context.Background(), "check", "--addr", s.grpcAddr, "--path", "/api/coupon/1", "-H", "x-uid: u", "--timeout", "10s")
	if err == nil || !strings.Contains(err.Error(), "Unimplemented") {
		t.Fatalf("ext_authz check on an RLS-only serve: %v, want Unimplemented", err)
	}
	conn, err := grpc.NewClient(s.grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: authv3.Authorization_ServiceDesc.ServiceName})
	if status.Code(err) != codes.NotFound {
		t.Errorf("health of ext_authz on an RLS-only serve: %v, want NotFound", err)
	}
	if logs := s.logs.String(); strings.Contains(logs, "built-in example") || !strings.Contains(logs, "ext_authz is not served") {
		t.Errorf("logs of an RLS-only serve:\n%s", logs)
	}

	both := startServe(t, "--rls-config", rlsDir(t), "--config", exampleStretched(t))
	waitFor(t, eventually, "SERVING", func() bool { return grpcHealth(t, both.grpcAddr) == healthpb.HealthCheckResponse_SERVING })
	if out, _, err := runCmd(t, context.Background(), "check", "--addr", both.grpcAddr, "--path", "/api/coupon/1", "-H", "x-uid: u", "--timeout", "10s"); err != nil ||
		!strings.Contains(out, " allowed 200 ") {
		t.Fatalf("ext_authz beside the RLS: %v\n%s", err, out)
	}
	if out, _, err := runCmd(t, context.Background(), "check", "--api", "rls", "--addr", both.grpcAddr, "--domain", "edge", "--entry", "remote_address=1.2.3.4", "--timeout", "10s"); err != nil ||
		!strings.Contains(out, " allowed 200 ") {
		t.Fatalf("RLS beside ext_authz: %v\n%s", err, out)
	}
}

// TestCheckRLSFlags: the flags of --api rls and of the HTTP APIs do not mix.
func TestCheckRLSFlags(t *testing.T) {
	for name, tc := range map[string]struct {
		args []string
		want string
	}{
		"no domain":         {[]string{"--api", "rls", "--entry", "a=b"}, "needs --domain and at least one --entry"},
		"no entry":          {[]string{"--api", "rls", "--domain", "d"}, "needs --domain and at least one --entry"},
		"bad entry":         {[]string{"--api", "rls", "--domain", "d", "--entry", "novalue"}, "want key=value"},
		"path with rls":     {[]string{"--api", "rls", "--domain", "d", "--entry", "a=b", "--path", "/x"}, "--path does not apply to --api rls"},
		"header with rls":   {[]string{"--api", "rls", "--domain", "d", "--entry", "a=b", "-H", "a: b"}, "--header does not apply to --api rls"},
		"domain with authz": {[]string{"--path", "/x", "--domain", "d"}, "--domain applies to --api rls only"},
		"entry with http":   {[]string{"--api", "http", "--addr", "127.0.0.1:1", "--path", "/x", "--entry", "a=b"}, "--entry applies to --api rls only"},
		"authz needs path":  {nil, `required flag(s) "path" not set`},
		"unknown api":       {[]string{"--api", "nope", "--path", "/x"}, "want authz, http or rls"},
	} {
		t.Run(name, func(t *testing.T) {
			_, _, err := runCmd(t, context.Background(), append([]string{"check"}, tc.args...)...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want %q", err, tc.want)
			}
		})
	}
}
