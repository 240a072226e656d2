package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/flashgate/flashgate/descriptors"
	"github.com/flashgate/flashgate/enforce"
	"github.com/flashgate/flashgate/extauthz"
	"github.com/flashgate/flashgate/host"
	"github.com/flashgate/flashgate/rls"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/spf13/cobra"
	"google.golang.org/grpc/encoding"
)

func newServeCmd(e env) *cobra.Command {
	var o serveOptions
	cmd := &cobra.Command{
		Use:   "serve [flags]",
		Short: "Run the ext_authz rate-limit server (and Envoy's ratelimit service)",
		Long: `serve runs the Envoy ext_authz (gRPC v3) server: ext_authz, grpc.health.v1 and
reflection on --grpc-addr; /metrics, /healthz and /readyz on --http-addr;
with --http-authz-addr, the HTTP front-end (Envoy's ext_authz http_service,
nginx auth_request, Caddy forward_auth, Traefik ForwardAuth), whose every
request is a check decided by the same rules, limiter and failure modes.

With --rls-config (or --rls-xds-server), --grpc-addr also serves Envoy's
ratelimit service (envoy.service.ratelimit.v3) on envoyproxy/ratelimit's
config files. Without --config it serves that alone: ext_authz is not
registered (a Check answers UNIMPLEMENTED) and the built-in example rules
are not enforced.

With --grpc-tls-cert and --grpc-tls-key, --grpc-addr serves TLS only, and
mTLS with --grpc-tls-client-ca; the files are reloaded when they change (a
bad new file keeps the certificate in force).

Every flag can also be set as FLASHGATE_<FLAG> (upper case, - becomes _);
flags win over the environment.

Health turns SERVING once the rules are loaded and the backend is warm
(Redis answered, the script is loaded, the fleet is counted); Redis that is
down or refuses writes is retried with backoff while health stays
NOT_SERVING, for --warmup-timeout at most: then health turns SERVING
anyway, checks are decided by the failure mode while Redis fails, and the
warm-up goes on in the background. Warnings and errors of one kind are
logged once per 10s at most (the rest counted in
flashgate_log_suppressed_total). The descriptors file is reloaded when it
changes and on SIGHUP; a bad file keeps the old rules. On SIGTERM or SIGINT
health turns NOT_SERVING, every listener of checks stops accepting,
in-flight checks finish (up to --drain-timeout), and serve exits 0.`,
		Example: `  flashgate serve --config /etc/flashgate/descriptors.yaml --backend redis --redis-addr 127.0.0.1:6379`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := o.parse(cmd.Flags().Changed)
			if err != nil {
				return err
			}
			return runServe(cmd.Context(), e, c)
		},
	}
	o.addFlags(cmd.Flags())
	withEnv(cmd, e)
	return cmd
}

// serveInfo tells a test where a started serve listens.
type serveInfo struct {
	grpcAddr, httpAddr, httpAuthzAddr string
	server                            *extauthz.Server
	host                              *host.Host
}

// pingBackoff bounds the pause between PINGs of an unreachable backend.
const (
	pingBackoffMin = 100 * time.Millisecond
	pingBackoffMax = 5 * time.Second
)

// runServe runs the server until ctx ends, then drains it and returns nil;
// it returns an error if it cannot start or a listener fails.
func runServe(ctx context.Context, e env, o *serveConfig) error {
	log, logs, err := newLogger(e.stderr, o.logLevel, o.logFormat)
	if err != nil {
		return err
	}
	defer logs.close()
	rlsOnly := o.rlsOnly()
	// An RLS only loads no descriptors file, not even the built-in example:
	// ext_authz is not served.
	var cfg *descriptors.Config
	if rlsOnly {
		log.Info("no --config: serving the ratelimit service (RLS) only; ext_authz is not served (Check answers UNIMPLEMENTED) and no descriptors file is loaded")
	} else {
		if cfg, err = loadConfig(o.config); err != nil {
			return err
		}
		if o.config == "" {
			log.Warn("no --config given: enforcing the built-in example rules", "file", descriptors.ExampleName)
		}
	}
	if o.deadlineRaised {
		log.Warn("--check-deadline raised to fit --redis-timeout: keep Envoy's ext_authz timeout above it",
			"check_deadline", o.checkDeadline.String(), "redis_timeout", o.redisTimeout.String())
	}
	fleetName := rlsFleet // the sidecars serving the RLS
	if cfg != nil {
		fleetName = cfg.Domain
	}
	b, err := newBackend(o, o.keys, fleetName, log)
	if err != nil {
		return err
	}
	defer b.close()

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	reg.MustRegister(b.collectors()...)
	reg.MustRegister(logs.collector())
	wu := &warmup{timeout: o.warmupTimeout}
	reg.MustRegister(wu.collectors()...)
	core, err := newCore(o, b, reg, log)
	if err != nil {
		return err
	}
	var srv *extauthz.Server
	var codec encoding.CodecV2 // grpc-go's, unless ext_authz is served
	if cfg != nil {
		if srv, err = extauthz.NewServer(cfg, extauthz.Options{Core: core, Keys: o.keys}); err != nil {
			return err
		}
		codec = srv.Codec()
	}
	rlsSrv, err := newRLS(o, core)
	if err != nil {
		return err
	}

	rlHTTP, err := newRatelimitHTTP(o.rlsHTTP)
	if err != nil {
		return err
	}
	grpcTLS, err := newGRPCTLS(o, reg, log)
	if err != nil {
		rlHTTP.close()
		return err
	}
	front, err := newHTTPFront(o, srv, cfg, reg, log)
	if err != nil {
		rlHTTP.close()
		return err
	}
	grpcLis, err := host.Listen(o.grpcAddr)
	if err != nil {
		front.close()
		rlHTTP.close()
		return fmt.Errorf("--grpc-addr: %w", err)
	}
	var httpLis net.Listener
	if o.httpAddr != "" {
		if httpLis, err = host.Listen(o.httpAddr); err != nil {
			grpcLis.Close()
			front.close()
			rlHTTP.close()
			return fmt.Errorf("--http-addr: %w", err)
		}
	}
	authzLis, authzHandler := front.listener()
	// h is set before anything is served: /healthcheck follows its health.
	var h *host.Host
	var rlsSvc *rls.Server
	if rlsSrv != nil {
		rlsSvc = rlsSrv.srv
	}
	rlLis, rlHandler := rlHTTP.listener(rlsSvc, func() bool { return h.Serving() })
	h, err = host.New(host.Options{
		GRPC: grpcLis, HTTP: httpLis, GRPCMaxConns: o.grpcMaxConns, GRPCMaxPending: o.grpcMaxPending, HTTPMaxConns: o.httpMaxConns,
		HTTPAuthz: authzLis, HTTPAuthzHandler: authzHandler, HTTPAuthzMaxConns: o.httpAuthzMaxConns,
		RLSHTTP: rlLis, RLSHTTPHandler: rlHandler, RLSHTTPMaxConns: o.rlsHTTPMaxConns,
		Codec: codec, Registry: reg, Pprof: o.pprof, TLS: grpcTLS.config(),
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	})
	if err != nil {
		grpcLis.Close()
		if httpLis != nil {
			httpLis.Close()
		}
		front.close()
		rlHTTP.close()
		return err
	}
	if srv != nil {
		srv.Register(h)
	}
	// Listening, not serving yet: health turns SERVING once the backend is
	// warm (waitBackend says so).
	rulesFile := ""
	if cfg != nil {
		rulesFile = cfg.Name
	}
	log.Info("flashgate listening", "grpc_addr", h.GRPCAddr(), "grpc_tls", grpcTLS.mode(), "http_addr", h.HTTPAddr(), "http_authz_addr", h.HTTPAuthzAddr(),
		"backend", b.describe, "failure_mode", o.failureMode.String(), "shadow", o.shadow, "rules_file", rulesFile,
		"rls_http_addr", h.RLSHTTPAddr())

	ctx, stop := context.WithCancel(ctx)
	defer stop()
	var wg sync.WaitGroup
	ready := rlsSrv.start(ctx, &wg, h, h, log)
	grpcTLS.start(ctx, &wg)
	wg.Go(func() { waitBackend(ctx, ready, b, wu, o.failureMode.String(), log) })
	wg.Go(func() { b.run(ctx, log) })
	if !rlsOnly {
		rules := srv.Reloader(o.config) // "": the built-in example, nothing to watch
		wg.Go(func() { _ = rules.Watch(ctx, 0) })
		wg.Go(func() { reloadOnSIGHUP(ctx, rules, srv, log) })
	} else {
		// SIGHUP never ends the process: a config directory reloads on its
		// own handler, and an xDS config has no file to reload.
		wg.Go(func() { onSIGHUP(ctx, func() {}) })
	}
	if e.serveStarted != nil {
		e.serveStarted(serveInfo{grpcAddr: h.GRPCAddr(), httpAddr: h.HTTPAddr(), httpAuthzAddr: h.HTTPAuthzAddr(), server: srv, host: h})
	}

	runErr := h.Serve(ctx)
	if runErr == nil {
		log.Info("shutting down: not serving, draining in-flight checks", "deadline", o.drainTimeout.String())
	} else {
		log.Error("a listener failed; shutting down", "error", runErr)
	}
	stop()
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), o.drainTimeout)
	defer cancel()
	if err := h.Shutdown(dctx); err != nil {
		log.Warn("drain deadline passed: remaining checks were cut", "error", err)
	}
	wg.Wait()
	if runErr == nil {
		log.Info("stopped")
	}
	return runErr
}

// warmup is the state of the backend's warm-up, for /metrics.
type warmup struct {
	// timeout is --warmup-timeout (0: none).
	timeout time.Duration
	// warm is set once the backend warmed up; expired once health turned
	// SERVING without it.
	warm, expired atomic.Bool
}

func (w *warmup) collectors() []prometheus.Collector {
	bit := func(b *atomic.Bool) float64 {
		if b.Load() {
			return 1
		}
		return 0
	}
	return []prometheus.Collector{
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "flashgate_backend_warm",
			Help: "1 once the backend warmed up (Redis answered, script loaded, fleet counted), else 0.",
		}, func() float64 { return bit(&w.warm) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "flashgate_warmup_expired_total",
			Help: "1 when health turned SERVING at --warmup-timeout with the backend not warm (checks then take the failure mode while Redis fails), else 0.",
		}, func() float64 { return bit(&w.expired) }),
	}
}

// servingSetter is what waitBackend turns SERVING: the host's health.
type servingSetter interface{ SetServing(bool) }

// waitBackend warms the backend up (see backend.warm) until it succeeds,
// with exponential backoff between pingBackoffMin and pingBackoffMax, then
// turns health SERVING. When w.timeout passes first, health turns SERVING
// then (logged once, counted), the failure mode deciding while Redis
// fails, and the warm-up goes on. The memory backend is ready at once.
func waitBackend(ctx context.Context, srv servingSetter, b *backend, w *warmup, failureMode string, log *slog.Logger) {
	var expiry time.Time
	if w.timeout > 0 {
		expiry = time.Now().Add(w.timeout)
	}
	serving := false
	// remaining cuts d to what is left of the warm-up's bound (1ms at
	// least) while health is not SERVING yet; d itself once it is, or
	// without a bound.
	remaining := func(d time.Duration) time.Duration {
		if serving || expiry.IsZero() {
			return d
		}
		return max(min(d, time.Until(expiry)), time.Millisecond)
	}
	pause := pingBackoffMin
	for attempt := 1; ; attempt++ {
		pctx, cancel := context.WithTimeout(ctx, remaining(2*time.Second))
		err := b.warm(pctx)
		cancel()
		if ctx.Err() != nil {
			return
		}
		if err == nil {
			w.warm.Store(true)
			switch {
			case b.redis == nil:
				srv.SetServing(true)
				log.Info("memory backend ready; serving")
			case serving:
				log.Info("redis warm (script loaded, connections open, fleet counted), after --warmup-timeout",
					"attempts", attempt, "fleet_size", b.fleetSize())
			default:
				srv.SetServing(true)
				log.Info("redis warm (script loaded, connections open, fleet counted); serving",
					"attempts", attempt, "fleet_size", b.fleetSize())
			}
			return
		}
		switch {
		case !serving && !expiry.IsZero() && !time.Now().Before(expiry):
			serving = true
			w.expired.Store(true)
			srv.SetServing(true)
			log.Warn("redis warm-up did not finish within --warmup-timeout; serving anyway, by the failure mode while Redis fails, and warming on",
				"warmup_timeout", w.timeout.String(), "failure_mode", failureMode, "backend", b.describe,
				"attempts", attempt, "error", err)
		case serving:
			log.Warn("redis warm-up failed; serving by the failure mode, will retry", "backend", b.describe,
				"attempt", attempt, "retry_in", pause.String(), "error", err)
		default:
			log.Error("redis is not ready; not serving, will retry", "backend", b.describe,
				"attempt", attempt, "retry_in", remaining(pause).String(), "error", err)
		}
		t := time.NewTimer(remaining(pause))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		pause = min(2*pause, pingBackoffMax)
	}
}

// reloadOnSIGHUP reloads the rules on every SIGHUP until ctx ends.
func reloadOnSIGHUP(ctx context.Context, r *enforce.Reloader, srv *extauthz.Server, log *slog.Logger) {
	onSIGHUP(ctx, func() {
		switch err := r.Reload(); {
		case errors.Is(err, enforce.ErrNoPath):
			log.Warn("SIGHUP: the built-in example rules have no file to reload")
		case err != nil:
			// Reload has logged and counted it.
		default:
			log.Info("SIGHUP: rules reloaded", "file", srv.Config().Name)
		}
	})
}

// rlsFleet names the fleet of sidecars that serve the RLS only.
const rlsFleet = "rls"

// onSIGHUP calls fn on every SIGHUP until ctx ends.
func onSIGHUP(ctx context.Context, fn func()) {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	for {
		select {
		case <-ctx.Done():
			return
		case <-hup:
			fn()
		}
	}
}
