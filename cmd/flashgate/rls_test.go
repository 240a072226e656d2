package main

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"

	"github.com/flashgate/flashgate/enforce/enforcetest"
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
				// The rate-limit headers of --ratelimit-headers (both), as
				// the draft spells them, beside ratelimit's.
				var ours []*corev3.HeaderValue
				for _, h := range resp.GetResponseHeadersToAdd() {
					if h.GetKey() == strings.ToLower(h.GetKey()) {
						ours = append(ours, h)
					}
				}
				if got := enforcetest.ReadHeaders(t, enforcetest.HeaderValues(t, ours)); len(got.States) != 1 || got.Limit != 2 {
					t.Errorf("rate-limit headers %v, want one RateLimit item and x-ratelimit-limit 2", ours)
				}
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
	want := `^\S*b\.yaml:1:1: duplicate domain "twice"`
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
