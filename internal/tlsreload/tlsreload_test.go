package tlsreload_test

import (
	"context"
	"crypto/tls"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/flashgate/flashgate/internal/testing/tlstest"
	"github.com/flashgate/flashgate/internal/tlsreload"
)

// echoServer serves cfg on a loopback port, echoing what it reads; it
// returns the address.
func echoServer(t *testing.T, cfg *tls.Config) string {
	t.Helper()
	lis, err := tls.Listen("tcp", "127.0.0.1:0", cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lis.Close() })
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); _, _ = io.Copy(c, c) }()
		}
	}()
	return lis.Addr().String()
}

// dial handshakes with addr and returns the connection (closed at the end
// of the test) or the handshake's error.
func dial(t *testing.T, addr string, cfg *tls.Config) (*tls.Conn, error) {
	t.Helper()
	c, err := tls.Dial("tcp", addr, cfg)
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() { c.Close() })
	// A client certificate refused shows on the first read (TLS 1.3).
	if err := echo(c); err != nil {
		return nil, err
	}
	return c, nil
}

func echo(c *tls.Conn) error {
	if _, err := c.Write([]byte("ping")); err != nil {
		return err
	}
	b := make([]byte, 4)
	_, err := io.ReadFull(c, b)
	return err
}

func peerCN(c *tls.Conn) string { return c.ConnectionState().PeerCertificates[0].Subject.CommonName }

// TestRotateSecret: a Secret-style symlink swap is reloaded; new
// handshakes get the new certificate, the open connection keeps working; a
// broken update keeps the certificate in force and is counted.
func TestRotateSecret(t *testing.T) {
	ca := tlstest.NewCA(t, "test CA")
	one, two := ca.Server(t, "one"), ca.Server(t, "two")
	sec := tlstest.NewSecretDir(t)
	sec.Update(t, map[string][]byte{"tls.crt": one.Cert, "tls.key": one.Key})
	reg := prometheus.NewRegistry()
	r, err := tlsreload.New(tlsreload.Options{
		Files:    tlsreload.Files{Cert: sec.Path("tls.crt"), Key: sec.Path("tls.key")},
		Name:     "grpc",
		Registry: reg,
	})
	if err != nil {
		t.Fatal(err)
	}
	srvCfg, err := r.ServerConfig()
	if err != nil {
		t.Fatal(err)
	}
	addr := echoServer(t, srvCfg)
	client := &tls.Config{RootCAs: ca.Pool(), ServerName: "127.0.0.1"}

	old, err := dial(t, addr, client)
	if err != nil {
		t.Fatal(err)
	}
	if got := peerCN(old); got != "one" {
		t.Fatalf("certificate %q, want one", got)
	}
	if changed, err := r.Reload(); changed || err != nil {
		t.Fatalf("Reload of unchanged files = %v, %v; want false, nil", changed, err)
	}

	sec.Update(t, map[string][]byte{"tls.crt": two.Cert, "tls.key": two.Key})
	if changed, err := r.Reload(); !changed || err != nil {
		t.Fatalf("Reload after the swap = %v, %v; want true, nil", changed, err)
	}
	c, err := dial(t, addr, client)
	if err != nil {
		t.Fatal(err)
	}
	if got := peerCN(c); got != "two" {
		t.Fatalf("certificate after the swap %q, want two", got)
	}
	if err := echo(old); err != nil {
		t.Fatalf("the connection opened before the swap: %v", err)
	}

	// A key that does not match its certificate keeps "two".
	sec.Update(t, map[string][]byte{"tls.crt": one.Cert, "tls.key": two.Key})
	if changed, err := r.Reload(); changed || err == nil {
		t.Fatalf("Reload of a mismatched pair = %v, %v; want false and an error", changed, err)
	}
	c, err = dial(t, addr, client)
	if err != nil {
		t.Fatal(err)
	}
	if got := peerCN(c); got != "two" {
		t.Fatalf("certificate after a bad update %q, want two", got)
	}
	if got := reloads(t, reg, "ok"); got != 1 {
		t.Errorf("reloads ok = %v, want 1", got)
	}
	if got := reloads(t, reg, "error"); got != 1 {
		t.Errorf("reloads error = %v, want 1", got)
	}
}

// reloads returns flashgate_tls_reloads_total{result} gathered from reg.
func reloads(t *testing.T, reg *prometheus.Registry, result string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "flashgate_tls_reloads_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			if m.GetLabel()[0].GetValue() == result {
				return m.GetCounter().GetValue()
			}
		}
	}
	t.Fatalf("no flashgate_tls_reloads_total{result=%q}", result)
	return 0
}

// TestMTLS: with a CA the server requires a client certificate signed by
// it; ClientConfig sends one and verifies the server against the CA.
func TestMTLS(t *testing.T) {
	p := tlstest.NewPKI(t).Path
	sr, err := tlsreload.New(tlsreload.Options{Files: tlsreload.Files{Cert: p("tls.crt"), Key: p("tls.key"), CA: p("ca.crt")}})
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := sr.ServerConfig()
	if err != nil {
		t.Fatal(err)
	}
	addr := echoServer(t, cfg)
	client := func(files tlsreload.Files) *tls.Config {
		r, err := tlsreload.New(tlsreload.Options{Files: files})
		if err != nil {
			t.Fatal(err)
		}
		return r.ClientConfig("127.0.0.1")
	}
	for name, tc := range map[string]struct {
		files tlsreload.Files
		ok    bool
	}{
		"client cert":          {tlsreload.Files{Cert: p("client.crt"), Key: p("client.key"), CA: p("ca.crt")}, true},
		"no client cert":       {tlsreload.Files{CA: p("ca.crt")}, false},
		"cert of another CA":   {tlsreload.Files{Cert: p("stranger.crt"), Key: p("stranger.key"), CA: p("ca.crt")}, false},
		"server of another CA": {tlsreload.Files{Cert: p("client.crt"), Key: p("client.key"), CA: p("other-ca.crt")}, false},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := dial(t, addr, client(tc.files))
			if tc.ok != (err == nil) {
				t.Fatalf("handshake error %v, want ok=%v", err, tc.ok)
			}
		})
	}
}

func TestNewErrors(t *testing.T) {
	ca := tlstest.NewCA(t, "test CA")
	one, two := ca.Server(t, "one"), ca.Server(t, "two")
	dir := t.TempDir()
	tlstest.Write(t, dir, map[string][]byte{"one.crt": one.Cert, "one.key": one.Key, "two.key": two.Key, "junk": []byte("junk\n")})
	p := func(name string) string { return dir + "/" + name }
	for name, tc := range map[string]struct {
		files tlsreload.Files
		want  string
	}{
		"nothing":          {tlsreload.Files{}, "no files"},
		"cert without key": {tlsreload.Files{Cert: p("one.crt")}, "go together"},
		"key without cert": {tlsreload.Files{Key: p("one.key")}, "go together"},
		"missing cert":     {tlsreload.Files{Cert: p("none.crt"), Key: p("one.key")}, "no such file"},
		"mismatched key":   {tlsreload.Files{Cert: p("one.crt"), Key: p("two.key")}, "does not match"},
		"junk CA":          {tlsreload.Files{CA: p("junk")}, "no PEM certificate"},
		"junk cert":        {tlsreload.Files{Cert: p("junk"), Key: p("one.key")}, "failed to find any PEM data"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := tlsreload.New(tlsreload.Options{Files: tc.files})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one containing %q", err, tc.want)
			}
		})
	}
}

// TestWatchClientCA: Watch picks up a swap of the client's CA bundle and
// certificate: the client then trusts only the new CA's servers, and
// presents its new certificate. Two Reloaders share one counter.
func TestWatchClientCA(t *testing.T) {
	oldCA, newCA := tlstest.NewCA(t, "old CA"), tlstest.NewCA(t, "new CA")
	dir := t.TempDir()
	oldSrv, newSrv := oldCA.Server(t, "old server"), newCA.Server(t, "new server")
	tlstest.Write(t, dir, map[string][]byte{"old.crt": oldSrv.Cert, "old.key": oldSrv.Key, "new.crt": newSrv.Cert, "new.key": newSrv.Key})
	serve := func(name string) string {
		r, err := tlsreload.New(tlsreload.Options{Files: tlsreload.Files{Cert: dir + "/" + name + ".crt", Key: dir + "/" + name + ".key"}})
		if err != nil {
			t.Fatal(err)
		}
		cfg, err := r.ServerConfig()
		if err != nil {
			t.Fatal(err)
		}
		return echoServer(t, cfg)
	}
	oldAddr, newAddr := serve("old"), serve("new")

	sec := tlstest.NewSecretDir(t)
	cliOld := oldCA.Client(t, "client")
	sec.Update(t, map[string][]byte{"ca.crt": oldCA.PEM, "tls.crt": cliOld.Cert, "tls.key": cliOld.Key})
	reg := prometheus.NewRegistry()
	files := tlsreload.Files{Cert: sec.Path("tls.crt"), Key: sec.Path("tls.key"), CA: sec.Path("ca.crt")}
	r, err := tlsreload.New(tlsreload.Options{Files: files, Registry: reg})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tlsreload.New(tlsreload.Options{Files: files, Registry: reg}); err != nil {
		t.Fatalf("a second Reloader on the registry: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = r.Watch(ctx, 10*time.Millisecond); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	client := r.ClientConfig("127.0.0.1")
	if _, err := dial(t, oldAddr, client); err != nil {
		t.Fatalf("old CA's server: %v", err)
	}
	if _, err := dial(t, newAddr, client); err == nil {
		t.Fatal("new CA's server trusted before the swap")
	}

	cliNew := newCA.Client(t, "client 2")
	sec.Update(t, map[string][]byte{"ca.crt": newCA.PEM, "tls.crt": cliNew.Cert, "tls.key": cliNew.Key})
	deadline := time.Now().Add(30 * time.Second)
	for r.Certificate().Leaf.Subject.CommonName != "client 2" {
		if time.Now().After(deadline) {
			t.Fatal("Watch did not reload the swapped files within 30s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if _, err := dial(t, newAddr, client); err != nil {
		t.Fatalf("new CA's server after the swap: %v", err)
	}
	if _, err := dial(t, oldAddr, client); err == nil {
		t.Fatal("old CA's server still trusted after the swap")
	}
	if got := reloads(t, reg, "ok"); got != 1 {
		t.Errorf("reloads ok = %v, want 1", got)
	}
}

// TestRewriteInPlace: files rewritten one after the other, not swapped: the
// certificate alone does not match the key in force, which stays; the key
// that follows completes the pair. Load reads the files unchanged too.
func TestRewriteInPlace(t *testing.T) {
	ca := tlstest.NewCA(t, "test CA")
	one, two := ca.Server(t, "one"), ca.Server(t, "two")
	dir := t.TempDir()
	tlstest.Write(t, dir, map[string][]byte{"tls.crt": one.Cert, "tls.key": one.Key})
	r, err := tlsreload.New(tlsreload.Options{Files: tlsreload.Files{Cert: dir + "/tls.crt", Key: dir + "/tls.key"}})
	if err != nil {
		t.Fatal(err)
	}
	cn := func() string { return r.Certificate().Leaf.Subject.CommonName }
	// Replace by rename, as editors and config tools do: a new inode, so
	// the change is seen whatever the file system's clock.
	replace := func(name string, b []byte) {
		tlstest.Write(t, dir, map[string][]byte{name + ".new": b})
		if err := os.Rename(dir+"/"+name+".new", dir+"/"+name); err != nil {
			t.Fatal(err)
		}
	}
	replace("tls.crt", two.Cert)
	if changed, err := r.Reload(); changed || err == nil || cn() != "one" {
		t.Fatalf("the new certificate without its key: Reload = %v, %v, serving %q; want an error and one", changed, err, cn())
	}
	if changed, err := r.Reload(); changed || err != nil {
		t.Fatalf("Reload with nothing changed since the failure = %v, %v; want false, nil", changed, err)
	}
	replace("tls.key", two.Key)
	if changed, err := r.Reload(); !changed || err != nil || cn() != "two" {
		t.Fatalf("the key following: Reload = %v, %v, serving %q; want two", changed, err, cn())
	}
	if err := r.Load(); err != nil || cn() != "two" {
		t.Fatalf("Load of unchanged files = %v, serving %q", err, cn())
	}
}
