package e2e

// ratelimit's xDS state-of-the-world integration cases (its
// test/integration/xds_sotw_integration_test.go at commit f2fb157:
// testXdsProviderBasicConfig, testXdsProviderBasicConfigReload), run as the
// directory suite of ratelimit_suite_test.go is, against the binary run
// as ratelimit in ratelimit's environment (CONFIG_TYPE=GRPC_XDS_SOTW and
// its CONFIG_GRPC_XDS_* variables) whose config an in-process
// go-control-plane xDS server pushes; over plaintext, TLS and mTLS on both
// sides (its gRPC server, GRPC_SERVER_USE_TLS, and its connection to the
// xDS server, CONFIG_GRPC_XDS_SERVER_USE_TLS).

import (
	"context"
	"crypto/tls"
	"fmt"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/flashgate/flashgate/internal/testing/tlstest"
	"github.com/flashgate/flashgate/rls/xds/xdstest"
	"github.com/flashgate/flashgate/window/redistest"
)

// rlXDSNode is ratelimit's node id of these cases.
const rlXDSNode = "init-test-node"

// rlXDSConfig is a RateLimitConfig of domain whose descriptors are
// (key, unit, requests per unit) triples.
func rlXDSConfig(domain string, limits ...any) *rlsconfv3.RateLimitConfig {
	c := &rlsconfv3.RateLimitConfig{Name: domain, Domain: domain}
	for i := 0; i+2 < len(limits); i += 3 {
		c.Descriptors = append(c.Descriptors, &rlsconfv3.RateLimitDescriptor{
			Key:       limits[i].(string),
			RateLimit: &rlsconfv3.RateLimitPolicy{Unit: limits[i+1].(rlsconfv3.RateLimitUnit), RequestsPerUnit: uint32(limits[i+2].(int))},
		})
	}
	return c
}

// rlXDSInitial is ratelimit's initialXdsBasicConfig.
func rlXDSInitial() []*rlsconfv3.RateLimitConfig {
	const (
		sec, min = rlsconfv3.RateLimitUnit_SECOND, rlsconfv3.RateLimitUnit_MINUTE
		hour     = rlsconfv3.RateLimitUnit_HOUR
		day      = rlsconfv3.RateLimitUnit_DAY
	)
	return []*rlsconfv3.RateLimitConfig{
		rlXDSConfig("basic", "key1", sec, 50, "key1_local", sec, 50, "one_per_minute", min, 1),
		rlXDSConfig("another", "key2", min, 20, "key3", hour, 10, "key2_local", min, 20, "key3_local", hour, 10,
			"key4", day, 20, "key4_local", day, 20),
	}
}

// rlXDSReload is the domain newConfigWithXdsConfigProvider adds.
func rlXDSReload() *rlsconfv3.RateLimitConfig {
	return rlXDSConfig("reload", "key1", rlsconfv3.RateLimitUnit_SECOND, 50, "block", rlsconfv3.RateLimitUnit_SECOND, 0,
		"one_per_minute", rlsconfv3.RateLimitUnit_MINUTE, 1)
}

// TestRatelimitSuiteXDS runs ratelimit's xDS cases on a standalone Redis,
// the transport plaintext, TLS (flashgate verifies the xDS server, the
// test client verifies flashgate) and mTLS (each side also presents a
// client certificate the other requires), and logs the tally of each.
func TestRatelimitSuiteXDS(t *testing.T) {
	rs := redistest.Start(t)
	for _, transport := range []string{"plaintext", "tls", "mtls"} {
		t.Run(transport, func(t *testing.T) {
			pki := tlstest.NewPKI(t)
			var serverTLS, clientTLS *tls.Config
			var tlsEnv []string // ratelimit's TLS variables
			if transport != "plaintext" {
				srv, err := tls.LoadX509KeyPair(pki.Path("tls.crt"), pki.Path("tls.key"))
				if err != nil {
					t.Fatal(err)
				}
				serverTLS = &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{srv}}
				clientTLS = &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: pki.CA.Pool()}
				tlsEnv = []string{"GRPC_SERVER_USE_TLS=true", "GRPC_SERVER_TLS_CERT=" + pki.Path("tls.crt"), "GRPC_SERVER_TLS_KEY=" + pki.Path("tls.key"),
					"CONFIG_GRPC_XDS_SERVER_USE_TLS=true", "CONFIG_GRPC_XDS_SERVER_TLS_CACERT=" + pki.Path("ca.crt")}
				if transport == "mtls" {
					serverTLS.ClientAuth, serverTLS.ClientCAs = tls.RequireAndVerifyClientCert, pki.CA.Pool()
					cli, err := tls.LoadX509KeyPair(pki.Path("client.crt"), pki.Path("client.key"))
					if err != nil {
						t.Fatal(err)
					}
					clientTLS.Certificates = []tls.Certificate{cli}
					tlsEnv = append(tlsEnv, "GRPC_CLIENT_TLS_CACERT="+pki.Path("ca.crt"),
						"CONFIG_GRPC_XDS_CLIENT_TLS_CERT="+pki.Path("client.crt"), "CONFIG_GRPC_XDS_CLIENT_TLS_KEY="+pki.Path("client.key"))
				}
			}
			cp := xdstest.Start(t, "127.0.0.1:0", serverTLS)
			version := 0
			push := func(confs ...*rlsconfv3.RateLimitConfig) string {
				version++
				v := fmt.Sprint(version)
				cp.Push(t, rlXDSNode, v, confs...)
				return v
			}
			push(rlXDSInitial()...)

			tally := newRLTally()
			seq := 0
			start := func(t *testing.T, v rlVariant) *rlRun {
				t.Helper()
				seq++
				// ratelimit's environment; each run its own CACHE_KEY_PREFIX,
				// as the runs share one Redis.
				env := append(rlRedis("single", rs.Addr(), ""), "CACHE_KEY_PREFIX="+fmt.Sprintf("rlxds-%s-%d:", transport, seq),
					"CONFIG_TYPE=GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_SERVER_URL="+cp.Addr, "CONFIG_GRPC_XDS_NODE_ID="+rlXDSNode,
					"CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL=200ms")
				env = append(append(env, tlsEnv...), v.env()...)
				p := startRatelimit(t, launchOpts{clientTLS: clientTLS}, env...)
				if transport == "mtls" {
					refuseWithoutClientCert(t, p.GRPCAddr, pki)
				}
				return &rlRun{t: t, v: v, tally: tally, client: rlsv3.NewRateLimitServiceClient(p.conn), p: p}
			}
			// ratelimit's TestXdsProviderBasicConfig without a per-second Redis.
			for _, v := range rlVariants {
				if v.stopIncrement || v.keyPrefix != "" {
					continue
				}
				t.Run("BasicConfig/"+v.name, func(t *testing.T) { testRLBasic(start(t, v)) })
			}
			// ratelimit's TestXdsProviderBasicConfigReload: a snapshot with
			// the domain reload, then the first one again.
			t.Run("ConfigReload", func(t *testing.T) {
				r := start(t, rlVariants[0])
				testRLReload(r, func() { push(append(rlXDSInitial(), rlXDSReload())...) }, func() { push(rlXDSInitial()...) })
			})
			// Not one of ratelimit's cases: a config the loader refuses is
			// NACKed, counted as a failed reload, and the config in force
			// keeps answering.
			t.Run("Invalid", func(t *testing.T) {
				r := start(t, rlVariants[0])
				errorsBefore := r.p.Metrics().Value("flashgate_rls_config_reloads_total", "result", "error")
				bad := rlXDSInitial()
				bad[0].Descriptors[0].RateLimit.Unit = rlsconfv3.RateLimitUnit_UNKNOWN
				v := push(bad...)
				if _, ok := waitFor(60*time.Second, func() bool { return cp.Reply(v, true) != nil }); !ok {
					t.Fatalf("no NACK of version %s", v)
				}
				if after := r.p.Metrics().Value("flashgate_rls_config_reloads_total", "result", "error"); after <= errorsBefore {
					t.Errorf("flashgate_rls_config_reloads_total{result=error} %v, then %v after a refused config", errorsBefore, after)
				}
				got := r.ask("basic", [][2]string{{"key1", "invalid-" + transport}})
				if st := got.GetStatuses()[0]; st.GetCurrentLimit().GetRequestsPerUnit() != 50 || st.GetLimitRemaining() != 49 {
					t.Errorf("after the refused config: %v, want the config in force (50 a second, 49 remaining)", got)
				}
				push(rlXDSInitial()...)
			})
			tally.finish(t, "xDS over "+transport)
		})
	}
}

// refuseWithoutClientCert checks that the mTLS gRPC server at addr refuses
// a client that trusts it but presents no certificate.
func refuseWithoutClientCert(t *testing.T, addr string, pki *tlstest.PKI) {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{MinVersion: tls.VersionTLS12, RootCAs: pki.CA.Pool()})))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{}); err == nil {
		t.Fatalf("the mTLS server at %s answered a client without a certificate", addr)
	}
}
