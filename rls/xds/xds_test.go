package xds_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	commonrlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/flashgate/flashgate/enforce"
	"github.com/flashgate/flashgate/rls"
	"github.com/flashgate/flashgate/rls/xds"
	"github.com/flashgate/flashgate/window/memory"
)

const nodeID = "envoy-ratelimit"

// controlPlane is an in-process go-control-plane xDS server (ADS, snapshot
// cache) that records the requests it receives.
type controlPlane struct {
	cache cachev3.SnapshotCache
	addr  string
	gs    *grpc.Server

	mu   sync.Mutex
	reqs []*discoveryv3.DiscoveryRequest
}

// startControlPlane serves on addr ("127.0.0.1:0" for a free port) with
// creds (nil: plaintext), sharing cache when not nil.
func startControlPlane(t *testing.T, addr string, creds credentials.TransportCredentials, cache cachev3.SnapshotCache) *controlPlane {
	t.Helper()
	if cache == nil {
		cache = cachev3.NewSnapshotCache(true, cachev3.IDHash{}, nil)
	}
	cp := &controlPlane{cache: cache}
	cb := serverv3.CallbackFuncs{StreamRequestFunc: func(_ int64, r *discoveryv3.DiscoveryRequest) error {
		cp.mu.Lock()
		defer cp.mu.Unlock()
		cp.reqs = append(cp.reqs, r)
		return nil
	}}
	ctx, cancel := context.WithCancel(context.Background())
	srv := serverv3.NewServer(ctx, cache, cb)
	var opts []grpc.ServerOption
	if creds != nil {
		opts = append(opts, grpc.Creds(creds))
	}
	cp.gs = grpc.NewServer(opts...)
	discoveryv3.RegisterAggregatedDiscoveryServiceServer(cp.gs, srv)
	var lis net.Listener
	var err error
	deadline := time.Now().Add(30 * time.Second)
	for {
		// The port of a stopped server may take a moment to be free again.
		if lis, err = net.Listen("tcp", addr); err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	cp.addr = lis.Addr().String()
	go func() { _ = cp.gs.Serve(lis) }()
	t.Cleanup(func() { cp.gs.Stop(); cancel() })
	return cp
}

// push sets the node's snapshot: version and configs.
func (cp *controlPlane) push(t *testing.T, version string, confs ...*rlsconfv3.RateLimitConfig) {
	t.Helper()
	res := make([]types.Resource, len(confs))
	for i, c := range confs {
		res[i] = c
	}
	snap, err := cachev3.NewSnapshot(version, map[resourcev3.Type][]types.Resource{resourcev3.RateLimitConfigType: res})
	if err != nil {
		t.Fatal(err)
	}
	if err := cp.cache.SetSnapshot(context.Background(), nodeID, snap); err != nil {
		t.Fatal(err)
	}
}

// requests returns the requests received so far.
func (cp *controlPlane) requests() []*discoveryv3.DiscoveryRequest {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	return append([]*discoveryv3.DiscoveryRequest(nil), cp.reqs...)
}

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
func newRLS(t *testing.T, server string, tlsCfg *tls.Config) (*rls.Server, *xds.Client) {
	t.Helper()
	mem, err := memory.New(memory.Options{})
	if err != nil {
		t.Fatal(err)
	}
	core, err := enforce.New(enforce.Options{Limiter: mem, Registerer: prometheus.NewRegistry()})
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
	return s, c
}

// limitConf is a config of domain limiting each value of descriptor key
// to n a minute.
func limitConf(name, domain string, n uint32) *rlsconfv3.RateLimitConfig {
	return &rlsconfv3.RateLimitConfig{Name: name, Domain: domain, Descriptors: []*rlsconfv3.RateLimitDescriptor{{
		Key:       "key",
		RateLimit: &rlsconfv3.RateLimitPolicy{Unit: rlsconfv3.RateLimitUnit_MINUTE, RequestsPerUnit: n},
	}}}
}

// limitOf asks s about domain's descriptor key=probe and returns the limit
// it answers by (0: none, the domain or descriptor unknown).
func limitOf(s *rls.Server, domain string) (uint32, error) {
	resp, err := s.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: domain,
		Descriptors: []*commonrlv3.RateLimitDescriptor{{Entries: []*commonrlv3.RateLimitDescriptor_Entry{{Key: "key", Value: "probe"}}}}})
	if err != nil {
		return 0, err
	}
	return resp.GetStatuses()[0].GetCurrentLimit().GetRequestsPerUnit(), nil
}

func wantLimit(t *testing.T, s *rls.Server, domain string, want uint32) {
	t.Helper()
	eventually(t, fmt.Sprintf("limit of %s", domain), func() error {
		got, err := limitOf(s, domain)
		if err != nil {
			return err
		}
		if got != want {
			return fmt.Errorf("limit %d, want %d", got, want)
		}
		return nil
	})
}

// acked waits for the request that ACKs version, or NACKs it when nack.
func (cp *controlPlane) waitReply(t *testing.T, version string, nack bool) *discoveryv3.DiscoveryRequest {
	t.Helper()
	var found *discoveryv3.DiscoveryRequest
	eventually(t, fmt.Sprintf("reply to version %s", version), func() error {
		for _, r := range cp.requests() {
			if r.GetResponseNonce() == "" {
				continue
			}
			if nack && r.GetErrorDetail() != nil || !nack && r.GetErrorDetail() == nil && r.GetVersionInfo() == version {
				found = r
				return nil
			}
		}
		return fmt.Errorf("none among %d requests", len(cp.requests()))
	})
	return found
}

// TestPushes: the client applies what the server pushes as the whole config
// (valid, updated, removed domains), ACKs each, NACKs a bad one while the
// config in force keeps answering, and sends ratelimit's node.
func TestPushes(t *testing.T) {
	cp := startControlPlane(t, "127.0.0.1:0", nil, nil)
	s, c := newRLS(t, cp.addr, nil)
	select {
	case <-c.Applied():
		t.Fatal("applied before any config was pushed")
	default:
	}

	cp.push(t, "1", limitConf("a", "alpha", 2), limitConf("b", "beta", 3))
	wantLimit(t, s, "alpha", 2)
	wantLimit(t, s, "beta", 3)
	cp.waitReply(t, "1", false)
	<-c.Applied()
	first := cp.requests()[0]
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
		cp.push(t, "2", bad, limitConf("b", "beta", 9))
		r := cp.waitReply(t, "2", true)
		if r.GetVersionInfo() != "1" {
			t.Errorf("NACK carries version %q, want the one in force, 1", r.GetVersionInfo())
		}
		t.Logf("NACK: %s", r.GetErrorDetail().GetMessage())
		wantLimit(t, s, "alpha", 2)
		wantLimit(t, s, "beta", 3)
	})
	t.Run("duplicate domain", func(t *testing.T) {
		cp.push(t, "3", limitConf("a", "alpha", 9), limitConf("a2", "alpha", 8))
		eventually(t, "two NACKs", func() error {
			n := 0
			for _, r := range cp.requests() {
				if r.GetErrorDetail() != nil {
					n++
				}
			}
			if n < 2 {
				return fmt.Errorf("%d NACKs", n)
			}
			return nil
		})
		wantLimit(t, s, "alpha", 2)
	})
	t.Run("updated", func(t *testing.T) {
		cp.push(t, "4", limitConf("a", "alpha", 5), limitConf("b", "beta", 3))
		wantLimit(t, s, "alpha", 5)
		cp.waitReply(t, "4", false)
	})
	t.Run("removed", func(t *testing.T) {
		cp.push(t, "5", limitConf("a", "alpha", 5))
		wantLimit(t, s, "beta", 0)
		wantLimit(t, s, "alpha", 5)
		cp.waitReply(t, "5", false)
		if d := s.Config().Domain("beta"); d != nil {
			t.Fatalf("domain beta still loaded from %s", d.File)
		}
	})
	t.Run("enforced", func(t *testing.T) {
		for i := range 6 {
			resp, err := s.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "alpha",
				Descriptors: []*commonrlv3.RateLimitDescriptor{{Entries: []*commonrlv3.RateLimitDescriptor_Entry{{Key: "key", Value: "enforced"}}}}})
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
	cp := startControlPlane(t, "127.0.0.1:0", nil, nil)
	s, _ := newRLS(t, cp.addr, nil)
	cp.push(t, "1", limitConf("a", "alpha", 2))
	wantLimit(t, s, "alpha", 2)

	cp.gs.Stop()
	wantLimit(t, s, "alpha", 2)
	cp2 := startControlPlane(t, cp.addr, nil, nil)
	cp2.push(t, "7", limitConf("a", "alpha", 4))
	wantLimit(t, s, "alpha", 4)
	cp2.waitReply(t, "7", false)
}

// TestTLS: the client verifies the server against the CA file, and with
// mTLS presents its certificate.
func TestTLS(t *testing.T) {
	pki := newPKI(t)
	for name, mtls := range map[string]bool{"tls": false, "mtls": true} {
		t.Run(name, func(t *testing.T) {
			serverCfg := &tls.Config{Certificates: []tls.Certificate{pki.server}, MinVersion: tls.VersionTLS12}
			cert, key := "", ""
			if mtls {
				serverCfg.ClientAuth = tls.RequireAndVerifyClientCert
				serverCfg.ClientCAs = pki.pool
				cert, key = pki.clientCert, pki.clientKey
			}
			cp := startControlPlane(t, "127.0.0.1:0", credentials.NewTLS(serverCfg), nil)
			clientCfg, err := xds.TLSConfig(cert, key, pki.caFile, "")
			if err != nil {
				t.Fatal(err)
			}
			s, _ := newRLS(t, cp.addr, clientCfg)
			cp.push(t, "1", limitConf("a", "alpha", 3))
			wantLimit(t, s, "alpha", 3)
			cp.waitReply(t, "1", false)
		})
	}
}

func TestTLSConfigErrors(t *testing.T) {
	pki := newPKI(t)
	for name, args := range map[string][3]string{
		"cert without key": {pki.clientCert, "", ""},
		"missing CA":       {"", "", filepath.Join(t.TempDir(), "none.pem")},
		"CA not PEM":       {"", "", pki.clientKey + ".txt"},
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := xds.TLSConfig(args[0], args[1], args[2], ""); err == nil {
				t.Fatal("no error")
			}
		})
	}
}

// pki is a test CA with a server certificate for 127.0.0.1 and a client
// certificate, written as PEM files.
type pki struct {
	pool                          *x509.CertPool
	server                        tls.Certificate
	caFile, clientCert, clientKey string
}

func newPKI(t *testing.T) *pki {
	t.Helper()
	dir := t.TempDir()
	caKey := newKey(t)
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	p := &pki{pool: x509.NewCertPool(), caFile: filepath.Join(dir, "ca.pem")}
	p.pool.AddCert(ca)
	writePEM(t, p.caFile, "CERTIFICATE", caDER)
	leaf := func(serial int64, usage x509.ExtKeyUsage) ([]byte, *ecdsa.PrivateKey) {
		key := newKey(t)
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: "leaf"},
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage},
			IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		return der, key
	}
	sDER, sKey := leaf(2, x509.ExtKeyUsageServerAuth)
	p.server = tls.Certificate{Certificate: [][]byte{sDER}, PrivateKey: sKey}
	cDER, cKey := leaf(3, x509.ExtKeyUsageClientAuth)
	p.clientCert, p.clientKey = filepath.Join(dir, "client.pem"), filepath.Join(dir, "client-key.pem")
	writePEM(t, p.clientCert, "CERTIFICATE", cDER)
	kDER, err := x509.MarshalECPrivateKey(cKey)
	if err != nil {
		t.Fatal(err)
	}
	writePEM(t, p.clientKey, "EC PRIVATE KEY", kDER)
	if err := os.WriteFile(p.clientKey+".txt", []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func newKey(t *testing.T) *ecdsa.PrivateKey {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func writePEM(t *testing.T, path, typ string, der []byte) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}
