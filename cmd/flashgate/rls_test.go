package main

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/mem"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/protobuf/proto"

	"github.com/flashgate/flashgate/rls"
	"github.com/flashgate/flashgate/window/redistest"
)

// rlsDir writes a ratelimit runtime directory (DIR/config/*.yaml) with one
// domain: 2 per minute per remote address.
func rlsDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.Mkdir(filepath.Join(dir, "config"), 0o755); err != nil {
		t.Fatal(err)
	}
	yaml := "domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit:\n      unit: minute\n      requests_per_unit: 2\n"
	if err := os.WriteFile(filepath.Join(dir, "config", "edge.yaml"), []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestServeRLS runs serve with --rls-config on a free port, memory and
// redis backends, and calls ShouldRateLimit through go-control-plane's
// generated client on the ext_authz port: 2 OK, then OVER_LIMIT, with
// ratelimit's headers; the service is SERVING (under its own name too) and
// listed by reflection.
func TestServeRLS(t *testing.T) {
	rs := redistest.Start(t)
	for name, args := range map[string][]string{
		"memory": nil,
		"redis":  {"--backend", "redis", "--redis-addr", rs.Addr(), "--redis-timeout", "500ms", "--fleet-size", "1"},
		// ratelimit's LIMIT_*_HEADER settings
		"header-names": {"--rls-header-names", "X-RL-Limit,X-RL-Remaining,X-RL-Reset"},
	} {
		remainingHeader := rls.DefaultHeaderNames().Remaining
		if name == "header-names" {
			remainingHeader = "X-RL-Remaining"
		}
		t.Run(name, func(t *testing.T) {
			s := startServe(t, append([]string{"--rls-config", rlsDir(t), "--rls-response-headers", "--key-prefix", "rls" + name}, args...)...)
			waitFor(t, eventually, "SERVING", func() bool { return grpcHealth(t, s.grpcAddr) == healthpb.HealthCheckResponse_SERVING })
			conn, err := grpc.NewClient(s.grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			client := rlsv3.NewRateLimitServiceClient(conn)
			req := &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{{
				Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "remote_address", Value: "203.0.113.9"}},
			}}}
			var codes, remaining []string
			for range 3 {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				resp, err := client.ShouldRateLimit(ctx, req)
				cancel()
				if err != nil {
					t.Fatalf("ShouldRateLimit: %v", err)
				}
				codes = append(codes, resp.GetOverallCode().String())
				for _, h := range resp.GetResponseHeadersToAdd() {
					if h.GetKey() == remainingHeader {
						remaining = append(remaining, h.GetValue())
					}
				}
			}
			if got := strings.Join(codes, ","); got != "OK,OK,OVER_LIMIT" {
				t.Fatalf("codes %s, want OK,OK,OVER_LIMIT", got)
			}
			if got := strings.Join(remaining, ","); got != "1,0,0" {
				t.Fatalf("%s %s, want 1,0,0", remainingHeader, got)
			}
			if !reflectionLists(t, conn, rls.ServiceName) {
				t.Fatalf("reflection does not list %s", rls.ServiceName)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			h, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: rls.ServiceName})
			if err != nil || h.GetStatus() != healthpb.HealthCheckResponse_SERVING {
				t.Fatalf("health of %s = %v, %v; want SERVING", rls.ServiceName, h.GetStatus(), err)
			}
		})
	}
}

// reflectionLists reports whether gRPC reflection lists service.
func reflectionLists(t *testing.T, conn *grpc.ClientConn, service string) bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	stream, err := reflectionpb.NewServerReflectionClient(conn).ServerReflectionInfo(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}); err != nil {
		t.Fatal(err)
	}
	resp, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range resp.GetListServicesResponse().GetService() {
		if s.GetName() == service {
			return true
		}
	}
	return false
}

// TestServeRLSBadConfig: a bad directory stops serve before it listens,
// with FILE:LINE:COL.
func TestServeRLSBadConfig(t *testing.T) {
	_, _, err := runCmd(t, context.Background(), "serve", "--grpc-addr", "127.0.0.1:0", "--http-addr", "",
		"--rls-config", "../../rls/testdata/bad_duplicate_domain")
	want := `^flashgate: .*b\.yaml:1:1: duplicate domain "twice"`
	if err == nil || !regexp.MustCompile(want).MatchString(errorLine(err)) {
		t.Fatalf("error %v, want %q", err, want)
	}
}

func TestValidateRLS(t *testing.T) {
	out, _, err := runCmd(t, context.Background(), "validate", "--rls-config", "../../rls/testdata/good")
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range []string{"domain basic", "remote_address_50.0.0.5", "specific_limit", "replaces=specific_limit", "168h0m0s", "unlimited",
		"failure_mode=deny local_share=1 ban=3/10s:1m0s", "ban=off"} {
		if !strings.Contains(out, w) {
			t.Errorf("output lacks %q:\n%s", w, out)
		}
	}
	_, _, err = runCmd(t, context.Background(), "validate", "--rls-config", "../../rls/testdata/bad_duplicate_domain")
	if err == nil {
		t.Fatal("no error for a bad directory")
	}
}

// TestBenchRLS: bench --api rls sends ShouldRateLimit requests of one
// descriptor per user to serve --rls-config and counts OK and OVER_LIMIT
// answers: one user, 2 per minute, so exactly 2 are allowed.
func TestBenchRLS(t *testing.T) {
	dir := rlsDir(t)
	// A second domain: two keys of different limits, the tighter one binding.
	pair := "domain: pair\ndescriptors:\n  - key: a\n    rate_limit: {unit: minute, requests_per_unit: 3}\n" +
		"  - key: b\n    rate_limit: {unit: minute, requests_per_unit: 1}\n"
	if err := os.WriteFile(filepath.Join(dir, "config", "pair.yaml"), []byte(pair), 0o644); err != nil {
		t.Fatal(err)
	}
	s := startServe(t, "--rls-config", dir, "--key-prefix", "benchrls")
	waitFor(t, eventually, "SERVING", func() bool { return grpcHealth(t, s.grpcAddr) == healthpb.HealthCheckResponse_SERVING })
	r := benchJSON(t, "--addr", s.grpcAddr, "--api", "rls", "--domain", "edge", "--descriptor-key", "remote_address",
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
		r = benchJSON(t, "--addr", s.grpcAddr, "--api", "rls", "--domain", "pair", "--descriptor-key", tc.keys,
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
	r = benchJSON(t, "--addr", s.grpcAddr, "--api", "rls", "--domain", "nowhere",
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
		_, _, err := runCmd(t, context.Background(), append([]string{"bench", "--addr", "127.0.0.1:1", "--duration", "1s"}, args...)...)
		if err == nil || strings.Contains(err.Error(), "cannot reach") {
			t.Errorf("bench %v: err %v, want the option refused", args, err)
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
