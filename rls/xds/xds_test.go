package xds_test

import (
	"context"
	"crypto/tls"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	commonrlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/flashgate/flashgate/enforce"
	"github.com/flashgate/flashgate/rls"
	"github.com/flashgate/flashgate/rls/xds"
	"github.com/flashgate/flashgate/rls/xds/xdstest"
	"github.com/flashgate/flashgate/window/memory"
)

const nodeID = "envoy-ratelimit"

// eventually polls cond with a generous deadline.
func eventually(t *testing.T, what string, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %v", what, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// newRLS returns an RLS server on the memory limiter with no config, and a
// running xDS client of server feeding it.
func newRLS(t *testing.T, server string, tlsCfg *tls.Config) (*rls.Server, *xds.Client, *prometheus.Registry) {
	t.Helper()
	mem, err := memory.New(memory.Options{})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	core, err := enforce.New(enforce.Options{Limiter: mem, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	empty, err := rls.ParseFiles(nil)
	if err != nil {
		t.Fatal(err)
	}
	s, err := rls.NewServer(empty, rls.Options{Core: core})
	if err != nil {
		t.Fatal(err)
	}
	c, err := xds.New(xds.Options{
		Server: server, NodeID: nodeID, NodeMetadata: xds.ParseMetadata("zone=a,bad,team=rl"),
		RetryInterval: 200 * time.Millisecond, TLS: tlsCfg, Apply: s.Pusher("xds://" + server),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return s, c, reg
}

// reloads returns flashgate_rls_config_reloads_total{result}.
func reloads(t *testing.T, reg *prometheus.Registry, result string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "flashgate_rls_config_reloads_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "result" && l.GetValue() == result {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	t.Fatalf("no flashgate_rls_config_reloads_total{result=%q}", result)
	return 0
}

func limitConf(name, domain string, n uint32) *rlsconfv3.RateLimitConfig {
	return xdstest.LimitConfig(name, domain, "key", n)
}

// ask asks s about domain's descriptor key=value.
func ask(s *rls.Server, domain, value string) (*rlsv3.RateLimitResponse, error) {
	return s.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: domain,
		Descriptors: []*commonrlv3.RateLimitDescriptor{{Entries: []*commonrlv3.RateLimitDescriptor_Entry{{Key: "key", Value: value}}}}})
}

// wantLimit waits until s answers domain's key=probe by a limit of want a
// minute (0: none, the domain unknown).
func wantLimit(t *testing.T, s *rls.Server, domain string, want uint32) {
	t.Helper()
	eventually(t, fmt.Sprintf("limit of %s", domain), func() error {
		resp, err := ask(s, domain, "probe")
		if err != nil {
			return err
		}
		if got := resp.GetStatuses()[0].GetCurrentLimit().GetRequestsPerUnit(); got != want {
			return fmt.Errorf("limit %d, want %d", got, want)
		}
		return nil
	})
}

// waitReply waits for the request that ACKs version, or NACKs when nack.
func waitReply(t *testing.T, cp *xdstest.ControlPlane, version string, nack bool) *discoveryv3.DiscoveryRequest {
	t.Helper()
	var r *discoveryv3.DiscoveryRequest
	eventually(t, fmt.Sprintf("reply to version %s", version), func() error {
		if r = cp.Reply(version, nack); r == nil {
			return fmt.Errorf("none among %d requests", len(cp.Requests()))
		}
		return nil
	})
	return r
}

// TestPushes: the client applies what the server pushes as the whole config
// (valid, updated, removed domains), ACKs each, NACKs a bad one while the
// config in force keeps answering, and sends ratelimit's node.
func TestPushes(t *testing.T) {
	cp := xdstest.Start(t, "127.0.0.1:0", nil)
	s, c, reg := newRLS(t, cp.Addr, nil)
	select {
	case <-c.Applied():
		t.Fatal("applied before any config was pushed")
	default:
	}

	cp.Push(t, nodeID, "1", limitConf("a", "alpha", 2), limitConf("b", "beta", 3))
	wantLimit(t, s, "alpha", 2)
	wantLimit(t, s, "beta", 3)
	waitReply(t, cp, "1", false)
	<-c.Applied()
	first := cp.Requests()[0]
	if first.GetNode().GetId() != nodeID || first.GetTypeUrl() != xds.TypeURL {
		t.Fatalf("first request: node %q, type %q", first.GetNode().GetId(), first.GetTypeUrl())
	}
	md := first.GetNode().GetMetadata().GetFields()
	if len(md) != 2 || md["zone"].GetStringValue() != "a" || md["team"].GetStringValue() != "rl" {
		t.Fatalf("node metadata %v, want zone=a, team=rl", md)
	}

	t.Run("invalid", func(t *testing.T) {
		bad := limitConf("a", "alpha", 9)
		bad.Descriptors[0].RateLimit.Unit = rlsconfv3.RateLimitUnit_UNKNOWN
		cp.Push(t, nodeID, "2", bad, limitConf("b", "beta", 9))
		r := waitReply(t, cp, "2", true)
		if r.GetVersionInfo() != "1" {
			t.Errorf("NACK carries version %q, want the one in force, 1", r.GetVersionInfo())
		}
		if msg := r.GetErrorDetail().GetMessage(); !strings.Contains(msg, "xds:a:") || !strings.Contains(msg, "unit") {
			t.Errorf("NACK error_detail %q, want the resource's FILE:LINE:COL error about its unit", msg)
		}
		if n := reloads(t, reg, "error"); n < 1 {
			t.Errorf("reloads{result=error} = %v, want the refused config counted", n)
		}
		wantLimit(t, s, "alpha", 2)
		wantLimit(t, s, "beta", 3)
	})
	t.Run("duplicate domain", func(t *testing.T) {
		before := cp.NACKs()
		cp.Push(t, nodeID, "3", limitConf("a", "alpha", 9), limitConf("a2", "alpha", 8))
		eventually(t, "a NACK of version 3", func() error {
			if cp.NACKs() == before {
				return fmt.Errorf("%d NACKs", before)
			}
			return nil
		})
		wantLimit(t, s, "alpha", 2)
	})
	t.Run("updated", func(t *testing.T) {
		cp.Push(t, nodeID, "4", limitConf("a", "alpha", 5), limitConf("b", "beta", 3))
		wantLimit(t, s, "alpha", 5)
		waitReply(t, cp, "4", false)
	})
	t.Run("removed", func(t *testing.T) {
		cp.Push(t, nodeID, "5", limitConf("a", "alpha", 5))
		wantLimit(t, s, "beta", 0)
		wantLimit(t, s, "alpha", 5)
		waitReply(t, cp, "5", false)
		if d := s.Config().Domain("beta"); d != nil {
			t.Fatalf("domain beta still loaded from %s", d.File)
		}
	})
	t.Run("enforced", func(t *testing.T) {
		for i := range 6 {
			resp, err := ask(s, "alpha", "enforced")
			if err != nil {
				t.Fatal(err)
			}
			want := rlsv3.RateLimitResponse_OK
			if i == 5 {
				want = rlsv3.RateLimitResponse_OVER_LIMIT
			}
			if resp.GetOverallCode() != want {
				t.Fatalf("request %d: %v, want %v", i+1, resp.GetOverallCode(), want)
			}
		}
	})
}

// TestReconnect: when the management server goes away, the config in force
// keeps answering; once it is back, a new stream gets the configs.
func TestReconnect(t *testing.T) {
	cp := xdstest.Start(t, "127.0.0.1:0", nil)
	s, _, _ := newRLS(t, cp.Addr, nil)
	cp.Push(t, nodeID, "1", limitConf("a", "alpha", 2))
	wantLimit(t, s, "alpha", 2)

	cp.Stop()
	wantLimit(t, s, "alpha", 2)
	cp2 := xdstest.Start(t, cp.Addr, nil)
	cp2.Push(t, nodeID, "7", limitConf("a", "alpha", 4))
	wantLimit(t, s, "alpha", 4)
	waitReply(t, cp2, "7", false)
}

// TestTLS: the client verifies the server against the CA file, and with
// mTLS presents its certificate.
func TestTLS(t *testing.T) {
	pki := xdstest.NewPKI(t)
	for name, mtls := range map[string]bool{"tls": false, "mtls": true} {
		t.Run(name, func(t *testing.T) {
			cp := xdstest.Start(t, "127.0.0.1:0", pki.ServerTLS(mtls))
			cert, key := "", ""
			if mtls {
				cert, key = pki.ClientCert, pki.ClientKey
			}
			clientCfg, err := xds.TLSConfig(cert, key, pki.CAFile, "")
			if err != nil {
				t.Fatal(err)
			}
			s, _, _ := newRLS(t, cp.Addr, clientCfg)
			cp.Push(t, nodeID, "1", limitConf("a", "alpha", 3))
			wantLimit(t, s, "alpha", 3)
			waitReply(t, cp, "1", false)
		})
	}
}

func TestTLSConfigErrors(t *testing.T) {
	pki := xdstest.NewPKI(t)
	notPEM := filepath.Join(t.TempDir(), "ca.txt")
	if err := os.WriteFile(notPEM, []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	for name, args := range map[string][3]string{
		"cert without key": {pki.ClientCert, "", ""},
		"missing CA":       {"", "", filepath.Join(t.TempDir(), "none.pem")},
		"CA not PEM":       {"", "", notPEM},
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := xds.TLSConfig(args[0], args[1], args[2], ""); err == nil {
				t.Fatal("no error")
			}
		})
	}
}
