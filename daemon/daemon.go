package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"google.golang.org/grpc/encoding"

	"github.com/flashgate/flashgate/descriptors"
	"github.com/flashgate/flashgate/enforce"
	"github.com/flashgate/flashgate/extauthz"
	"github.com/flashgate/flashgate/host"
	"github.com/flashgate/flashgate/rls/rlshttp"
)

// rlsFleet names the fleet of sidecars that serve the RLS only.
const rlsFleet = "rls"

// Daemon is one flashgate process: the limiter stack, the front-ends of
// its options and the host that serves them. New builds it, Serve runs it
// until its context ends and then drains it; its methods are safe for
// concurrent use.
type Daemon struct {
	opts    Options
	log     *slog.Logger
	logs    *logLimit
	backend *backend
	warmup  *warmup
	// authz and rules are nil when ext_authz is not served (RLSOnly).
	authz *extauthz.Server
	rules *enforce.Reloader
	rls   *rlsService
	tls   *grpcTLS
	host  *host.Host
	// listeners are closed by Close, in case the host never served them.
	listeners []net.Listener
	// closers release what New acquired, run last to first by Close.
	closers   []func()
	closeOnce sync.Once
	served    atomic.Bool
}

// New builds the process of o: it loads the rules, builds the limiter
// stack and the front-ends, and listens on every address, without serving
// yet. On an error it has released what it acquired. Errors in a
// descriptors file or a ratelimit config are *descriptors.ConfigError
// (rls.ConfigError), unwrapped.
func New(o Options) (_ *Daemon, err error) {
	if err := o.validate(); err != nil {
		return nil, fmt.Errorf("daemon: %w", err)
	}
	d := &Daemon{opts: o, logs: newLogLimit(logEvery, time.Now)}
	d.log = slog.New(d.logs.handler(o.LogHandler))
	d.onClose(d.logs.close)
	defer func() {
		if err != nil {
			d.Close()
		}
	}()
	var cfg *descriptors.Config
	if o.RLSOnly() {
		d.log.Info("no --config: serving the ratelimit service (RLS) only; ext_authz is not served (Check answers UNIMPLEMENTED) and no descriptors file is loaded")
	} else {
		if cfg, err = LoadRules(o.Config); err != nil {
			return nil, err
		}
		if o.Config == "" {
			d.log.Warn("no --config given: enforcing the built-in example rules", "file", descriptors.ExampleName)
		}
	}
	if o.DeadlineRaised {
		d.log.Warn("--check-deadline raised to fit --redis-timeout: keep Envoy's ext_authz timeout above it",
			"check_deadline", o.CheckDeadline.String(), "redis_timeout", o.RedisTimeout.String())
	}
	fleetName := rlsFleet // the sidecars serving the RLS
	if cfg != nil {
		fleetName = cfg.Domain
	}
	if d.backend, err = newBackend(&d.opts, fleetName, d.log); err != nil {
		return nil, err
	}
	d.onClose(d.backend.close)

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	reg.MustRegister(d.backend.collectors()...)
	reg.MustRegister(d.logs.collector())
	d.warmup = &warmup{timeout: o.WarmupTimeout}
	reg.MustRegister(d.warmup.collectors()...)
	core, err := d.newCore(reg)
	if err != nil {
		return nil, err
	}
	var codec encoding.CodecV2 // grpc-go's, unless ext_authz is served
	if cfg != nil {
		if d.authz, err = extauthz.NewServer(cfg, extauthz.Options{Core: core, Keys: o.Keys}); err != nil {
			return nil, err
		}
		codec = d.authz.Codec()
	}
	if d.rls, err = newRLS(&d.opts, core); err != nil {
		return nil, err
	}
	if d.tls, err = newGRPCTLS(o.GRPCTLS, reg, d.log); err != nil {
		return nil, err
	}
	if err := d.listen(cfg, codec, reg); err != nil {
		return nil, err
	}
	return d, nil
}

// listen opens every listener and builds the host on them.
func (d *Daemon) listen(cfg *descriptors.Config, codec encoding.CodecV2, reg *prometheus.Registry) error {
	o := &d.opts
	var rlLis net.Listener
	var rlHandler http.Handler
	if o.RLSHTTPAddr != "" && d.rls != nil {
		lis, err := d.listenOn("--rls-http-addr", o.RLSHTTPAddr)
		if err != nil {
			return err
		}
		rlLis, rlHandler = lis, rlshttp.Handler(d.rls.srv, d.Serving)
	}
	front, err := newHTTPFront(o, d.authz, cfg, reg, d.log)
	if err != nil {
		return err
	}
	var authzLis net.Listener
	var authzHandler http.Handler
	if front != nil {
		d.listeners = append(d.listeners, front.lis)
		authzLis, authzHandler = front.lis, front.handler
	}
	grpcLis, err := d.listenOn("--grpc-addr", o.GRPCAddr)
	if err != nil {
		return err
	}
	var httpLis net.Listener
	if o.HTTPAddr != "" {
		if httpLis, err = d.listenOn("--http-addr", o.HTTPAddr); err != nil {
			return err
		}
	}
	h, err := host.New(host.Options{
		GRPC: grpcLis, HTTP: httpLis, GRPCMaxConns: o.GRPCMaxConns, GRPCMaxPending: o.GRPCMaxPending, HTTPMaxConns: o.HTTPMaxConns,
		HTTPAuthz: authzLis, HTTPAuthzHandler: authzHandler, HTTPAuthzMaxConns: o.HTTPAuthzMaxConns,
		RLSHTTP: rlLis, RLSHTTPHandler: rlHandler, RLSHTTPMaxConns: o.RLSHTTPMaxConns,
		Codec: codec, Registry: reg, Pprof: o.Pprof, TLS: d.tls.config(),
		ErrorLog: slog.NewLogLogger(d.log.Handler(), slog.LevelWarn),
	})
	if err != nil {
		return err
	}
	d.host = h
	if d.authz != nil {
		d.authz.Register(h)
		d.rules = d.authz.Reloader(o.Config) // "": the built-in example, nothing to watch
	}
	// Listening, not serving yet: health turns SERVING once the backend is
	// warm (waitBackend says so).
	rulesFile := ""
	if cfg != nil {
		rulesFile = cfg.Name
	}
	d.log.Info("flashgate listening", "grpc_addr", h.GRPCAddr(), "grpc_tls", d.tls.mode(), "http_addr", h.HTTPAddr(), "http_authz_addr", h.HTTPAuthzAddr(),
		"backend", d.backend.describe, "failure_mode", o.FailureMode.String(), "shadow", o.Shadow, "rules_file", rulesFile,
		"rls_http_addr", h.RLSHTTPAddr())
	return nil
}

// listenOn listens on addr, an error naming flag, and keeps the listener
// for Close.
func (d *Daemon) listenOn(flag, addr string) (net.Listener, error) {
	lis, err := host.Listen(addr)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", flag, err)
	}
	d.listeners = append(d.listeners, lis)
	return lis, nil
}

// newCore builds the enforcement core every front-end shares: the
// backend's limiter stack and fallback, the failure mode, shadow and
// rate-limit header options, reg and the logger.
func (d *Daemon) newCore(reg prometheus.Registerer) (*enforce.Core, error) {
	opts := enforce.Options{
		Limiter:     d.backend.limiter,
		FailureMode: d.opts.FailureMode,
		Shadow:      d.opts.Shadow,
		Headers:     d.opts.Headers,
		Registerer:  reg,
		Logger:      d.log,
	}
	if d.backend.fallback != nil { // a nil *fallback.Fallback must not become a non-nil Fallback
		opts.Fallback = d.backend.fallback
	}
	if d.backend.overrides != nil {
		opts.Overrides = d.backend.overrides.book
	}
	return enforce.New(opts)
}

// Serve serves until ctx ends, or a listener fails, then drains: health
// turns NOT_SERVING, every listener of checks stops accepting, in-flight
// checks finish (up to Options.DrainTimeout), the goroutines it started
// return, and it releases all New acquired (Close). It returns nil after a
// drain that ctx began, the listener's error otherwise. Serve runs once.
func (d *Daemon) Serve(ctx context.Context) error {
	if !d.served.CompareAndSwap(false, true) {
		return errors.New("daemon: Serve called twice")
	}
	defer d.Close()
	ctx, stop := context.WithCancel(ctx)
	defer stop()
	var wg sync.WaitGroup
	ready := d.rls.start(ctx, &wg, d.host, d.host, d.log)
	d.tls.start(ctx, &wg)
	wg.Go(func() { waitBackend(ctx, ready, d.backend, d.warmup, d.opts.FailureMode.String(), d.log) })
	wg.Go(func() { d.backend.run(ctx, d.log) })
	if d.rules != nil {
		wg.Go(func() { _ = d.rules.Watch(ctx, 0) })
	}

	runErr := d.host.Serve(ctx)
	if runErr == nil {
		d.log.Info("shutting down: not serving, draining in-flight checks", "deadline", d.opts.DrainTimeout.String())
	} else {
		d.log.Error("a listener failed; shutting down", "error", runErr)
	}
	stop()
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), d.opts.DrainTimeout)
	defer cancel()
	if err := d.host.Shutdown(dctx); err != nil {
		d.log.Warn("drain deadline passed: remaining checks were cut", "error", err)
	}
	wg.Wait()
	if runErr == nil {
		d.log.Info("stopped")
	}
	return runErr
}

// ServeReloading is [Daemon.Serve] that calls [Daemon.Reload] on every
// value of reload meanwhile (the process's SIGHUP).
func (d *Daemon) ServeReloading(ctx context.Context, reload <-chan os.Signal) error {
	ctx, stop := context.WithCancel(ctx)
	defer stop()
	reloads := make(chan struct{})
	go func() {
		defer close(reloads)
		for {
			select {
			case <-ctx.Done():
				return
			case <-reload:
				d.Reload()
			}
		}
	}()
	err := d.Serve(ctx)
	stop()
	<-reloads
	return err
}

// Reload reads the descriptors file, the ratelimit config directory and
// the TLS files again (the SIGHUP reload). A bad file keeps what is in
// force; the reloaders log and count it.
func (d *Daemon) Reload() {
	if d.rules != nil {
		switch err := d.rules.Reload(); {
		case errors.Is(err, enforce.ErrNoPath):
			d.log.Warn("SIGHUP: the built-in example rules have no file to reload")
		case err != nil:
			// Reload has logged and counted it.
		default:
			d.log.Info("SIGHUP: rules reloaded", "file", d.authz.Config().Name)
		}
	}
	d.rls.reload(d.log)
	d.tls.reload()
}

// Close releases what New acquired (listeners, Redis clients, the local
// cache's sweeper) and writes the log lines still held back. Serve calls
// it as it returns; call it for a Daemon that is not served. It is
// idempotent.
func (d *Daemon) Close() {
	d.closeOnce.Do(func() {
		for _, l := range d.listeners {
			_ = l.Close()
		}
		for i := len(d.closers) - 1; i >= 0; i-- {
			d.closers[i]()
		}
	})
}

// onClose adds fn to what Close runs; fn runs before the ones added before.
func (d *Daemon) onClose(fn func()) { d.closers = append(d.closers, fn) }

// GRPCAddr is the gRPC listener's address.
func (d *Daemon) GRPCAddr() string { return d.host.GRPCAddr() }

// HTTPAddr is the address of /metrics, /healthz and /readyz; "" without.
func (d *Daemon) HTTPAddr() string { return d.host.HTTPAddr() }

// HTTPAuthzAddr is the HTTP front-end's address; "" without.
func (d *Daemon) HTTPAuthzAddr() string { return d.host.HTTPAuthzAddr() }

// RLSHTTPAddr is the address of /healthcheck and /json; "" without.
func (d *Daemon) RLSHTTPAddr() string { return d.host.RLSHTTPAddr() }

// Serving reports whether health is SERVING.
func (d *Daemon) Serving() bool { return d.host != nil && d.host.Serving() }

// ExtAuthz is the ext_authz server; nil when it is not served (RLSOnly).
func (d *Daemon) ExtAuthz() *extauthz.Server { return d.authz }

// LoadRules loads the descriptors file, or the built-in example for "".
// Errors in the file are *descriptors.ConfigError, unwrapped, so that they
// print as FILE:LINE:COL: message.
func LoadRules(file string) (*descriptors.Config, error) {
	if file == "" {
		cfg, err := descriptors.ExampleConfig()
		if err != nil {
			return nil, fmt.Errorf("built-in example: %w", err)
		}
		return cfg, nil
	}
	return descriptors.LoadFile(file)
}
