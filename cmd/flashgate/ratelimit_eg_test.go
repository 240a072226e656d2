package main

import (
	"context"
	"crypto/tls"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/flashgate/flashgate/internal/testing/logtest"
	"github.com/flashgate/flashgate/internal/testing/tlstest"
	"github.com/flashgate/flashgate/rls/xds/xdstest"
	"github.com/flashgate/flashgate/window/redistest"
)

// egDefaultEnv is the environment Envoy Gateway gives the rate limit
// container by default (envoyproxy/gateway
// internal/infrastructure/kubernetes/ratelimit/resource.go,
// expectedRateLimitContainerEnv, and its testdata/deployments/default.yaml at
// commit d32f282), with a Redis URL and Prometheus left on: the certificate
// directory (/certs in the Pod) is certs, the xDS server
// (envoy-gateway:18001) is xdsURL.
func egDefaultEnv(certs, xdsURL, redisURL string) map[string]string {
	return map[string]string{
		"RUNTIME_ROOT":                       "/data",
		"RUNTIME_SUBDIRECTORY":               "ratelimit",
		"RUNTIME_IGNOREDOTFILES":             "true",
		"RUNTIME_WATCH_ROOT":                 "false",
		"LOG_LEVEL":                          "info",
		"USE_STATSD":                         "false",
		"CONFIG_TYPE":                        "GRPC_XDS_SOTW",
		"CONFIG_GRPC_XDS_SERVER_URL":         xdsURL,
		"CONFIG_GRPC_XDS_NODE_ID":            "envoy-ratelimit",
		"GRPC_SERVER_USE_TLS":                "true",
		"GRPC_SERVER_TLS_CERT":               filepath.Join(certs, "tls.crt"),
		"GRPC_SERVER_TLS_KEY":                filepath.Join(certs, "tls.key"),
		"GRPC_SERVER_TLS_CA_CERT":            filepath.Join(certs, "ca.crt"),
		"CONFIG_GRPC_XDS_SERVER_USE_TLS":     "true",
		"CONFIG_GRPC_XDS_CLIENT_TLS_CERT":    filepath.Join(certs, "tls.crt"),
		"CONFIG_GRPC_XDS_CLIENT_TLS_KEY":     filepath.Join(certs, "tls.key"),
		"CONFIG_GRPC_XDS_SERVER_TLS_CACERT":  filepath.Join(certs, "ca.crt"),
		"FORCE_START_WITHOUT_INITIAL_CONFIG": "true",
		"REDIS_SOCKET_TYPE":                  "tcp",
		"REDIS_URL":                          redisURL,
		"USE_PROMETHEUS":                     "true",
		"PROMETHEUS_ADDR":                    ":19001",
		"PROMETHEUS_MAPPER_YAML":             "/etc/statsd-exporter/conf.yaml",
	}
}

// TestBinaryAsRatelimitEnvoyGateway runs the binary as /bin/ratelimit with
// exactly Envoy Gateway's default environment (its listeners moved to free
// loopback ports, its files to a test PKI): one certificate (server and
// client) serves the gRPC server over mTLS and identifies the process to an
// mTLS xDS server, as Envoy Gateway's envoy-rate-limit Secret does. GET
// /healthcheck turns 200 (FORCE_START_WITHOUT_INITIAL_CONFIG), the xDS
// server's RateLimitConfig is ACKed for node envoy-ratelimit, and
// ShouldRateLimit over mTLS answers by it; a client without a certificate
// is refused.
func TestBinaryAsRatelimitEnvoyGateway(t *testing.T) {
	rs := redistest.Start(t)
	ca := tlstest.NewCA(t, "envoy-gateway CA")
	certs := t.TempDir()
	peer, gateway, envoy := ca.Peer(t, "envoy-ratelimit"), ca.Server(t, "envoy-gateway"), ca.Client(t, "envoy")
	tlstest.Write(t, certs, map[string][]byte{"tls.crt": peer.Cert, "tls.key": peer.Key, "ca.crt": ca.PEM})

	gwCert, err := tls.X509KeyPair(gateway.Cert, gateway.Key)
	if err != nil {
		t.Fatal(err)
	}
	cp := xdstest.Start(t, "127.0.0.1:0", &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{gwCert},
		ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: ca.Pool()})

	bin := filepath.Join(t.TempDir(), "ratelimit")
	if err := os.Symlink(buildBinary(t), bin); err != nil {
		t.Fatal(err)
	}
	port, grpcPort, debugPort := loopbackPort(t), loopbackPort(t), loopbackPort(t)
	vars := egDefaultEnv(certs, cp.Addr, rs.Addr())
	for k, v := range map[string]string{"HOST": "127.0.0.1", "PORT": port, "GRPC_HOST": "127.0.0.1", "GRPC_PORT": grpcPort,
		"DEBUG_HOST": "127.0.0.1", "DEBUG_PORT": debugPort} {
		vars[k] = v
	}
	cmd := exec.Command(bin)
	for k, v := range vars {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	logs := &logtest.Buffer{}
	startProcess(t, cmd, logs)

	waitFor(t, 2*eventually, "/healthcheck 200", func() bool {
		code, _ := httpDo(t, http.MethodGet, "http://127.0.0.1:"+port+"/healthcheck", "")
		return code == http.StatusOK
	})

	cp.Push(t, "envoy-ratelimit", "1", &rlsconfv3.RateLimitConfig{Name: "default/eg/http", Domain: "default/eg/http",
		Descriptors: []*rlsconfv3.RateLimitDescriptor{{
			Key: "rule-0-match-0", Value: "rule-0-match-0",
			Descriptors: []*rlsconfv3.RateLimitDescriptor{{
				Key:       "rule-0-match-1",
				RateLimit: &rlsconfv3.RateLimitPolicy{Unit: rlsconfv3.RateLimitUnit_MINUTE, RequestsPerUnit: 2},
			}},
		}}})
	waitFor(t, 2*eventually, "the ACK of version 1", func() bool { return cp.Reply("1", false) != nil })
	if r := cp.Requests()[0]; r.GetNode().GetId() != "envoy-ratelimit" {
		t.Errorf("xDS node id %q, want envoy-ratelimit", r.GetNode().GetId())
	}

	envoyCert, err := tls.X509KeyPair(envoy.Cert, envoy.Key)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient("127.0.0.1:"+grpcPort, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{
		MinVersion: tls.VersionTLS12, RootCAs: ca.Pool(), Certificates: []tls.Certificate{envoyCert}})))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := rlsv3.NewRateLimitServiceClient(conn)
	req := &rlsv3.RateLimitRequest{Domain: "default/eg/http", Descriptors: []*ratelimitv3.RateLimitDescriptor{{
		Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "rule-0-match-0", Value: "rule-0-match-0"}, {Key: "rule-0-match-1", Value: "10.0.0.1"}},
	}}}
	var codes []string
	for range 3 {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		resp, err := client.ShouldRateLimit(ctx, req)
		cancel()
		if err != nil {
			t.Fatalf("ShouldRateLimit over mTLS: %v\n%s", err, logs)
		}
		codes = append(codes, resp.GetOverallCode().String())
	}
	if got := strings.Join(codes, ","); got != "OK,OK,OVER_LIMIT" {
		t.Fatalf("codes %s, want OK,OK,OVER_LIMIT (2 a minute, pushed by xDS)\n%s", got, logs)
	}

	anon, err := grpc.NewClient("127.0.0.1:"+grpcPort, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{
		MinVersion: tls.VersionTLS12, RootCAs: ca.Pool()})))
	if err != nil {
		t.Fatal(err)
	}
	defer anon.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := healthpb.NewHealthClient(anon).Check(ctx, &healthpb.HealthCheckRequest{}); err == nil {
		t.Error("a client without a certificate was answered over GRPC_SERVER_USE_TLS with GRPC_SERVER_TLS_CA_CERT")
	}

	out := logs.String()
	for _, v := range []string{"USE_PROMETHEUS=", "PROMETHEUS_ADDR=", "PROMETHEUS_MAPPER_YAML="} {
		if !strings.Contains(out, v) {
			t.Errorf("the log does not name %s as not honoured:\n%s", v, out)
		}
	}
}
