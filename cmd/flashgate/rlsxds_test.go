package main

import (
	"context"
	"crypto/tls"
	"os"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/flashgate/flashgate/internal/testing/tlstest"
	"github.com/flashgate/flashgate/rls/xds/xdstest"
	"github.com/flashgate/flashgate/window/redistest"
)

// TestServeRLSXDS runs serve with --rls-xds-server on an in-process xDS
// server, plaintext and mTLS, on the memory backend and on Redis: health
// waits for the first config, then ShouldRateLimit answers by it and by
// its update.
func TestServeRLSXDS(t *testing.T) {
	pki := xdstest.NewPKI(t)
	rs := redistest.Start(t)
	for name, tc := range map[string]struct {
		mtls  bool
		redis bool
	}{"plaintext": {}, "mtls": {mtls: true}, "redis-mtls": {mtls: true, redis: true}} {
		t.Run(name, func(t *testing.T) {
			args := []string{"--rls-xds-node-id", "envoy-ratelimit", "--rls-xds-retry-interval", "200ms"}
			if tc.redis {
				args = append(args, "--backend", "redis", "--redis-addr", rs.Addr(), "--redis-timeout", "500ms", "--fleet-size", "1", "--key-prefix", "xds"+name)
			}
			var cp *xdstest.ControlPlane
			if tc.mtls {
				cp = xdstest.Start(t, "127.0.0.1:0", pki.ServerTLS(true))
				args = append(args, "--rls-xds-tls", "--rls-xds-tls-cert", pki.ClientCert, "--rls-xds-tls-key", pki.ClientKey, "--rls-xds-tls-ca", pki.CAFile)
			} else {
				cp = xdstest.Start(t, "127.0.0.1:0", nil)
			}
			s := startServe(t, append([]string{"--rls-xds-server", cp.Addr}, args...)...)
			// The stream is open and the backend ready (memory: at once),
			// but no config came: not serving.
			waitFor(t, eventually, "the xDS stream", func() bool { return len(cp.Requests()) > 0 })
			if st := grpcHealth(t, s.grpcAddr); st == healthpb.HealthCheckResponse_SERVING {
				t.Fatalf("SERVING before a config was pushed")
			}
			cp.Push(t, "envoy-ratelimit", "1", xdstest.LimitConfig("edge", "edge", "remote_address", 2))
			waitFor(t, eventually, "SERVING", func() bool { return grpcHealth(t, s.grpcAddr) == healthpb.HealthCheckResponse_SERVING })
			if got := rlsCodes(t, s.grpcAddr, "203.0.113.1", 3); got != "OK,OK,OVER_LIMIT" {
				t.Fatalf("codes %s, want OK,OK,OVER_LIMIT", got)
			}
			cp.Push(t, "envoy-ratelimit", "2", xdstest.LimitConfig("edge", "edge", "remote_address", 3))
			waitFor(t, eventually, "the update", func() bool { return cp.Reply("2", false) != nil })
			if got := rlsCodes(t, s.grpcAddr, "203.0.113.2", 4); got != "OK,OK,OK,OVER_LIMIT" {
				t.Fatalf("codes %s, want OK,OK,OK,OVER_LIMIT", got)
			}
		})
	}
}

// TestServeRLSXDSForceStart: with --rls-xds-force-start, serve is ready
// with no xDS server at all, and answers OK for every domain.
func TestServeRLSXDSForceStart(t *testing.T) {
	cp := xdstest.Start(t, "127.0.0.1:0", nil)
	addr := cp.Addr
	cp.Stop()
	s := startServe(t, "--rls-xds-server", addr, "--rls-xds-force-start", "--rls-xds-retry-interval", "1s")
	waitFor(t, eventually, "SERVING", func() bool { return grpcHealth(t, s.grpcAddr) == healthpb.HealthCheckResponse_SERVING })
	if got := rlsCodes(t, s.grpcAddr, "203.0.113.1", 3); got != "OK,OK,OK" {
		t.Fatalf("codes %s, want OK,OK,OK", got)
	}
}

// rlsCodes sends n ShouldRateLimit of domain edge, remote_address=ip, and
// returns the overall codes.
func rlsCodes(t *testing.T, addr, ip string, n int) string {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := rlsv3.NewRateLimitServiceClient(conn)
	req := &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{{
		Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "remote_address", Value: ip}},
	}}}
	var codes []string
	for range n {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		resp, err := client.ShouldRateLimit(ctx, req)
		cancel()
		if err != nil {
			t.Fatalf("ShouldRateLimit: %v", err)
		}
		codes = append(codes, resp.GetOverallCode().String())
	}
	return strings.Join(codes, ",")
}

// xdsServerTLS is an xDS server's TLS config: pair, and client
// certificates of clientCA required.
func xdsServerTLS(t *testing.T, pair tlstest.Pair, clientCA *tlstest.CA) *tls.Config {
	t.Helper()
	cert, err := tls.X509KeyPair(pair.Cert, pair.Key)
	if err != nil {
		t.Fatal(err)
	}
	return &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{cert},
		ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: clientCA.Pool()}
}

// TestServeRLSXDSCertReload: the xDS client's certificate and CA files
// (ratelimit's CONFIG_GRPC_XDS_CLIENT_TLS_CERT, _KEY and
// CONFIG_GRPC_XDS_SERVER_TLS_CACERT), mounted as a Kubernetes Secret, are
// reloaded when the Secret changes: a client certificate the mTLS xDS server
// refuses gets no config until a good one is mounted, and a server moved to
// a certificate of a new CA is trusted once the new CA bundle is mounted.
func TestServeRLSXDSCertReload(t *testing.T) {
	const node = "envoy-ratelimit"
	pki := tlstest.NewPKI(t)
	read := func(name string) []byte {
		b, err := os.ReadFile(pki.Path(name))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	serverPair := tlstest.Pair{Cert: read("tls.crt"), Key: read("tls.key")}
	cp := xdstest.Start(t, "127.0.0.1:0", xdsServerTLS(t, serverPair, pki.CA))
	cp.Push(t, node, "1", xdstest.LimitConfig("edge", "edge", "remote_address", 2))

	secret := tlstest.NewSecretDir(t)
	secret.Update(t, map[string][]byte{"tls.crt": read("stranger.crt"), "tls.key": read("stranger.key"), "ca.crt": pki.CA.PEM})
	s := startServe(t, "--rls-xds-server", cp.Addr, "--rls-xds-node-id", node, "--rls-xds-retry-interval", "200ms",
		"--rls-xds-tls", "--rls-xds-tls-cert", secret.Path("tls.crt"), "--rls-xds-tls-key", secret.Path("tls.key"),
		"--rls-xds-tls-ca", secret.Path("ca.crt"))
	// (Stream failures are logged at most once in a while: each phase waits
	// for its own error.)
	logged := func(s1 string) func() bool { return func() bool { return strings.Contains(s.logs.String(), s1) } }

	// A client certificate of another CA: the server refuses every stream.
	// The client reads the server's alert ("unknown certificate authority")
	// or, when it wrote before reading it, a broken pipe or a reset: the
	// refusal is a failed stream to a server that got no request.
	waitFor(t, 2*eventually, "a stream refused for the client certificate", logged("xds stream failed"))
	if n := len(cp.Requests()); n != 0 {
		t.Fatalf("the xDS server got %d requests from a client certificate it does not trust", n)
	}
	if st := grpcHealth(t, s.grpcAddr); st == healthpb.HealthCheckResponse_SERVING {
		t.Fatal("SERVING without a config")
	}

	// The Secret gets a certificate of the server's CA: reloaded, the
	// next stream is accepted.
	secret.Update(t, map[string][]byte{"tls.crt": read("client.crt"), "tls.key": read("client.key"), "ca.crt": pki.CA.PEM})
	waitFor(t, 2*eventually, "SERVING on the pushed config", func() bool {
		return grpcHealth(t, s.grpcAddr) == healthpb.HealthCheckResponse_SERVING
	})
	if got := rlsCodes(t, s.grpcAddr, "203.0.113.1", 3); got != "OK,OK,OVER_LIMIT" {
		t.Fatalf("codes %s, want OK,OK,OVER_LIMIT", got)
	}

	// The server moves to a certificate of a new CA: not trusted until the
	// Secret's CA bundle holds the new CA.
	rotated := tlstest.NewCA(t, "rotated CA")
	cp.Stop()
	cp2 := xdstest.Start(t, cp.Addr, xdsServerTLS(t, rotated.Server(t, "rotated server"), pki.CA))
	cp2.Push(t, node, "2", xdstest.LimitConfig("edge", "edge", "remote_address", 3))
	waitFor(t, 2*eventually, "a reconnection refused for the server's new CA", logged("x509: certificate signed by unknown authority"))
	if r := cp2.Reply("2", false); r != nil {
		t.Fatal("version 2 ACKed from a server of a CA the client does not trust")
	}
	secret.Update(t, map[string][]byte{"tls.crt": read("client.crt"), "tls.key": read("client.key"), "ca.crt": rotated.PEM})
	waitFor(t, 2*eventually, "version 2 ACKed", func() bool { return cp2.Reply("2", false) != nil })
	if got := rlsCodes(t, s.grpcAddr, "203.0.113.2", 4); got != "OK,OK,OK,OVER_LIMIT" {
		t.Fatalf("codes %s, want OK,OK,OK,OVER_LIMIT", got)
	}
	if n := strings.Count(s.logs.String(), "tls files reloaded"); n < 2 {
		t.Errorf("%d reloads of the xDS TLS files logged, want 2\n%s", n, s.logs)
	}
}
