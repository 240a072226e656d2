package daemon

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/flashgate/flashgate/internal/tlsreload"
)

// grpcTLS is the TLS of the gRPC listener (--grpc-tls-cert, --grpc-tls-key,
// --grpc-tls-client-ca): its files reloaded when they change and on
// Reload. nil without a certificate.
type grpcTLS struct {
	files *tlsreload.Reloader
	cfg   *tls.Config
	mtls  bool
}

// newGRPCTLS loads the files (nil, nil without a certificate), failing
// with the flags' names when one is unreadable or the key does not match.
func newGRPCTLS(f TLSFiles, reg prometheus.Registerer, log *slog.Logger) (*grpcTLS, error) {
	if f.Cert == "" {
		return nil, nil
	}
	r, err := tlsreload.New(tlsreload.Options{
		Files:    tlsreload.Files{Cert: f.Cert, Key: f.Key, CA: f.CA},
		Name:     "grpc",
		Registry: reg,
		Logger:   log,
	})
	if err != nil {
		return nil, fmt.Errorf("--grpc-tls-cert, --grpc-tls-key, --grpc-tls-client-ca: %w", err)
	}
	cfg, err := r.ServerConfig()
	if err != nil {
		return nil, err
	}
	return &grpcTLS{files: r, cfg: cfg, mtls: f.CA != ""}, nil
}

// config is the gRPC server's tls.Config, nil for plaintext.
func (g *grpcTLS) config() *tls.Config {
	if g == nil {
		return nil
	}
	return g.cfg
}

// mode names what --grpc-addr serves: plaintext, tls or mtls.
func (g *grpcTLS) mode() string {
	switch {
	case g == nil:
		return "plaintext"
	case g.mtls:
		return "mtls"
	}
	return "tls"
}

// start polls the files in wg until ctx ends.
func (g *grpcTLS) start(ctx context.Context, wg *sync.WaitGroup) {
	if g != nil {
		wg.Go(func() { _ = g.files.Watch(ctx, 0) })
	}
}

// reload reads the files again; a bad new file keeps the certificate in
// force (tlsreload logs and counts it).
func (g *grpcTLS) reload() {
	if g != nil {
		_ = g.files.Load()
	}
}
