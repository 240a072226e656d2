package main

import (
	"context"
	"crypto/tls"
	"io"
	"path/filepath"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/flashgate/flashgate/internal/checkreq"
	"github.com/flashgate/flashgate/internal/testing/tlstest"
)

// serveTLSFiles is a test PKI for the client and a Secret-style mount of
// the server's certificate "one" and the client CA.
type serveTLSFiles struct {
	*tlstest.PKI
	sec *tlstest.SecretDir
}

func newServeTLSFiles(t *testing.T) *serveTLSFiles {
	f := &serveTLSFiles{PKI: tlstest.NewPKI(t), sec: tlstest.NewSecretDir(t)}
	one := f.CA.Server(t, "one")
	f.sec.Update(t, map[string][]byte{"tls.crt": one.Cert, "tls.key": one.Key, "ca.crt": f.CA.PEM})
	return f
}

// handshakeCN opens a new mTLS connection to addr with the client's
// certificate and returns the common name of the server's certificate.
func (f *serveTLSFiles) handshakeCN(t *testing.T, addr string) string {
	t.Helper()
	pair, err := tls.LoadX509KeyPair(f.Path("client.crt"), f.Path("client.key"))
	if err != nil {
		t.Fatal(err)
	}
	c, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: f.CA.Pool(), ServerName: "127.0.0.1",
		Certificates: []tls.Certificate{pair}, NextProtos: []string{"h2"}})
	if err != nil {
		t.Fatalf("handshake: %v", err)
	}
	defer c.Close()
	return c.ConnectionState().PeerCertificates[0].Subject.CommonName
}

// TestServeTLS runs serve with --grpc-tls-cert, --grpc-tls-key and
// --grpc-tls-client-ca from a Secret-style mount: ext_authz (through
// flashgate check) and RLS answer an mTLS client; a client without a
// certificate or with one of another CA is refused; a swap of the mount
// makes new connections see the new certificate while an open one keeps
// working; a broken update keeps the certificate in force.
func TestServeTLS(t *testing.T) {
	f := newServeTLSFiles(t)
	s := startServe(t, "--rls-config", rlsDir(t), "--config", exampleStretched(t),
		"--grpc-tls-cert", f.sec.Path("tls.crt"), "--grpc-tls-key", f.sec.Path("tls.key"), "--grpc-tls-client-ca", f.sec.Path("ca.crt"))
	creds, err := (checkreq.TLS{CA: f.Path("ca.crt"), Cert: f.Path("client.crt"), Key: f.Path("client.key")}).DialOptions(s.grpcAddr)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(s.grpcAddr, creds...)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	waitFor(t, eventually, "SERVING over mTLS", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		r, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
		return err == nil && r.GetStatus() == healthpb.HealthCheckResponse_SERVING
	})

	check := func(args ...string) (string, error) {
		out, _, err := runCmd(t, context.Background(), append([]string{"check", "--addr", s.grpcAddr, "--path", "/api/coupon/1",
			"-H", "x-uid: tls", "--timeout", "10s"}, args...)...)
		return out, err
	}
	if out, err := check("--tls-ca", f.Path("ca.crt"), "--tls-cert", f.Path("client.crt"), "--tls-key", f.Path("client.key")); err != nil ||
		!strings.Contains(out, " allowed 200 ") {
		t.Fatalf("check over mTLS: %v\n%s", err, out)
	}
	for name, args := range map[string][]string{
		"plaintext":          nil,
		"no client cert":     {"--tls-ca", f.Path("ca.crt")},
		"cert of another CA": {"--tls-ca", f.Path("ca.crt"), "--tls-cert", f.Path("stranger.crt"), "--tls-key", f.Path("stranger.key")},
	} {
		if out, err := check(args...); err == nil {
			t.Errorf("%s: check answered:\n%s", name, out)
		}
	}

	rl := rlsv3.NewRateLimitServiceClient(conn)
	shouldRateLimit := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, err := rl.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{{
			Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "remote_address", Value: "203.0.113.9"}},
		}}})
		return err
	}
	if err := shouldRateLimit(); err != nil {
		t.Fatalf("ShouldRateLimit over mTLS: %v", err)
	}
	// check --api rls takes the same TLS flags.
	if out, _, err := runCmd(t, context.Background(), "check", "--api", "rls", "--addr", s.grpcAddr, "--domain", "edge", "--entry", "remote_address=203.0.113.10",
		"--timeout", "10s", "--tls-ca", f.Path("ca.crt"), "--tls-cert", f.Path("client.crt"), "--tls-key", f.Path("client.key")); err != nil ||
		!strings.Contains(out, " allowed 200 ") {
		t.Fatalf("check --api rls over mTLS: %v\n%s", err, out)
	}
	if out, _, err := runCmd(t, context.Background(), "check", "--api", "rls", "--addr", s.grpcAddr, "--domain", "edge", "--entry", "remote_address=203.0.113.10",
		"--timeout", "10s", "--tls-ca", f.Path("ca.crt")); err == nil {
		t.Errorf("check --api rls without a client certificate answered:\n%s", out)
	}

	// The kubelet's swap of the Secret: new handshakes get "two", the
	// connection open keeps answering.
	two := f.CA.Server(t, "two")
	f.sec.Update(t, map[string][]byte{"tls.crt": two.Cert, "tls.key": two.Key, "ca.crt": f.CA.PEM})
	waitFor(t, eventually, "the new certificate", func() bool { return f.handshakeCN(t, s.grpcAddr) == "two" })
	if err := shouldRateLimit(); err != nil {
		t.Fatalf("ShouldRateLimit on the connection opened before the swap: %v", err)
	}

	// A key that does not match: "two" stays, the failure is counted.
	f.sec.Update(t, map[string][]byte{"tls.crt": f.CA.Server(t, "three").Cert, "tls.key": two.Key, "ca.crt": f.CA.PEM})
	waitFor(t, eventually, "the failed reload counted", func() bool {
		_, m := httpGet(t, "http://"+s.httpAddr+"/metrics")
		return strings.Contains(m, `flashgate_tls_reloads_total{result="error"} 1`)
	})
	if got := f.handshakeCN(t, s.grpcAddr); got != "two" {
		t.Fatalf("certificate after a bad update %q, want two", got)
	}
	if _, m := httpGet(t, "http://"+s.httpAddr+"/metrics"); !strings.Contains(m, `flashgate_tls_reloads_total{result="ok"} 1`) {
		t.Errorf("/metrics lacks one successful reload:\n%s", grepLines(m, "flashgate_tls"))
	}
	if !strings.Contains(s.logs.String(), "keeping the certificate in force") {
		t.Errorf("the failed reload is not logged:\n%s", s.logs)
	}
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// TestServeTLSStartErrors: TLS flags that cannot work stop serve before
// it listens, naming the flags.
func TestServeTLSStartErrors(t *testing.T) {
	ca := tlstest.NewCA(t, "test CA")
	one, two := ca.Server(t, "one"), ca.Server(t, "two")
	dir := t.TempDir()
	tlstest.Write(t, dir, map[string][]byte{"one.crt": one.Cert, "one.key": one.Key, "two.key": two.Key, "junk": []byte("junk\n")})
	p := func(name string) string { return filepath.Join(dir, name) }
	for name, tc := range map[string]struct {
		args    []string
		environ map[string]string
		want    string
	}{
		"cert without key":   {[]string{"--grpc-tls-cert", p("one.crt")}, nil, "--grpc-tls-cert and --grpc-tls-key go together"},
		"key from env alone": {nil, map[string]string{"FLASHGATE_GRPC_TLS_KEY": p("one.key")}, "--grpc-tls-cert and --grpc-tls-key go together"},
		"client CA alone":    {[]string{"--grpc-tls-client-ca", p("junk")}, nil, "--grpc-tls-client-ca needs --grpc-tls-cert"},
		"missing cert":       {[]string{"--grpc-tls-cert", p("none.crt"), "--grpc-tls-key", p("one.key")}, nil, "no such file"},
		"mismatched key":     {[]string{"--grpc-tls-cert", p("one.crt"), "--grpc-tls-key", p("two.key")}, nil, "does not match"},
		"junk client CA": {nil, map[string]string{"FLASHGATE_GRPC_TLS_CERT": p("one.crt"), "FLASHGATE_GRPC_TLS_KEY": p("one.key"),
			"FLASHGATE_GRPC_TLS_CLIENT_CA": p("junk")}, "no PEM certificate"},
	} {
		t.Run(name, func(t *testing.T) {
			err := runEnv(context.Background(), append([]string{"serve", "--grpc-addr", "127.0.0.1:0", "--http-addr", ""}, tc.args...),
				env{stdout: io.Discard, stderr: io.Discard, lookupEnv: func(k string) (string, bool) { v, ok := tc.environ[k]; return v, ok }})
			if err == nil || !strings.Contains(errorLine(err), tc.want) {
				t.Fatalf("err = %v, want %q in it", err, tc.want)
			}
		})
	}
}

// TestCheckTLSFlagsOnHTTP: the TLS flags are for the gRPC API only.
func TestCheckTLSFlagsOnHTTP(t *testing.T) {
	_, _, err := runCmd(t, context.Background(), "check", "--api", "http", "--addr", "127.0.0.1:1", "--path", "/", "--tls")
	if err == nil || !strings.Contains(err.Error(), "--tls applies to --api authz only") {
		t.Fatalf("err = %v, want --tls refused with --api http", err)
	}
}
