// Package tlstest makes throw-away certificate authorities and the
// certificates they sign for tests, written as PEM files; no key is ever
// committed.
package tlstest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// CA is a test certificate authority.
type CA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	// PEM is the CA certificate.
	PEM []byte
}

// Pool returns a pool holding the CA certificate.
func (ca *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.cert)
	return p
}

// Pair is a certificate and key in PEM.
type Pair struct {
	Cert, Key []byte
}

// NewCA returns a new CA named name, valid for a day.
func NewCA(t testing.TB, name string) *CA {
	t.Helper()
	key := newKey(t)
	tmpl := &x509.Certificate{
		SerialNumber:          serial(t),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return &CA{cert: cert, key: key, PEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// Server returns a server certificate for 127.0.0.1, ::1 and localhost,
// with common name cn (which tells rotated certificates apart).
func (ca *CA) Server(t testing.TB, cn string) Pair {
	t.Helper()
	return ca.issue(t, &x509.Certificate{
		Subject:     pkix.Name{CommonName: cn},
		DNSNames:    []string{"localhost"},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	})
}

// Peer returns a certificate for 127.0.0.1, ::1 and localhost that serves
// both as a server's and as a client's, with common name cn: one file pair
// for a gRPC server and its own connections to another server, as Envoy
// Gateway mounts its envoy-rate-limit Secret.
func (ca *CA) Peer(t testing.TB, cn string) Pair {
	t.Helper()
	return ca.issue(t, &x509.Certificate{
		Subject:     pkix.Name{CommonName: cn},
		DNSNames:    []string{"localhost"},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	})
}

// Client returns a client certificate with common name cn.
func (ca *CA) Client(t testing.TB, cn string) Pair {
	t.Helper()
	return ca.issue(t, &x509.Certificate{
		Subject:     pkix.Name{CommonName: cn},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	})
}

func (ca *CA) issue(t testing.TB, tmpl *x509.Certificate) Pair {
	t.Helper()
	key := newKey(t)
	tmpl.SerialNumber = serial(t)
	tmpl.NotBefore = time.Now().Add(-time.Hour)
	tmpl.NotAfter = time.Now().Add(24 * time.Hour)
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return Pair{
		Cert: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		Key:  pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder}),
	}
}

// Write writes files (name → content) into dir, mode 0600.
func Write(t testing.TB, dir string, files map[string][]byte) {
	t.Helper()
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

// SecretDir lays files out as Kubernetes mounts a Secret: in a timestamped
// directory, dir/..data a symlink to it, and dir/NAME a symlink to
// ..data/NAME. Calling it again swaps ..data atomically to a new
// directory, as the kubelet does on an update.
type SecretDir struct {
	// Dir is the mount point.
	Dir string
	n   int
}

// NewSecretDir returns an empty mount point under t.TempDir().
func NewSecretDir(t testing.TB) *SecretDir {
	t.Helper()
	return &SecretDir{Dir: t.TempDir()}
}

// Path returns the path of file name in the mount.
func (s *SecretDir) Path(name string) string { return filepath.Join(s.Dir, name) }

// Update writes files into a new timestamped directory and swaps ..data to
// it (a rename of a new symlink over the old one).
func (s *SecretDir) Update(t testing.TB, files map[string][]byte) {
	t.Helper()
	s.n++
	ts := filepath.Join(s.Dir, "..2026_"+strconv.Itoa(s.n))
	if err := os.Mkdir(ts, 0o755); err != nil {
		t.Fatal(err)
	}
	Write(t, ts, files)
	tmp := filepath.Join(s.Dir, "..data_tmp")
	if err := os.Symlink(filepath.Base(ts), tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(s.Dir, "..data")); err != nil {
		t.Fatal(err)
	}
	for name := range files {
		link := filepath.Join(s.Dir, name)
		if _, err := os.Lstat(link); err == nil {
			continue
		}
		if err := os.Symlink(filepath.Join("..data", name), link); err != nil {
			t.Fatal(err)
		}
	}
}

func newKey(t testing.TB) *ecdsa.PrivateKey {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return key
}

func serial(t testing.TB) *big.Int {
	t.Helper()
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// PKI is a test PKI written into Dir: the CA in "ca.crt"; a server
// certificate of it for the loopback addresses (common name "server") in
// "tls.crt" and "tls.key"; a client certificate of it (common name
// "client") in "client.crt" and "client.key"; and a client certificate of
// Other, another CA (in "other-ca.crt"), in "stranger.crt" and
// "stranger.key".
type PKI struct {
	Dir       string
	CA, Other *CA
}

// NewPKI writes a new PKI into a directory under t.TempDir().
func NewPKI(t testing.TB) *PKI {
	t.Helper()
	p := &PKI{Dir: t.TempDir(), CA: NewCA(t, "test CA"), Other: NewCA(t, "other CA")}
	srv, cli, stranger := p.CA.Server(t, "server"), p.CA.Client(t, "client"), p.Other.Client(t, "stranger")
	Write(t, p.Dir, map[string][]byte{
		"ca.crt": p.CA.PEM, "tls.crt": srv.Cert, "tls.key": srv.Key,
		"client.crt": cli.Cert, "client.key": cli.Key,
		"other-ca.crt": p.Other.PEM, "stranger.crt": stranger.Cert, "stranger.key": stranger.Key,
	})
	return p
}

// Path returns the path of file name in the PKI's directory.
func (p *PKI) Path(name string) string { return filepath.Join(p.Dir, name) }
