package host

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log"
	"net"
	"net/http"
	"net/http/pprof"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/reflection"
)

// MaxRecvMsgSize is the largest request message accepted.
const MaxRecvMsgSize = 4 << 20

// StreamWorkers is how many goroutines serve calls.
const StreamWorkers = 128

// MaxConcurrentStreams bounds the calls in flight on one connection.
const MaxConcurrentStreams = 1024

// MaxHeaderListSize bounds the HTTP/2 headers of one call.
const MaxHeaderListSize = 64 << 10

// HandshakeTimeout bounds a new connection's TLS and HTTP/2 handshake.
const HandshakeTimeout = 10 * time.Second

// ServerOptions returns a new slice of the host's gRPC server options, with
// codec in place of the proto codec unless nil. Keepalive enforcement
// accepts Envoy's pings without streams (never GOAWAY too_many_pings); a
// maximum connection age rebalances Envoy's long-lived connections; worker
// goroutines serve calls so a call's stack grows once per worker.
func ServerOptions(codec encoding.CodecV2) []grpc.ServerOption {
	opts := []grpc.ServerOption{
		grpc.MaxRecvMsgSize(MaxRecvMsgSize),
		grpc.MaxConcurrentStreams(MaxConcurrentStreams),
		grpc.MaxHeaderListSize(MaxHeaderListSize),
		grpc.ConnectionTimeout(HandshakeTimeout),
		grpc.NumStreamWorkers(StreamWorkers),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{
			MinTime:             5 * time.Second,
			PermitWithoutStream: true,
		}),
		grpc.KeepaliveParams(keepalive.ServerParameters{
			Time:                  30 * time.Second,
			Timeout:               10 * time.Second,
			MaxConnectionAge:      5 * time.Minute,
			MaxConnectionAgeGrace: 30 * time.Second,
		}),
	}
	if codec != nil {
		opts = append(opts, grpc.ForceServerCodecV2(codec))
	}
	return opts
}

// Registry is where the host registers its metrics, served on /metrics.
type Registry interface {
	prometheus.Registerer
	prometheus.Gatherer
}

// Options configure a [Host]. Only GRPC is required.
type Options struct {
	GRPC net.Listener
	// HTTP is the listener of /metrics, /healthz and /readyz; nil: none.
	HTTP net.Listener
	// HTTPAuthz is the HTTP front-end's listener; nil: none.
	HTTPAuthz        net.Listener
	HTTPAuthzHandler http.Handler
	// RLSHTTP is ratelimit's HTTP side's listener; nil: none.
	RLSHTTP        net.Listener
	RLSHTTPHandler http.Handler
	// GRPCMaxConns, HTTPMaxConns, HTTPAuthzMaxConns and RLSHTTPMaxConns cap
	// each listener's open connections (0: no cap; see capListener).
	GRPCMaxConns, HTTPMaxConns, HTTPAuthzMaxConns, RLSHTTPMaxConns int
	// GRPCMaxPending caps the gRPC connections still in their handshake;
	// 0 counts them against GRPCMaxConns.
	GRPCMaxPending int
	// ErrorLog takes the HTTP servers' error lines; nil: the log package's.
	ErrorLog *log.Logger
	// TLS, when set, makes the gRPC listener serve TLS only.
	TLS *tls.Config
	// Codec replaces grpc-go's proto codec on the gRPC server; nil keeps it.
	Codec encoding.CodecV2
	// Registry takes the host's metrics; nil means a new one.
	Registry Registry
	// Pprof serves /debug/pprof/ beside /metrics.
	Pprof bool
}

// Host is the process's server side; front-ends register on it before
// [Host.Serve]. Safe for concurrent use.
type Host struct {
	gs       *grpc.Server
	health   *health.Server
	watches  *watches
	handler  http.Handler
	grpcLis  net.Listener
	httpLis  net.Listener
	hs       *http.Server
	authz    *front // nil without Options.HTTPAuthz
	rlsHTTP  *front // nil without Options.RLSHTTP
	serving  atomic.Bool
	closed   atomic.Bool
	stopOnce sync.Once
	wg       sync.WaitGroup
	errc     chan error

	// mu guards services, and orders SetServing with Shutdown's closing.
	mu       sync.Mutex
	services []string
}

var _ grpc.ServiceRegistrar = (*Host)(nil)

// New returns a Host on opts's listeners, health NOT_SERVING. It fails
// without a gRPC listener or when its metrics cannot be registered.
func New(opts Options) (*Host, error) {
	if opts.GRPC == nil {
		return nil, errors.New("host: no gRPC listener given")
	}
	if opts.Registry == nil {
		opts.Registry = prometheus.NewRegistry()
	}
	gopts := ServerOptions(opts.Codec)
	if opts.TLS != nil {
		gopts = append(gopts, grpc.Creds(credentials.NewTLS(opts.TLS)))
	}
	h := &Host{
		gs:     grpc.NewServer(gopts...),
		health: health.NewServer(),
		errc:   make(chan error, 4),
	}
	h.watches = &watches{Server: h.health, streams: map[*watchStream]struct{}{}}
	healthpb.RegisterHealthServer(h.gs, h.watches)
	reflection.Register(h.gs)
	h.handler = newHandler(opts.Registry, h.Serving, opts.Pprof)
	var err error
	if h.grpcLis, err = capped("grpc", opts.GRPC, opts.GRPCMaxConns, opts.GRPCMaxPending, false, opts.Registry); err != nil {
		return nil, err
	}
	if opts.HTTP != nil {
		if h.httpLis, err = capped("http", opts.HTTP, opts.HTTPMaxConns, 0, true, opts.Registry); err != nil {
			return nil, err
		}
		h.hs = newHTTPServer(h.handler, h.httpLis, opts.Pprof)
		h.hs.ErrorLog = opts.ErrorLog
	}
	if opts.HTTPAuthz != nil {
		if opts.HTTPAuthzHandler == nil {
			return nil, errors.New("host: an HTTP front-end listener without its handler")
		}
		lis, err := capped("http_authz", opts.HTTPAuthz, opts.HTTPAuthzMaxConns, 0, true, opts.Registry)
		if err != nil {
			return nil, err
		}
		h.authz = &front{what: "http front-end", lis: lis, srv: newAuthzServer(opts.HTTPAuthzHandler, lis)}
		h.authz.srv.ErrorLog = opts.ErrorLog
	}
	if opts.RLSHTTP != nil {
		if opts.RLSHTTPHandler == nil {
			return nil, errors.New("host: a ratelimit HTTP listener without its handler")
		}
		lis, err := capped("rls_http", opts.RLSHTTP, opts.RLSHTTPMaxConns, 0, true, opts.Registry)
		if err != nil {
			return nil, err
		}
		h.rlsHTTP = &front{what: "ratelimit http", lis: lis, srv: newHTTPServer(opts.RLSHTTPHandler, lis, false)}
		h.rlsHTTP.srv.ErrorLog = opts.ErrorLog
	}
	h.SetServing(false)
	return h, nil
}

// capped returns l capped at max connections (l itself for 0).
func capped(name string, l net.Listener, max, maxPending int, evict bool, reg prometheus.Registerer) (net.Listener, error) {
	if max <= 0 {
		return l, nil
	}
	cl := newCapListener(l, max, evict)
	cl.maxPending = maxPending
	for _, c := range listenerCollectors(name, cl) {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("host: register the %s listener's metrics: %w", name, err)
		}
	}
	return cl, nil
}

// RegisterService implements grpc.ServiceRegistrar, adding the service to
// gRPC health. Call it before Serve.
func (h *Host) RegisterService(desc *grpc.ServiceDesc, impl any) {
	h.gs.RegisterService(desc, impl)
	h.mu.Lock()
	defer h.mu.Unlock()
	h.services = append(h.services, desc.ServiceName)
	h.setStatusLocked(desc.ServiceName)
}

// GRPCAddr returns the gRPC listener's address.
func (h *Host) GRPCAddr() string { return h.grpcLis.Addr().String() }

// HTTPAddr returns the HTTP listener's address, "" without one.
func (h *Host) HTTPAddr() string {
	if h.httpLis == nil {
		return ""
	}
	return h.httpLis.Addr().String()
}

// HTTPAuthzAddr returns the HTTP front-end's address, "" without one.
func (h *Host) HTTPAuthzAddr() string { return h.authz.addr() }

// RLSHTTPAddr returns ratelimit's HTTP address, "" without one.
func (h *Host) RLSHTTPAddr() string { return h.rlsHTTP.addr() }

// SetServing sets gRPC health and /readyz; no effect after Shutdown.
func (h *Host) SetServing(serving bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed.Load() {
		return
	}
	h.serving.Store(serving)
	h.setStatusLocked("")
	for _, name := range h.services {
		h.setStatusLocked(name)
	}
}

func (h *Host) setStatusLocked(name string) {
	st := healthpb.HealthCheckResponse_NOT_SERVING
	if h.serving.Load() {
		st = healthpb.HealthCheckResponse_SERVING
	}
	h.health.SetServingStatus(name, st)
}

// Serving reports what SetServing last set (false after Shutdown).
func (h *Host) Serving() bool { return h.serving.Load() && !h.closed.Load() }

// HTTPHandler returns the handler of the HTTP listener.
func (h *Host) HTTPHandler() http.Handler { return h.handler }

// Serve serves every listener until ctx ends (nil) or one fails (its
// error). It does not stop them: call Shutdown. Call it once.
func (h *Host) Serve(ctx context.Context) error {
	h.wg.Go(func() {
		if err := h.gs.Serve(h.grpcLis); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			h.errc <- fmt.Errorf("grpc server on %s: %w", h.grpcLis.Addr(), err)
		}
	})
	if h.hs != nil {
		h.wg.Go(func() {
			if err := h.hs.Serve(h.httpLis); err != nil && !errors.Is(err, http.ErrServerClosed) {
				h.errc <- fmt.Errorf("http server on %s: %w", h.httpLis.Addr(), err)
			}
		})
	}
	for _, f := range []*front{h.authz, h.rlsHTTP} {
		if f != nil {
			h.wg.Go(func() {
				if err := f.srv.Serve(f.lis); err != nil && !errors.Is(err, http.ErrServerClosed) && !f.stopped(err) {
					h.errc <- fmt.Errorf("%s server on %s: %w", f.what, f.lis.Addr(), err)
				}
			})
		}
	}
	select {
	case <-ctx.Done():
		return nil
	case err := <-h.errc:
		return err
	}
}

// httpStopTimeout bounds how long Shutdown waits for HTTP requests.
const httpStopTimeout = time.Second

// Shutdown turns health NOT_SERVING for good, then stops the gRPC server
// and the HTTP front-ends gracefully; if ctx ends first it stops them hard
// and returns ctx's error. Then it closes the HTTP server and waits for
// Serve's servers to return.
func (h *Host) Shutdown(ctx context.Context) error {
	h.SetServing(false)
	h.mu.Lock()
	h.closed.Store(true)
	h.mu.Unlock()
	var err error
	h.stopOnce.Do(func() {
		h.watches.shutdown()
		errs := make([]error, 2)
		var drain sync.WaitGroup
		for i, f := range []*front{h.authz, h.rlsHTTP} {
			if f != nil {
				drain.Go(func() { errs[i] = f.drain(ctx) })
			}
		}
		err = GracefulStop(ctx, h.gs)
		drain.Wait()
		if err == nil {
			err = errors.Join(errs...)
		}
		if h.hs != nil {
			hctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), httpStopTimeout)
			_ = h.hs.Shutdown(hctx)
			cancel()
		}
		h.wg.Wait()
	})
	return err
}

// Stop stops the servers at once, cutting calls in flight.
func (h *Host) Stop() {
	h.closed.Store(true)
	h.gs.Stop()
	if h.hs != nil {
		_ = h.hs.Close()
	}
	for _, f := range []*front{h.authz, h.rlsHTTP} {
		if f != nil {
			_ = f.srv.Close()
		}
	}
}

// front is an HTTP server of checks on a listener of its own.
type front struct {
	what string
	lis  net.Listener
	srv  *http.Server
}

// addr returns f's address, "" for nil.
func (f *front) addr() string {
	if f == nil {
		return ""
	}
	return f.lis.Addr().String()
}

// stopped reports whether err is Serve's for a listener drain closed.
func (f *front) stopped(err error) bool {
	cl, ok := f.lis.(*capListener)
	return ok && cl.draining.Load() && errors.Is(err, net.ErrClosed)
}

// drain shuts f down gracefully, hard when ctx ends first. It answers
// HTTP/1 requests with Connection: close and keeps a connection on which
// a request has begun to arrive until it is answered, which
// http.Server.Shutdown alone would drop.
func (f *front) drain(ctx context.Context) error {
	cl, ok := f.lis.(*capListener)
	if !ok {
		if err := f.srv.Shutdown(ctx); err != nil {
			_ = f.srv.Close()
			return fmt.Errorf("%s graceful stop: %w", f.what, err)
		}
		return nil
	}
	cl.drain()
	_ = cl.Close()
	err := waitUntil(ctx, func() bool {
		cl.closeQuiet()
		return cl.http1Open() == 0
	})
	if err == nil {
		err = f.srv.Shutdown(ctx)
	}
	if err == nil {
		err = waitUntil(ctx, func() bool { return cl.open() == 0 })
	}
	if err != nil {
		_ = f.srv.Close()
		cl.closeAll()
		return fmt.Errorf("%s graceful stop: %w", f.what, err)
	}
	return nil
}

// waitUntil polls cond until it holds (nil) or ctx ends (ctx's error).
func waitUntil(ctx context.Context, cond func() bool) error {
	t := time.NewTicker(5 * time.Millisecond)
	defer t.Stop()
	for !cond() {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
	return nil
}

// GracefulStop stops gs gracefully, hard when ctx ends first.
func GracefulStop(ctx context.Context, gs *grpc.Server) error {
	done := make(chan struct{})
	go func() {
		gs.GracefulStop()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		gs.Stop()
		<-done
		return fmt.Errorf("graceful stop: %w", ctx.Err())
	}
}

// Listen listens on "host:port" (TCP) or "unix:///path".
func Listen(addr string) (net.Listener, error) {
	if path, ok := strings.CutPrefix(addr, "unix://"); ok {
		return net.Listen("unix", path)
	}
	return net.Listen("tcp", addr)
}

// newHandler serves /metrics of g, /healthz, /readyz and optionally pprof.
func newHandler(g prometheus.Gatherer, serving func() bool, withPprof bool) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(g, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if !serving() {
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = w.Write([]byte("not serving\n"))
			return
		}
		_, _ = w.Write([]byte("serving\n"))
	})
	if withPprof {
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	return mux
}

// Timeouts of the HTTP server; pprof's profiles may take longer.
const (
	httpReadHeaderTimeout = 5 * time.Second
	httpReadTimeout       = 10 * time.Second
	httpWriteTimeout      = 30 * time.Second
	httpPprofWriteTimeout = 2 * time.Minute
	httpIdleTimeout       = 30 * time.Second
)

// newHTTPServer returns the HTTP server of h on lis.
func newHTTPServer(h http.Handler, lis net.Listener, withPprof bool) *http.Server {
	write := httpWriteTimeout
	if withPprof {
		write = httpPprofWriteTimeout
	}
	s := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: httpReadHeaderTimeout,
		ReadTimeout:       httpReadTimeout,
		WriteTimeout:      write,
		IdleTimeout:       httpIdleTimeout,
		MaxHeaderBytes:    64 << 10,
	}
	if cl, ok := lis.(*capListener); ok {
		s.Handler = cl.closeWhenDraining(h)
		s.ConnState = cl.trackState
	}
	return s
}

// listenerCollectors export a capped listener's open and shed connections.
func listenerCollectors(name string, l *capListener) []prometheus.Collector {
	labels := prometheus.Labels{"listener": name}
	cs := []prometheus.Collector{
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "flashgate_conns_open", ConstLabels: labels,
			Help: "Connections open on a listener (grpc: --grpc-addr, http: --http-addr, http_authz: --http-authz-addr, rls_http: --rls-http-addr), pending handshakes included.",
		}, func() float64 { return float64(l.open()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "flashgate_conns_shed_total", ConstLabels: labels,
			Help: "Connections closed because the listener was at its cap, --grpc-max-conns, --grpc-max-pending, --http-max-conns, --http-authz-max-conns or --rls-http-max-conns (http, http_authz, rls_http: the one idle the longest, or the new one when none was idle; grpc: the one pending its handshake the longest, or one whose handshake ended with the cap full).",
		}, func() float64 { return float64(l.shed.Load()) }),
	}
	if l.maxPending > 0 {
		cs = append(cs, prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "flashgate_conns_pending", ConstLabels: labels,
			Help: "Connections on the gRPC listener that have not finished their handshake (TLS, HTTP/2 preface and settings); at most --grpc-max-pending.",
		}, func() float64 { return float64(l.pendingConns()) }))
	}
	return cs
}

// Settings of the HTTP front-end's server. AuthzIdleTimeout is above the
// proxies' own idle timeouts, so the proxy, not flashgate, closes an idle
// connection and never sends a check on one flashgate is closing.
const (
	AuthzMaxHeaderBytes = 128 << 10
	AuthzIdleTimeout    = 5 * time.Minute
)

// newAuthzServer returns the HTTP front-end's server of h on lis.
func newAuthzServer(h http.Handler, lis net.Listener) *http.Server {
	var p http.Protocols
	p.SetHTTP1(true)
	p.SetUnencryptedHTTP2(true)
	s := &http.Server{
		Handler:   h,
		Protocols: &p,
		// OPTIONS * is answered by the handler, as a check.
		DisableGeneralOptionsHandler: true,
		HTTP2:                        &http.HTTP2Config{MaxConcurrentStreams: MaxConcurrentStreams},
		ReadHeaderTimeout:            httpReadHeaderTimeout,
		ReadTimeout:                  httpReadTimeout,
		WriteTimeout:                 httpReadTimeout,
		IdleTimeout:                  AuthzIdleTimeout,
		MaxHeaderBytes:               AuthzMaxHeaderBytes,
	}
	if cl, ok := lis.(*capListener); ok {
		s.Handler = cl.closeWhenDraining(h)
		s.ConnState = cl.trackState
	}
	return s
}
