package host_test

import (
	"context"
	"crypto/tls"
	"net"
	"testing"
	"time"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/flashgate/flashgate/host"
	"github.com/flashgate/flashgate/internal/testing/tlstest"
	"github.com/flashgate/flashgate/internal/tlsreload"
)

// TestTLS: with Options.TLS the gRPC listener serves ext_authz, RLS and
// health over mTLS only: a client with a certificate of the CA is
// answered; one without a certificate, with one of another CA, or in
// plaintext is refused.
func TestTLS(t *testing.T) {
	p := tlstest.NewPKI(t).Path
	reg := prometheus.NewRegistry()
	r, err := tlsreload.New(tlsreload.Options{Files: tlsreload.Files{Cert: p("tls.crt"), Key: p("tls.key"), CA: p("ca.crt")}, Registry: reg})
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := r.ServerConfig()
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h, err := host.New(host.Options{GRPC: lis, GRPCMaxConns: 8, Registry: reg, TLS: cfg})
	if err != nil {
		t.Fatal(err)
	}
	authv3.RegisterAuthorizationServer(h, okAuth{})
	rlsv3.RegisterRateLimitServiceServer(h, okRLS{})
	h.SetServing(true)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = h.Serve(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done; h.Stop() })

	creds := func(files tlsreload.Files) grpc.DialOption {
		c, err := tlsreload.New(tlsreload.Options{Files: files})
		if err != nil {
			t.Fatal(err)
		}
		return grpc.WithTransportCredentials(credentials.NewTLS(c.ClientConfig("127.0.0.1")))
	}
	for name, tc := range map[string]struct {
		creds grpc.DialOption
		ok    bool
	}{
		"client cert":        {creds(tlsreload.Files{Cert: p("client.crt"), Key: p("client.key"), CA: p("ca.crt")}), true},
		"no client cert":     {creds(tlsreload.Files{CA: p("ca.crt")}), false},
		"cert of another CA": {creds(tlsreload.Files{Cert: p("stranger.crt"), Key: p("stranger.key"), CA: p("ca.crt")}), false},
		"plaintext":          {grpc.WithTransportCredentials(insecure.NewCredentials()), false},
		"no CA to verify":    {grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{MinVersion: tls.VersionTLS12})), false},
	} {
		t.Run(name, func(t *testing.T) {
			conn, err := grpc.NewClient(h.GRPCAddr(), tc.creds)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			cctx, ccancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer ccancel()
			_, errAuthz := authv3.NewAuthorizationClient(conn).Check(cctx, &authv3.CheckRequest{})
			_, errRLS := rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(cctx, &rlsv3.RateLimitRequest{})
			hr, errHealth := healthpb.NewHealthClient(conn).Check(cctx, &healthpb.HealthCheckRequest{})
			if tc.ok {
				if errAuthz != nil || errRLS != nil || errHealth != nil || hr.GetStatus() != healthpb.HealthCheckResponse_SERVING {
					t.Fatalf("Check: %v; ShouldRateLimit: %v; health %v, %v", errAuthz, errRLS, hr.GetStatus(), errHealth)
				}
				return
			}
			if errAuthz == nil || errRLS == nil || errHealth == nil {
				t.Fatalf("answered without the right certificate: Check: %v; ShouldRateLimit: %v; health: %v", errAuthz, errRLS, errHealth)
			}
		})
	}
}
