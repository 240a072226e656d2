package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/flashgate/flashgate/internal/tlsreload"
)

// grpcTLS is the TLS of --grpc-addr (--grpc-tls-cert, --grpc-tls-key,
// --grpc-tls-client-ca): its files reloaded when they change and on
// SIGHUP. nil without --grpc-tls-cert.
type grpcTLS struct {
	files *tlsreload.Reloader
	cfg   *tls.Config
	mtls  bool
}

// newGRPCTLS loads the files of the flags (nil, nil when unset), failing
// with the flag's name when one is unreadable or the key does not match.
func newGRPCTLS(o *serveConfig, reg prometheus.Registerer, log *slog.Logger) (*grpcTLS, error) {
	if o.grpcTLSCert == "" {
		return nil, nil
	}
	r, err := tlsreload.New(tlsreload.Options{
		Files:    tlsreload.Files{Cert: o.grpcTLSCert, Key: o.grpcTLSKey, CA: o.grpcTLSClientCA},
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
	return &grpcTLS{files: r, cfg: cfg, mtls: o.grpcTLSClientCA != ""}, nil
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

// start polls the files, and reloads them on SIGHUP, in wg until ctx ends.
func (g *grpcTLS) start(ctx context.Context, wg *sync.WaitGroup) {
	if g == nil {
		return
	}
	wg.Go(func() { _ = g.files.Watch(ctx, 0) })
	wg.Go(func() { onSIGHUP(ctx, func() { _ = g.files.Load() }) })
}
