package daemon

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"net"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	"github.com/flashgate/flashgate/enforce"
	"github.com/flashgate/flashgate/internal/tlsreload"
	"github.com/flashgate/flashgate/rls"
	"github.com/flashgate/flashgate/rls/xds"
)

// rlsService is the daemon's envoy.service.ratelimit.v3 server (a
// ratelimit config directory or an xDS server): on the host's gRPC server
// beside ext_authz, so that one listener serves Envoy's ext_authz and
// ratelimit filters alike (both can point at one cluster), with the same
// health, reflection, limiter stack, failure mode and metrics registry.
// nil without either.
type rlsService struct {
	srv *rls.Server
	dir string
	// rel reloads dir; nil with xDS.
	rel *enforce.Reloader
	// xds feeds srv when the config comes from an xDS server (dir is "");
	// force is XDSOptions.ForceStart.
	xds   *xdsClient
	force bool
}

// newRLS loads the config directory, or prepares the xDS client, and
// builds its server on core (the limiter stack, fallback, failure mode,
// shadow, registry and logger); it returns nil, nil without either. With
// xDS the server starts with no domain (OK for all) until the first config
// is pushed. Errors in the files are *rls.ConfigError, unwrapped, so that
// they print as FILE:LINE:COL: message.
func newRLS(o *Options, core *enforce.Core) (*rlsService, error) {
	if o.RLSConfig == "" && o.XDS.Server == "" {
		return nil, nil
	}
	var cfg *rls.Config
	var err error
	if o.XDS.Server != "" {
		cfg, err = rls.ParseFiles(nil)
	} else {
		cfg, err = rls.LoadDir(o.RLSConfig)
	}
	if err != nil {
		return nil, err
	}
	srv, err := rls.NewServer(cfg, rls.Options{Core: core, Keys: o.Keys, ResponseHeaders: o.RLSResponseHeaders,
		HeaderNames: o.RLSHeaderNames, OmitExtras: o.RLSOmitExtras})
	if err != nil {
		return nil, err
	}
	if o.XDS.Server != "" {
		c, err := newXDSClient(&o.XDS, srv, core.Registerer(), core.Logger())
		if err != nil {
			return nil, err
		}
		core.Logger().Info("ratelimit service (RLS) on the gRPC address, its config from xDS", "service", rls.ServiceName,
			"xds_server", o.XDS.Server, "node_id", o.XDS.NodeID, "tls", o.XDS.TLS)
		return &rlsService{srv: srv, xds: c, force: o.XDS.ForceStart}, nil
	}
	core.Logger().Info("ratelimit service (RLS) on the gRPC address", "service", rls.ServiceName,
		"dir", rls.ConfigDir(o.RLSConfig), "domains", len(cfg.Domains()))
	return &rlsService{srv: srv, dir: o.RLSConfig, rel: srv.Reloader(o.RLSConfig)}, nil
}

// start registers the service on gs (before it serves) and runs its
// reloads in wg until ctx ends: the directory watch, or the xDS client. It
// returns what the backend's readiness is to be reported to: health
// itself, or with xDS a gate that also waits for the first config. r may
// be nil.
func (r *rlsService) start(ctx context.Context, wg *sync.WaitGroup, gs grpc.ServiceRegistrar, health servingSetter, log *slog.Logger) servingSetter {
	if r == nil {
		return health
	}
	r.srv.Register(gs)
	if r.xds != nil {
		gate := &readyGate{next: health}
		runXDS(ctx, wg, r.xds, gate, r.force, log)
		return gate
	}
	wg.Go(func() { _ = r.rel.Watch(ctx, 0) })
	return health
}

// reload reads the config directory again, or the xDS client's TLS files.
// r may be nil.
func (r *rlsService) reload(log *slog.Logger) {
	switch {
	case r == nil:
	case r.xds != nil:
		if r.xds.files != nil {
			_ = r.xds.files.Load()
		}
	default:
		// On an error Reload has logged and counted it.
		if err := r.rel.Reload(); err == nil {
			log.Info("SIGHUP: ratelimit config reloaded", "dir", r.dir)
		}
	}
}

// xdsClient is the RLS's xDS client and, with a client certificate or a
// CA bundle, the reloader of those files.
type xdsClient struct {
	*xds.Client
	// files is nil without files to reload (plaintext, or TLS on the
	// system's roots without a client certificate).
	files *tlsreload.Reloader
}

// newXDSClient builds the xDS client feeding srv; its TLS files are read
// here, so that a bad one stops the daemon at start, and reloaded when
// they change (runXDS), as the gRPC server's are: every new connection to
// the xDS server presents the client certificate in force and verifies the
// server against the CA bundle in force. reg takes
// flashgate_tls_reloads_total.
func newXDSClient(o *XDSOptions, srv *rls.Server, reg prometheus.Registerer, log *slog.Logger) (*xdsClient, error) {
	c := &xdsClient{}
	var tlsCfg *tls.Config
	if o.TLS {
		serverName := o.ServerName
		if serverName == "" {
			host, _, err := net.SplitHostPort(o.Server)
			if err != nil {
				return nil, fmt.Errorf("--rls-xds-server %q: %w", o.Server, err)
			}
			serverName = host
		}
		if o.Files.Cert == "" && o.Files.CA == "" {
			tlsCfg = &tls.Config{MinVersion: tls.VersionTLS12, ServerName: serverName}
		} else {
			r, err := tlsreload.New(tlsreload.Options{
				Files:    tlsreload.Files{Cert: o.Files.Cert, Key: o.Files.Key, CA: o.Files.CA},
				Name:     "xds",
				Registry: reg,
				Logger:   log,
			})
			if err != nil {
				return nil, fmt.Errorf("--rls-xds-tls-cert, --rls-xds-tls-key, --rls-xds-tls-ca: %w", err)
			}
			c.files, tlsCfg = r, r.ClientConfig(serverName)
		}
	}
	xc, err := xds.New(xds.Options{
		Server: o.Server, NodeID: o.NodeID, NodeMetadata: xds.ParseMetadata(o.NodeMetadata),
		RetryInterval: o.RetryInterval, TLS: tlsCfg, Apply: srv.Pusher("xds://" + o.Server), Logger: log,
	})
	if err != nil {
		return nil, err
	}
	c.Client = xc
	return c, nil
}

// runXDS runs the xDS client c in wg until ctx ends, and opens gate once
// it applied a first config (at once with force). Its TLS files are
// polled meanwhile.
func runXDS(ctx context.Context, wg *sync.WaitGroup, c *xdsClient, gate *readyGate, force bool, log *slog.Logger) {
	wg.Go(func() {
		if err := c.Run(ctx); err != nil {
			log.Error("xds client stopped; the ratelimit config stays as it is", "error", err)
		}
	})
	if c.files != nil {
		wg.Go(func() { _ = c.files.Watch(ctx, 0) })
	}
	if force {
		log.Warn("--rls-xds-force-start: ready before a first ratelimit config; every domain answers OK until it comes")
		gate.open()
		return
	}
	wg.Go(func() {
		select {
		case <-ctx.Done():
		case <-c.Applied():
			gate.open()
		}
	})
}

// readyGate holds health NOT_SERVING until both the backend (SetServing,
// from waitBackend) and the gate (open) say so: with xDS, readiness waits
// for the first config as ratelimit's does.
type readyGate struct {
	next servingSetter
	// mu guards the fields below and orders the calls to next.
	mu      sync.Mutex
	backend bool
	opened  bool
}

// SetServing records the backend's readiness and passes it on once the
// gate is open.
func (g *readyGate) SetServing(serving bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.backend = serving
	if g.opened {
		g.next.SetServing(serving)
	}
}

// open opens the gate: health follows the backend from now on.
func (g *readyGate) open() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.opened = true
	if g.backend {
		g.next.SetServing(true)
	}
}
