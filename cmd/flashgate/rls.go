package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"text/tabwriter"

	"google.golang.org/grpc"

	"github.com/flashgate/flashgate/enforce"
	"github.com/flashgate/flashgate/rls"
)

// rlsService is serve's envoy.service.ratelimit.v3 server (--rls-config
// or --rls-xds-server):
// on the host's gRPC server beside ext_authz, so that one listener serves
// Envoy's ext_authz and ratelimit filters alike (both can point at one
// cluster), with the same health, reflection, limiter stack, failure mode and
// metrics registry. nil without either flag.
type rlsService struct {
	srv *rls.Server
	dir string
	// xds feeds srv when the config comes from an xDS server (dir is "");
	// force is --rls-xds-force-start.
	xds   *xdsClient
	force bool
}

// newRLS loads --rls-config, or prepares the --rls-xds-server client, and
// builds its server on the enforcement core ext_authz's server has too (the
// limiter stack, fallback, failure mode, shadow, registry and logger); it
// returns nil, nil when neither flag is set. With xDS the server starts with
// no domain (OK for all) until the first config is pushed.
// Errors in the files are *rls.ConfigError, unwrapped, so that they print
// as FILE:LINE:COL: message.
func newRLS(o *serveConfig, core *enforce.Core) (*rlsService, error) {
	if o.rlsConfig == "" && o.rlsXDSServer == "" {
		return nil, nil
	}
	var cfg *rls.Config
	var err error
	if o.rlsXDSServer != "" {
		cfg, err = rls.ParseFiles(nil)
	} else {
		cfg, err = rls.LoadDir(o.rlsConfig)
	}
	if err != nil {
		return nil, err
	}
	names, err := rls.ParseHeaderNames(o.rlsNames)
	if err != nil {
		return nil, fmt.Errorf("--rls-header-names: %w", err)
	}
	srv, err := rls.NewServer(cfg, rls.Options{Core: core, Keys: o.keys, ResponseHeaders: o.rlsHeaders, HeaderNames: names,
		OmitExtras: !o.rlsExtras})
	if err != nil {
		return nil, err
	}
	if o.rlsXDSServer != "" {
		c, err := newXDSClient(&o.rlsXDSOptions, srv, core.Registerer(), core.Logger())
		if err != nil {
			return nil, err
		}
		core.Logger().Info("ratelimit service (RLS) on the gRPC address, its config from xDS", "service", rls.ServiceName,
			"xds_server", o.rlsXDSServer, "node_id", o.rlsXDSNodeID, "tls", o.rlsXDSTLS)
		return &rlsService{srv: srv, xds: c, force: o.rlsXDSForceStart}, nil
	}
	core.Logger().Info("ratelimit service (RLS) on the gRPC address", "service", rls.ServiceName,
		"dir", rls.ConfigDir(o.rlsConfig), "domains", len(cfg.Domains()))
	return &rlsService{srv: srv, dir: o.rlsConfig}, nil
}

// start registers the service on gs (before it serves) and runs its
// reloads in wg until ctx ends: the directory watch and SIGHUP, or the xDS
// client. It returns what the backend's readiness is to be reported to:
// health itself, or with xDS a gate that also waits for the first config.
// r may be nil.
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
	rel := r.srv.Reloader(r.dir)
	wg.Go(func() { _ = rel.Watch(ctx, 0) })
	wg.Go(func() {
		onSIGHUP(ctx, func() {
			// On an error Reload has logged and counted it.
			if err := rel.Reload(); err == nil {
				log.Info("SIGHUP: ratelimit config reloaded", "dir", r.dir)
			}
		})
	})
	return health
}

// writeRLSTable prints a ratelimit config's domains and rules (validate).
func writeRLSTable(w io.Writer, cfg *rls.Config) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	for _, d := range cfg.Domains() {
		fmt.Fprintf(tw, "domain %s (%s)\n", d.Name, d.File)
		fmt.Fprintln(tw, "  rule\tlimit\twindow\toptions")
		for _, r := range d.Rules() {
			limit, win := "unlimited", ""
			if !r.Unlimited {
				limit, win = fmt.Sprint(r.RequestsPerUnit), r.Window.String()
			}
			var opts []string
			if r.Name != "" {
				opts = append(opts, "path="+r.Path)
			}
			if r.Buckets > 0 {
				b := fmt.Sprintf("buckets=%d", r.Buckets)
				if r.AutoBuckets {
					b += " (auto)"
				}
				opts = append(opts, b)
			}
			if r.Shadow {
				opts = append(opts, "shadow")
			}
			if r.QuotaMode {
				opts = append(opts, "quota_mode (enforced as a limit)")
			}
			for _, rep := range r.Replaces {
				opts = append(opts, "replaces="+rep)
			}
			if r.FailureMode != enforce.FailureDefault {
				opts = append(opts, "failure_mode="+r.FailureMode.String())
			}
			if r.LocalShare > 0 {
				opts = append(opts, fmt.Sprintf("local_share=%d", r.LocalShare))
			}
			switch {
			case r.Ban == nil:
			case r.Ban.Enabled():
				opts = append(opts, fmt.Sprintf("ban=%d/%s:%s", r.Ban.Threshold, r.Ban.Window, r.Ban.Duration))
			default:
				opts = append(opts, "ban=off")
			}
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\n", r.Label(), limit, win, strings.Join(opts, " "))
		}
	}
	return tw.Flush()
}

// validateRLS loads a ratelimit config directory and prints it. Errors in
// the files are *rls.ConfigError, unwrapped.
func validateRLS(w io.Writer, dir string) error {
	cfg, err := rls.LoadDir(dir)
	if err != nil {
		return err
	}
	if err := writeRLSTable(w, cfg); err != nil {
		return fmt.Errorf("write: %w", err)
	}
	return nil
}
