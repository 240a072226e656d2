package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/pflag"

	"github.com/flashgate/flashgate/internal/tlsreload"
	"github.com/flashgate/flashgate/rls"
	"github.com/flashgate/flashgate/rls/xds"
)

// rlsXDSOptions are serve's flags of the RLS config from an xDS management
// server (ratelimit's CONFIG_TYPE=GRPC_XDS_SOTW and CONFIG_GRPC_XDS_*).
type rlsXDSOptions struct {
	rlsXDSServer       string
	rlsXDSNodeID       string
	rlsXDSNodeMetadata string
	rlsXDSRetry        time.Duration
	rlsXDSTLS          bool
	rlsXDSTLSCert      string
	rlsXDSTLSKey       string
	rlsXDSTLSCA        string
	rlsXDSTLSSAN       string
	rlsXDSForceStart   bool
}

func (o *rlsXDSOptions) addFlags(f *pflag.FlagSet) {
	f.StringVar(&o.rlsXDSServer, "rls-xds-server", "", "xDS management server, HOST:PORT: serve envoy.service.ratelimit.v3.RateLimitService on --grpc-addr with the ratelimit configs (RateLimitConfig resources, state of the world) it pushes (ratelimit's CONFIG_GRPC_XDS_SERVER_URL); not with --rls-config")
	f.StringVar(&o.rlsXDSNodeID, "rls-xds-node-id", xds.DefaultNodeID, "xDS node id (ratelimit's CONFIG_GRPC_XDS_NODE_ID)")
	f.StringVar(&o.rlsXDSNodeMetadata, "rls-xds-node-metadata", "", "xDS node metadata, KEY=VALUE,... (ratelimit's CONFIG_GRPC_XDS_NODE_METADATA)")
	f.DurationVar(&o.rlsXDSRetry, "rls-xds-retry-interval", xds.DefaultRetryInterval, "pause before a new xDS stream after one failed (ratelimit's CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL)")
	f.BoolVar(&o.rlsXDSTLS, "rls-xds-tls", false, "connect to the xDS server over TLS (ratelimit's CONFIG_GRPC_XDS_SERVER_USE_TLS)")
	f.StringVar(&o.rlsXDSTLSCert, "rls-xds-tls-cert", "", "client certificate (PEM) for an mTLS xDS server (ratelimit's CONFIG_GRPC_XDS_CLIENT_TLS_CERT)")
	f.StringVar(&o.rlsXDSTLSKey, "rls-xds-tls-key", "", "key (PEM) of --rls-xds-tls-cert (ratelimit's CONFIG_GRPC_XDS_CLIENT_TLS_KEY)")
	f.StringVar(&o.rlsXDSTLSCA, "rls-xds-tls-ca", "", "CA certificates (PEM) the xDS server's certificate is verified against (default: the system's; ratelimit's CONFIG_GRPC_XDS_SERVER_TLS_CACERT)")
	f.StringVar(&o.rlsXDSTLSSAN, "rls-xds-tls-server-name", "", "name the xDS server's certificate is verified for (default: the host of --rls-xds-server; ratelimit's CONFIG_GRPC_XDS_SERVER_TLS_SAN)")
	f.BoolVar(&o.rlsXDSForceStart, "rls-xds-force-start", false, "turn ready before the xDS server pushed a first config (answering OK for every domain until then); by default readiness waits for it (ratelimit's FORCE_START_WITHOUT_INITIAL_CONFIG)")
}

// validate checks the xDS flags together with --rls-config (rlsConfig).
func (o *rlsXDSOptions) validate(rlsConfig string, changed func(string) bool) error {
	if o.rlsXDSServer == "" {
		for _, name := range []string{"rls-xds-node-id", "rls-xds-node-metadata", "rls-xds-retry-interval", "rls-xds-tls",
			"rls-xds-tls-cert", "rls-xds-tls-key", "rls-xds-tls-ca", "rls-xds-tls-server-name", "rls-xds-force-start"} {
			if changed(name) {
				return fmt.Errorf("--%s needs --rls-xds-server", name)
			}
		}
		return nil
	}
	if rlsConfig != "" {
		return fmt.Errorf("--rls-config and --rls-xds-server exclude each other: the ratelimit config comes from a directory or from xDS")
	}
	if _, _, err := net.SplitHostPort(o.rlsXDSServer); err != nil {
		return fmt.Errorf("--rls-xds-server %q: want HOST:PORT", o.rlsXDSServer)
	}
	if o.rlsXDSNodeID == "" {
		return fmt.Errorf("--rls-xds-node-id is empty")
	}
	if o.rlsXDSRetry <= 0 {
		return fmt.Errorf("--rls-xds-retry-interval %s: must be positive", o.rlsXDSRetry)
	}
	if !o.rlsXDSTLS {
		for _, name := range []string{"rls-xds-tls-cert", "rls-xds-tls-key", "rls-xds-tls-ca", "rls-xds-tls-server-name"} {
			if changed(name) {
				return fmt.Errorf("--%s needs --rls-xds-tls", name)
			}
		}
	}
	if (o.rlsXDSTLSCert == "") != (o.rlsXDSTLSKey == "") {
		return fmt.Errorf("--rls-xds-tls-cert and --rls-xds-tls-key go together")
	}
	return nil
}

// xdsClient is the xDS client of --rls-xds-server and, with
// --rls-xds-tls-cert or --rls-xds-tls-ca, the reloader of those files.
type xdsClient struct {
	*xds.Client
	// files is nil without files to reload (plaintext, or TLS on the
	// system's roots without a client certificate).
	files *tlsreload.Reloader
}

// newXDSClient builds the xDS client feeding srv (nil without
// --rls-xds-server); its TLS files are read here, so that a bad one stops
// serve at start, and reloaded when they change (runXDS), as the gRPC
// server's are: every new connection to the xDS server presents the client
// certificate in force and verifies the server against the CA bundle in
// force. reg takes flashgate_tls_reloads_total.
func newXDSClient(o *rlsXDSOptions, srv *rls.Server, reg prometheus.Registerer, log *slog.Logger) (*xdsClient, error) {
	if o.rlsXDSServer == "" {
		return nil, nil
	}
	c := &xdsClient{}
	var tlsCfg *tls.Config
	if o.rlsXDSTLS {
		serverName := o.rlsXDSTLSSAN
		if serverName == "" {
			host, _, err := net.SplitHostPort(o.rlsXDSServer)
			if err != nil {
				return nil, fmt.Errorf("--rls-xds-server %q: %w", o.rlsXDSServer, err)
			}
			serverName = host
		}
		if o.rlsXDSTLSCert == "" && o.rlsXDSTLSCA == "" {
			tlsCfg = &tls.Config{MinVersion: tls.VersionTLS12, ServerName: serverName}
		} else {
			r, err := tlsreload.New(tlsreload.Options{
				Files:    tlsreload.Files{Cert: o.rlsXDSTLSCert, Key: o.rlsXDSTLSKey, CA: o.rlsXDSTLSCA},
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
		Server: o.rlsXDSServer, NodeID: o.rlsXDSNodeID, NodeMetadata: xds.ParseMetadata(o.rlsXDSNodeMetadata),
		RetryInterval: o.rlsXDSRetry, TLS: tlsCfg, Apply: srv.Pusher("xds://" + o.rlsXDSServer), Logger: log,
	})
	if err != nil {
		return nil, err
	}
	c.Client = xc
	return c, nil
}

// runXDS runs the xDS client c in wg until ctx ends, and opens gate once
// it applied a first config (at once with --rls-xds-force-start). Its TLS
// files are polled, and reloaded on SIGHUP, meanwhile.
func runXDS(ctx context.Context, wg *sync.WaitGroup, c *xdsClient, gate *readyGate, force bool, log *slog.Logger) {
	wg.Go(func() {
		if err := c.Run(ctx); err != nil {
			log.Error("xds client stopped; the ratelimit config stays as it is", "error", err)
		}
	})
	if c.files != nil {
		wg.Go(func() { _ = c.files.Watch(ctx, 0) })
		wg.Go(func() { onSIGHUP(ctx, func() { _ = c.files.Load() }) })
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
// from waitBackend) and the gate (open) say so: with --rls-xds-server,
// readiness waits for the first config as ratelimit's does.
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
