package main

import (
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/flashgate/flashgate/enforce"
)

// newCore builds the enforcement core every front-end of serve shares: b's
// limiter stack and fallback, the failure mode, shadow and rate-limit
// header flags, reg and log.
func newCore(o *serveConfig, b *backend, reg prometheus.Registerer, log *slog.Logger) (*enforce.Core, error) {
	opts := enforce.Options{
		Limiter:     b.limiter,
		FailureMode: o.failureMode,
		Shadow:      o.shadow,
		Headers:     o.headers,
		Registerer:  reg,
		Logger:      log,
	}
	if b.fallback != nil { // a nil *fallback.Fallback must not become a non-nil Fallback
		opts.Fallback = b.fallback
	}
	return enforce.New(opts)
}
