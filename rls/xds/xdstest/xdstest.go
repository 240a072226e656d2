// Package xdstest runs an in-process xDS management server of ratelimit
// configs (go-control-plane's ADS server on its snapshot cache) and makes a
// test PKI, for the tests of the xds client and of serve.
package xdstest

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
)

// ControlPlane is an xDS server that records the requests it receives.
type ControlPlane struct {
	// Addr is the address it listens on.
	Addr  string
	cache cachev3.SnapshotCache
	gs    *grpc.Server

	// mu guards reqs.
	mu   sync.Mutex
	reqs []*discoveryv3.DiscoveryRequest
}

// Start serves on addr ("127.0.0.1:0": a free port) with TLS when tlsCfg is
// not nil; the test's cleanup stops it.
func Start(t testing.TB, addr string, tlsCfg *tls.Config) *ControlPlane {
	t.Helper()
	cp := &ControlPlane{cache: cachev3.NewSnapshotCache(true, cachev3.IDHash{}, nil)}
	cb := serverv3.CallbackFuncs{StreamRequestFunc: func(_ int64, r *discoveryv3.DiscoveryRequest) error {
		cp.mu.Lock()
		defer cp.mu.Unlock()
		cp.reqs = append(cp.reqs, r)
		return nil
	}}
	ctx, cancel := context.WithCancel(context.Background())
	var opts []grpc.ServerOption
	if tlsCfg != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(tlsCfg)))
	}
	cp.gs = grpc.NewServer(opts...)
	discoveryv3.RegisterAggregatedDiscoveryServiceServer(cp.gs, serverv3.NewServer(ctx, cp.cache, cb))
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
		cancel()
		t.Fatal(err)
	}
	cp.Addr = lis.Addr().String()
	go func() { _ = cp.gs.Serve(lis) }()
	t.Cleanup(func() { cp.gs.Stop(); cancel() })
	return cp
}

// Stop stops the server, cutting its streams.
func (cp *ControlPlane) Stop() { cp.gs.Stop() }

// Push sets node's snapshot: version and configs, the whole config.
func (cp *ControlPlane) Push(t testing.TB, node, version string, confs ...*rlsconfv3.RateLimitConfig) {
	t.Helper()
	res := make([]types.Resource, len(confs))
	for i, c := range confs {
		res[i] = c
	}
	snap, err := cachev3.NewSnapshot(version, map[resourcev3.Type][]types.Resource{resourcev3.RateLimitConfigType: res})
	if err != nil {
		t.Fatal(err)
	}
	if err := cp.cache.SetSnapshot(context.Background(), node, snap); err != nil {
		t.Fatal(err)
	}
}

// Requests returns the requests received so far.
func (cp *ControlPlane) Requests() []*discoveryv3.DiscoveryRequest {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	return append([]*discoveryv3.DiscoveryRequest(nil), cp.reqs...)
}

// Reply returns the first request that ACKs version (nack false) or NACKs
// a response (nack true), nil if none came yet.
func (cp *ControlPlane) Reply(version string, nack bool) *discoveryv3.DiscoveryRequest {
	for _, r := range cp.Requests() {
		if r.GetResponseNonce() == "" {
			continue
		}
		if nack && r.GetErrorDetail() != nil || !nack && r.GetErrorDetail() == nil && r.GetVersionInfo() == version {
			return r
		}
	}
	return nil
}

// NACKs counts the NACKs received.
func (cp *ControlPlane) NACKs() int {
	n := 0
	for _, r := range cp.Requests() {
		if r.GetErrorDetail() != nil {
			n++
		}
	}
	return n
}

// LimitConfig is a config of domain limiting each value of descriptor key
// to n a minute.
func LimitConfig(name, domain, key string, n uint32) *rlsconfv3.RateLimitConfig {
	return &rlsconfv3.RateLimitConfig{Name: name, Domain: domain, Descriptors: []*rlsconfv3.RateLimitDescriptor{{
		Key:       key,
		RateLimit: &rlsconfv3.RateLimitPolicy{Unit: rlsconfv3.RateLimitUnit_MINUTE, RequestsPerUnit: n},
	}}}
}

// PKI is a test CA with a server certificate for 127.0.0.1 and a client
// certificate, the CA and the client's as PEM files.
type PKI struct {
	// Pool holds the CA.
	Pool *x509.CertPool
	// Server is the server's certificate and key.
	Server tls.Certificate
	// CAFile, ClientCert and ClientKey are PEM files in a temporary
	// directory.
	CAFile, ClientCert, ClientKey string
}

// ServerTLS returns the server's TLS config, asking for a client
// certificate of the CA when mtls.
func (p *PKI) ServerTLS(mtls bool) *tls.Config {
	cfg := &tls.Config{Certificates: []tls.Certificate{p.Server}, MinVersion: tls.VersionTLS12}
	if mtls {
		cfg.ClientAuth = tls.RequireAndVerifyClientCert
		cfg.ClientCAs = p.Pool
	}
	return cfg
}

// NewPKI makes a PKI, its files in a directory of the test's.
func NewPKI(t testing.TB) *PKI {
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
	p := &PKI{Pool: x509.NewCertPool(), CAFile: filepath.Join(dir, "ca.pem")}
	p.Pool.AddCert(ca)
	writePEM(t, p.CAFile, "CERTIFICATE", caDER)
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
	p.Server = tls.Certificate{Certificate: [][]byte{sDER}, PrivateKey: sKey}
	cDER, cKey := leaf(3, x509.ExtKeyUsageClientAuth)
	p.ClientCert, p.ClientKey = filepath.Join(dir, "client.pem"), filepath.Join(dir, "client-key.pem")
	writePEM(t, p.ClientCert, "CERTIFICATE", cDER)
	kDER, err := x509.MarshalECPrivateKey(cKey)
	if err != nil {
		t.Fatal(err)
	}
	writePEM(t, p.ClientKey, "EC PRIVATE KEY", kDER)
	return p
}

func newKey(t testing.TB) *ecdsa.PrivateKey {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func writePEM(t testing.TB, path, typ string, der []byte) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}
