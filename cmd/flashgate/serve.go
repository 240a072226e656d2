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
	"sync/atomic"
	"syscall"
	"time"

	"github.com/flashgate/flashgate/extauthz"
	"github.com/flashgate/flashgate/rls"
	"github.com/flashgate/flashgate/window/redisstore"
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

Health turns SERVING once the rules are loaded and the backend is warm
(Redis answered, the script is loaded, the fleet is counted); Redis that is
down or refuses writes is retried with backoff while health stays
NOT_SERVING, for --warmup-timeout at most: then health turns SERVING
anyway, checks are decided by the failure mode while Redis fails, and the
warm-up goes on in the background. Warnings and errors of one kind are
logged once per 10s at most (the rest counted in
flashgate_log_suppressed_total). The descriptors file is reloaded when it
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
	log, logs, err := newLogger(e.stderr, o.logLevel, o.logFormat)
	if err != nil {
		return err
	}
	defer logs.close()
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
	reg.MustRegister(logs.collector())
	wu := &warmup{timeout: o.warmupTimeout}
	reg.MustRegister(wu.collectors()...)
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

	rawGRPC, err := listen(o.grpcAddr)
	if err != nil {
		return fmt.Errorf("--grpc-addr: %w", err)
	}
	grpcLis := newCapListener(rawGRPC, o.grpcMaxConns, false)
	reg.MustRegister(listenerCollectors("grpc", grpcLis)...)
	gs := srv.NewGRPCServer()
	var httpLis net.Listener
	var hs *http.Server
	if o.httpAddr != "" {
		raw, err := listen(o.httpAddr)
		if err != nil {
			grpcLis.Close()
			return fmt.Errorf("--http-addr: %w", err)
		}
		capped := newCapListener(raw, o.httpMaxConns, true)
		reg.MustRegister(listenerCollectors("http", capped)...)
		httpLis, hs = capped, newHTTPServer(httpHandler(srv, o.pprof), capped, o.pprof)
	}
	// Listening, not serving yet: health turns SERVING once the backend is
	// warm (waitBackend says so).
	log.Info("flashgate listening", "grpc_addr", grpcLis.Addr().String(), "http_addr", addrOf(httpLis),
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
	wg.Go(func() { waitBackend(ctx, srv, b, wu, o.failureMode.String(), log) })
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
		return redisstore.ModeSentinel
	case len(o.redisAddrs) == 1:
		return redisstore.ModeStandalone
	}
	return redisstore.ModeCluster
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

// waitBackend warms the backend up (see backend.warm) until it succeeds,
// with exponential backoff between pingBackoffMin and pingBackoffMax, then
// turns health SERVING. When w.timeout passes first, health turns SERVING
// then (logged once, counted), the failure mode deciding while Redis
// fails, and the warm-up goes on. The memory backend is ready at once.
func waitBackend(ctx context.Context, srv *extauthz.Server, b *backend, w *warmup, failureMode string, log *slog.Logger) {
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
				log.Info("rules loaded; serving")
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

// Timeouts of the --http-addr server: a request is read within
// httpReadTimeout and answered within httpWriteTimeout (profiles and traces
// of --pprof may take longer); a keep-alive connection idle for
// httpIdleTimeout is closed.
const (
	httpReadHeaderTimeout = 5 * time.Second
	httpReadTimeout       = 10 * time.Second
	httpWriteTimeout      = 30 * time.Second
	httpPprofWriteTimeout = 2 * time.Minute
	httpIdleTimeout       = 30 * time.Second
)

// newHTTPServer returns the /metrics, /healthz and /readyz server, its
// connections tracked by lis (the idle ones evicted first at its cap).
func newHTTPServer(h http.Handler, lis *capListener, withPprof bool) *http.Server {
	write := httpWriteTimeout
	if withPprof {
		write = httpPprofWriteTimeout
	}
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: httpReadHeaderTimeout,
		ReadTimeout:       httpReadTimeout,
		WriteTimeout:      write,
		IdleTimeout:       httpIdleTimeout,
		MaxHeaderBytes:    64 << 10,
		ConnState:         lis.trackState,
	}
}

// listenerCollectors export a capped listener's open connections and the
// ones it closed at its cap, labelled listener=name.
func listenerCollectors(name string, l *capListener) []prometheus.Collector {
	labels := prometheus.Labels{"listener": name}
	return []prometheus.Collector{
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "flashgate_conns_open", ConstLabels: labels,
			Help: "Connections open on a listener (grpc: --grpc-addr, http: --http-addr).",
		}, func() float64 { return float64(l.open()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "flashgate_conns_shed_total", ConstLabels: labels,
			Help: "Connections closed because the listener was at --grpc-max-conns or --http-max-conns (http: the one idle the longest, or the new one when none was idle; grpc: the new one).",
		}, func() float64 { return float64(l.shed.Load()) }),
	}
}
