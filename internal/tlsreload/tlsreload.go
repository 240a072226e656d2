package tlsreload

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// DefaultPoll is how often Watch looks at the files when given no interval:
// three stat calls a second.
const DefaultPoll = time.Second

// Files names the PEM files a Reloader serves. Cert and Key go together;
// either they or CA must be set.
type Files struct {
	// Cert is the certificate chain, leaf first; Key its private key.
	Cert, Key string
	// CA is a bundle of CA certificates: on a server, the roots that
	// client certificates must chain to (mTLS); on a client, the roots of
	// the server's certificate ("": the system roots).
	CA string
}

// Options configure a Reloader. Only Files is required.
type Options struct {
	Files Files
	// Name tells the files apart in logs ("grpc", "xds"); it is not a
	// metric label.
	Name string
	// Registry takes flashgate_tls_reloads_total; Reloaders given the same
	// registry share it. nil: not exported.
	Registry prometheus.Registerer
	// Logger gets one line per reload; nil: none.
	Logger *slog.Logger
}

// material is one consistent load of the files.
type material struct {
	cert *tls.Certificate // nil without Files.Cert
	pool *x509.CertPool   // nil without Files.CA
}

// stamp identifies a file's content as os.Stat sees it.
type stamp struct {
	info os.FileInfo
}

func (s stamp) same(o stamp) bool {
	if s.info == nil || o.info == nil {
		return s.info == o.info
	}
	return os.SameFile(s.info, o.info) && s.info.Size() == o.info.Size() && s.info.ModTime().Equal(o.info.ModTime())
}

// Reloader holds the material last loaded from its files. Its methods and
// the configs it returns are safe for concurrent use.
type Reloader struct {
	files   Files
	name    string
	log     *slog.Logger
	reloads *prometheus.CounterVec

	// reloading orders Reload's calls, so that an older load never
	// replaces a newer one.
	reloading sync.Mutex
	// mu guards cur and stamps.
	mu     sync.Mutex
	cur    material
	stamps []stamp
}

// New loads the files once and returns their Reloader; it fails, naming
// the file, when one is unreadable or invalid, or the key does not match
// the certificate.
func New(opts Options) (*Reloader, error) {
	f := opts.Files
	if (f.Cert == "") != (f.Key == "") {
		return nil, errors.New("tls: a certificate and its key go together: give both files or neither")
	}
	if f.Cert == "" && f.CA == "" {
		return nil, errors.New("tls: no files given")
	}
	r := &Reloader{files: f, name: opts.Name, log: opts.Logger}
	if r.log == nil {
		r.log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if opts.Registry != nil {
		c, err := registerReloads(opts.Registry)
		if err != nil {
			return nil, err
		}
		r.reloads = c
	}
	st := r.stat()
	m, err := load(f)
	if err != nil {
		return nil, err
	}
	r.cur, r.stamps = m, st
	return r, nil
}

// registerReloads registers flashgate_tls_reloads_total on reg, or returns
// the one already there.
func registerReloads(reg prometheus.Registerer) (*prometheus.CounterVec, error) {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "flashgate_tls_reloads_total",
		Help: "Reloads of TLS certificate, key and CA files after they changed, by result (ok; error: the files in force were kept).",
	}, []string{"result"})
	if err := reg.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			if prev, ok := are.ExistingCollector.(*prometheus.CounterVec); ok {
				return prev, nil
			}
		}
		return nil, fmt.Errorf("tls: register metrics: %w", err)
	}
	c.WithLabelValues("ok")
	c.WithLabelValues("error")
	return c, nil
}

// load reads and checks the files.
func load(f Files) (material, error) {
	var m material
	if f.Cert != "" {
		certPEM, err := os.ReadFile(f.Cert)
		if err != nil {
			return m, fmt.Errorf("tls certificate: %w", err)
		}
		keyPEM, err := os.ReadFile(f.Key)
		if err != nil {
			return m, fmt.Errorf("tls key: %w", err)
		}
		cert, err := tls.X509KeyPair(certPEM, keyPEM)
		if err != nil {
			return m, fmt.Errorf("tls certificate %s and key %s: %w", f.Cert, f.Key, err)
		}
		m.cert = &cert
	}
	if f.CA != "" {
		caPEM, err := os.ReadFile(f.CA)
		if err != nil {
			return m, fmt.Errorf("tls CA bundle: %w", err)
		}
		m.pool = x509.NewCertPool()
		if !m.pool.AppendCertsFromPEM(caPEM) {
			return m, fmt.Errorf("tls CA bundle %s: no PEM certificate in it", f.CA)
		}
	}
	return m, nil
}

// stat returns the stamps of the files (a zero stamp for one missing).
func (r *Reloader) stat() []stamp {
	paths := []string{r.files.Cert, r.files.Key, r.files.CA}
	st := make([]stamp, len(paths))
	for i, p := range paths {
		if p == "" {
			continue
		}
		if fi, err := os.Stat(p); err == nil {
			st[i] = stamp{info: fi}
		}
	}
	return st
}

// Reload reloads the files if any changed since the last attempt, and
// reports whether it did so, and the error that kept the material in force.
// An attempt that failed is not repeated until a file changes again. It is
// safe to call concurrently with Watch.
func (r *Reloader) Reload() (bool, error) {
	return r.reload(false)
}

// Load reloads the files now, changed or not (a rewrite in place within
// one tick of the file system's clock, at the same size, looks unchanged to
// Reload), and returns the error that kept the material in force. It is
// what SIGHUP should call.
func (r *Reloader) Load() error {
	_, err := r.reload(true)
	return err
}

func (r *Reloader) reload(force bool) (bool, error) {
	r.reloading.Lock()
	defer r.reloading.Unlock()
	st := r.stat()
	r.mu.Lock()
	changed := force
	for i := range st {
		if !st[i].same(r.stamps[i]) {
			changed = true
		}
	}
	if !changed {
		r.mu.Unlock()
		return false, nil
	}
	r.stamps = st
	r.mu.Unlock()
	m, err := load(r.files)
	if err != nil {
		r.count("error")
		r.log.Error("tls files could not be loaded; keeping the certificate in force", "files", r.name, "error", err)
		return false, err
	}
	r.mu.Lock()
	r.cur = m
	r.mu.Unlock()
	r.count("ok")
	attrs := []any{"files", r.name}
	if m.cert != nil && m.cert.Leaf != nil {
		attrs = append(attrs, "not_after", m.cert.Leaf.NotAfter.UTC().Format(time.RFC3339))
	}
	r.log.Info("tls files reloaded", attrs...)
	return true, nil
}

func (r *Reloader) count(result string) {
	if r.reloads != nil {
		r.reloads.WithLabelValues(result).Inc()
	}
}

// Watch calls Reload every interval (DefaultPoll when not positive) until
// ctx ends, then returns ctx's error.
func (r *Reloader) Watch(ctx context.Context, every time.Duration) error {
	if every <= 0 {
		every = DefaultPoll
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
			_, _ = r.Reload()
		}
	}
}

func (r *Reloader) current() material {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.cur
}

// Certificate returns the certificate in force, nil without Files.Cert.
func (r *Reloader) Certificate() *tls.Certificate { return r.current().cert }

// ServerConfig returns a server's tls.Config (TLS 1.2 at least, ALPN h2)
// whose every handshake takes the certificate in force and, with
// Files.CA, requires a client certificate verified against the CA bundle in
// force. It fails without Files.Cert.
func (r *Reloader) ServerConfig() (*tls.Config, error) {
	if r.files.Cert == "" {
		return nil, errors.New("tls: a server needs a certificate and key")
	}
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		NextProtos: []string{"h2"},
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			m := r.current()
			c := &tls.Config{
				MinVersion:   tls.VersionTLS12,
				NextProtos:   []string{"h2"},
				Certificates: []tls.Certificate{*m.cert},
			}
			if m.pool != nil {
				c.ClientAuth = tls.RequireAndVerifyClientCert
				c.ClientCAs = m.pool
			}
			return c, nil
		},
	}, nil
}

// ClientConfig returns a client's tls.Config (TLS 1.2 at least) for
// servers named serverName, a host name or IP address ("": the host name
// the client dials, which must then not be an IP address): it sends the
// certificate in force when the server asks for one (none without
// Files.Cert) and verifies the server's chain and name against the CA
// bundle in force at each handshake, or the system roots without Files.CA.
func (r *Reloader) ClientConfig(serverName string) *tls.Config {
	c := &tls.Config{
		MinVersion: tls.VersionTLS12,
		ServerName: serverName,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			if m := r.current(); m.cert != nil {
				return m.cert, nil
			}
			return &tls.Certificate{}, nil // none: the server decides
		},
	}
	if r.files.CA == "" {
		return c
	}
	// The roots change with the files, and RootCAs is fixed once the
	// config is in use: verify here instead, as crypto/tls would.
	c.InsecureSkipVerify = true
	c.VerifyConnection = func(cs tls.ConnectionState) error {
		if len(cs.PeerCertificates) == 0 {
			return errors.New("tls: the server sent no certificate")
		}
		name := serverName
		if name == "" {
			name = cs.ServerName // SNI: empty for an IP address
		}
		if name == "" {
			return errors.New("tls: no server name to verify the server's certificate against (dialing an IP address needs it given)")
		}
		opts := x509.VerifyOptions{
			Roots:         r.current().pool,
			DNSName:       name,
			Intermediates: x509.NewCertPool(),
		}
		for _, ic := range cs.PeerCertificates[1:] {
			opts.Intermediates.AddCert(ic)
		}
		_, err := cs.PeerCertificates[0].Verify(opts)
		return err
	}
	return c
}
