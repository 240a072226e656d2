package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/flashgate/flashgate/extauthz"
	"github.com/flashgate/flashgate/rls"
	"github.com/flashgate/flashgate/window"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/spf13/cobra"
	"google.golang.org/grpc"
)

func newServeCmd(e env) *cobra.Command {
	var o serveOptions
	cmd := &cobra.Command{
		Use:   "serve [flags]",
		Short: "Run the ext_authz rate-limit server",
		Long: `serve runs the Envoy ext_authz (gRPC v3) server: ext_authz, grpc.health.v1 and
reflection on --grpc-addr; /metrics, /healthz and /readyz on --http-addr.

Every flag can also be set as FLASHGATE_<FLAG> (upper case, - becomes _);
flags win over the environment.

Health turns SERVING once the rules are loaded and the backend answered a
PING; an unreachable Redis is retried with backoff (each failure logged)
while health stays NOT_SERVING. The descriptors file is reloaded when it
changes and on SIGHUP; a bad file keeps the old rules. On SIGTERM or SIGINT
health turns NOT_SERVING, in-flight checks finish (up to --drain-timeout),
and serve exits 0.`,
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
	grpcAddr, httpAddr string
	server             *extauthz.Server
}

// pingBackoff bounds the pause between PINGs of an unreachable backend.
const (
	pingBackoffMin = 100 * time.Millisecond
	pingBackoffMax = 5 * time.Second
)

// runServe runs the server until ctx ends, then drains it and returns nil;
// it returns an error if it cannot start or a listener fails.
func runServe(ctx context.Context, e env, o *serveConfig) error {
	log, err := newLogger(e.stderr, o.logLevel, o.logFormat)
	if err != nil {
		return err
	}
	cfg, err := loadConfig(o.config)
	if err != nil {
		return err
	}
	if o.config == "" {
		log.Warn("no --config given: enforcing the built-in example rules", "file", extauthz.ExampleName)
	}
	if o.deadlineRaised {
		log.Warn("--check-deadline raised to fit --redis-timeout: keep Envoy's ext_authz timeout above it",
			"check_deadline", o.checkDeadline.String(), "redis_timeout", o.redisTimeout.String())
	}
	b, err := newBackend(o, o.keys, cfg.Domain, log)
	if err != nil {
		return err
	}
	defer b.close()

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	reg.MustRegister(b.collectors()...)
	core, err := newCore(o, b, reg, log)
	if err != nil {
		return err
	}
	opts := extauthz.Options{Core: core, Keys: o.keys}
	if o.rlsConfig != "" {
		opts.HealthServices = []string{rls.ServiceName}
	}
	srv, err := extauthz.NewServer(cfg, opts)
	if err != nil {
		return err
	}
	rlsSrv, err := newRLS(o, core)
	if err != nil {
		return err
	}

	grpcLis, err := listen(o.grpcAddr)
	if err != nil {
		return fmt.Errorf("--grpc-addr: %w", err)
	}
	gs := srv.NewGRPCServer()
	var httpLis net.Listener
	var hs *http.Server
	if o.httpAddr != "" {
		if httpLis, err = listen(o.httpAddr); err != nil {
			grpcLis.Close()
			return fmt.Errorf("--http-addr: %w", err)
		}
		hs = &http.Server{Handler: httpHandler(srv, o.pprof), ReadHeaderTimeout: 5 * time.Second}
	}
	log.Info("flashgate serving", "grpc_addr", grpcLis.Addr().String(), "http_addr", addrOf(httpLis),
		"backend", b.describe, "failure_mode", o.failureMode.String(), "shadow", o.shadow, "rules_file", cfg.Name)

	ctx, stop := context.WithCancel(ctx)
	defer stop()
	errc := make(chan error, 2)
	var wg sync.WaitGroup
	rlsSrv.start(ctx, &wg, gs, log)
	wg.Go(func() {
		if err := gs.Serve(grpcLis); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			errc <- fmt.Errorf("grpc server on %s: %w", grpcLis.Addr(), err)
		}
	})
	if hs != nil {
		wg.Go(func() {
			if err := hs.Serve(httpLis); err != nil && !errors.Is(err, http.ErrServerClosed) {
				errc <- fmt.Errorf("http server on %s: %w", httpLis.Addr(), err)
			}
		})
	}
	wg.Go(func() { waitBackend(ctx, srv, b, log) })
	wg.Go(func() { b.run(ctx, log) })
	if o.config != "" {
		wg.Go(func() { _ = srv.WatchFile(ctx, o.config, 0) })
	}
	wg.Go(func() { reloadOnSIGHUP(ctx, srv, log) })
	if e.serveStarted != nil {
		e.serveStarted(serveInfo{grpcAddr: grpcLis.Addr().String(), httpAddr: addrOf(httpLis), server: srv})
	}

	var runErr error
	select {
	case <-ctx.Done():
		log.Info("shutting down: not serving, draining in-flight checks", "deadline", o.drainTimeout.String())
	case runErr = <-errc:
		log.Error("a listener failed; shutting down", "error", runErr)
	}
	stop()
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), o.drainTimeout)
	defer cancel()
	if err := srv.Shutdown(dctx, gs); err != nil {
		log.Warn("drain deadline passed: remaining checks were cut", "error", err)
	}
	if hs != nil {
		hctx, hcancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		_ = hs.Shutdown(hctx)
		hcancel()
	}
	wg.Wait()
	if runErr == nil {
		log.Info("stopped")
	}
	return runErr
}

func modeName(o *serveOptions) string {
	switch {
	case o.redisMode != "":
		return o.redisMode
	case o.redisMasterName != "":
		return window.ModeSentinel
	case len(o.redisAddrs) == 1:
		return window.ModeStandalone
	}
	return window.ModeCluster
}

// waitBackend warms the backend up (see backend.warm) until it succeeds,
// with exponential backoff between pingBackoffMin and pingBackoffMax,
// logging every failure, then turns health SERVING. The memory backend is
// ready at once.
func waitBackend(ctx context.Context, srv *extauthz.Server, b *backend, log *slog.Logger) {
	pause := pingBackoffMin
	for attempt := 1; ; attempt++ {
		pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		err := b.warm(pctx)
		cancel()
		if ctx.Err() != nil {
			return
		}
		if err == nil {
			srv.SetServing(true)
			if b.redis == nil {
				log.Info("rules loaded; serving")
			} else {
				log.Info("redis warm (script loaded, connections open, fleet counted); serving",
					"attempts", attempt, "fleet_size", b.fleetSize())
			}
			return
		}
		log.Error("redis is not ready; not serving, will retry", "backend", b.describe,
			"attempt", attempt, "retry_in", pause, "error", err)
		t := time.NewTimer(pause)
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
func reloadOnSIGHUP(ctx context.Context, srv *extauthz.Server, log *slog.Logger) {
	onSIGHUP(ctx, func() {
		switch err := srv.Reload(); {
		case errors.Is(err, extauthz.ErrNoFile):
			log.Warn("SIGHUP: the built-in example rules have no file to reload")
		case err != nil:
			// Reload has logged and counted it.
		default:
			log.Info("SIGHUP: rules reloaded", "file", srv.Config().Name)
		}
	})
}

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

// httpHandler is extauthz's /metrics, /healthz and /readyz, plus
// /debug/pprof/ with --pprof.
func httpHandler(srv *extauthz.Server, withPprof bool) http.Handler {
	h := srv.HTTPHandler()
	if !withPprof {
		return h
	}
	mux := http.NewServeMux()
	mux.Handle("/", h)
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	return mux
}

// listen listens on "host:port" (TCP) or "unix:///path".
func listen(addr string) (net.Listener, error) {
	if path, ok := strings.CutPrefix(addr, "unix://"); ok {
		return net.Listen("unix", path)
	}
	return net.Listen("tcp", addr)
}

func addrOf(l net.Listener) string {
	if l == nil {
		return ""
	}
	return l.Addr().String()
}
