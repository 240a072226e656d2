package daemon

import (
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"slices"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/flashgate/flashgate/descriptors"
	"github.com/flashgate/flashgate/extauthz"
	"github.com/flashgate/flashgate/host"
	"github.com/flashgate/flashgate/httpauthz"
)

// httpFront is the daemon's HTTP front-end (--http-authz-addr): package
// httpauthz's handler asking the ext_authz server, so that its checks have
// ext_authz's rules, reloads, limiter stack, failure modes, shadow and
// metrics, on a listener of its own on the host.
type httpFront struct {
	lis     net.Listener
	handler http.Handler
}

// newHTTPFront listens on o.HTTPAuthzAddr and builds the handler on srv;
// it returns nil, nil without the address. It warns of the rules of cfg
// that no check on it can satisfy.
func newHTTPFront(o *Options, srv *extauthz.Server, cfg *descriptors.Config, reg prometheus.Registerer, log *slog.Logger) (*httpFront, error) {
	if o.HTTPAuthzAddr == "" {
		return nil, nil
	}
	h, err := httpauthz.New(httpauthz.Options{Decider: srv, PathPrefix: o.HTTPAuthzPathPrefix, Registerer: reg, Logger: log})
	if err != nil {
		return nil, err
	}
	lis, err := host.Listen(o.HTTPAuthzAddr)
	if err != nil {
		return nil, fmt.Errorf("--http-authz-addr: %w", err)
	}
	warnContextExtensions(cfg, log)
	return &httpFront{lis: lis, handler: h}, nil
}

// warnContextExtensions logs the rules of cfg that read an Envoy per-route
// context_extensions entry, which a check on the HTTP front-end never
// carries: there they never apply, or, with on_missing: deny, refuse every
// check they match.
func warnContextExtensions(cfg *descriptors.Config, log *slog.Logger) {
	var names []string
	for _, r := range cfg.Rules {
		if slices.ContainsFunc(r.Match, func(m descriptors.Match) bool { return m.Source.Kind == descriptors.SourceContextExtension }) {
			names = append(names, r.Name)
		}
	}
	if len(names) > 0 {
		log.Warn("rules read Envoy context_extensions, which no check on --http-authz-addr carries: there they never apply (with on_missing: deny they refuse every check they match)",
			"rules", names)
	}
}
