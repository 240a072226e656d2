package extauthz

import (
	"context"
	"fmt"
	"net/http"
	"time"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/reflection"
)

// HealthService is the grpc.health.v1 service name of the Check server,
// besides "" (the whole server).
const HealthService = "envoy.service.auth.v3.Authorization"

// MaxRecvMsgSize is the largest CheckRequest accepted: Envoy's default
// ext_authz request without a buffered body is a few KiB; 4 MiB leaves room
// for with_request_body.
const MaxRecvMsgSize = 4 << 20

// StreamWorkers is how many goroutines serve calls (see GRPCServerOptions):
// more than the checks a sidecar has in flight at once under load.
const StreamWorkers = 128

// MaxConcurrentStreams bounds the calls in flight on one connection: Envoy's
// default circuit breaker allows 1024 requests in flight to a cluster, and
// Envoy opens another connection rather than exceed a server's bound.
const MaxConcurrentStreams = 1024

// MaxHeaderListSize bounds the HTTP/2 headers of one call: a check's are a
// few hundred bytes (the request's own headers travel in the message).
const MaxHeaderListSize = 64 << 10

// HandshakeTimeout bounds how long a new connection may take to complete
// its HTTP/2 handshake before it is closed.
const HandshakeTimeout = 10 * time.Second

// GRPCServerOptions returns the recommended options for the gRPC server
// that hosts a Server:
//   - a proto codec that repairs invalid UTF-8 in request strings instead
//     of refusing the call (Envoy forwards raw HTTP/1 header bytes);
//   - MaxRecvMsgSize, MaxConcurrentStreams, MaxHeaderListSize and
//     HandshakeTimeout: see the constants;
//   - keepalive enforcement that accepts pings every 5s even without
//     streams, so Envoy's HTTP/2 keepalive (connection_keepalive, usually
//     ≥ 10s interval) is never answered with GOAWAY too_many_pings;
//   - server pings after 30s idle (10s timeout) to drop dead peers;
//   - MaxConnectionAge 5m (+30s grace for in-flight checks), so Envoy's
//     long-lived connections rebalance across sidecar restarts and scale-ups;
//   - StreamWorkers goroutines that serve calls one after another instead of
//     a new goroutine per call: a check's stack grows to the depth of the
//     Redis client once per worker, not once per call (runtime.copystack was
//     13% of serve's CPU under load without them). Calls beyond the workers
//     still get a goroutine of their own.
//
// It returns a new slice on each call.
func GRPCServerOptions() []grpc.ServerOption { return grpcServerOptions(newLenientCodec(false, nil)) }

// grpcServerOptions is GRPCServerOptions with codec.
func grpcServerOptions(codec lenientCodec) []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.ForceServerCodecV2(codec),
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
}

// NewGRPCServer returns a gRPC server with GRPCServerOptions, and auth,
// hs (grpc.health.v1) and gRPC reflection registered on it: the one way
// flashgate's servers (serve, and the benchmarks' do-nothing server) are
// set up, so that they are measured alike.
func NewGRPCServer(auth authv3.AuthorizationServer, hs *health.Server) *grpc.Server {
	return newGRPCServer(auth, hs, newLenientCodec(false, nil))
}

func newGRPCServer(auth authv3.AuthorizationServer, hs *health.Server, codec lenientCodec) *grpc.Server {
	gs := grpc.NewServer(grpcServerOptions(codec)...)
	authv3.RegisterAuthorizationServer(gs, auth)
	healthpb.RegisterHealthServer(gs, hs)
	reflection.Register(gs)
	return gs
}

// NewGRPCServer returns a gRPC server serving s (see the package-level
// NewGRPCServer), its health included. Its codec does not decode a
// CheckRequest: Check decodes only what the rules in force read of it
// (headers they do not name are never parsed), where the package-level
// NewGRPCServer's decodes every field, as any Go ext_authz server would;
// and it sends the OK responses s shares between checks as bytes encoded
// once.
func (s *Server) NewGRPCServer() *grpc.Server {
	return newGRPCServer(s, s.health, newLenientCodec(true, &s.encoded))
}

// GracefulStop stops gs gracefully (in-flight calls finish); if ctx ends
// first it stops gs hard and returns ctx's error.
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

// SetServing sets gRPC health (for "" and HealthService) and /readyz. After
// Shutdown it has no effect.
func (s *Server) SetServing(serving bool) {
	if s.closed.Load() {
		return
	}
	st := healthpb.HealthCheckResponse_NOT_SERVING
	if serving {
		st = healthpb.HealthCheckResponse_SERVING
	}
	s.serving.Store(serving)
	s.health.SetServingStatus("", st)
	s.health.SetServingStatus(HealthService, st)
	for _, name := range s.opts.HealthServices {
		s.health.SetServingStatus(name, st)
	}
}

// Serving reports what SetServing last set (false after Shutdown).
func (s *Server) Serving() bool { return s.serving.Load() && !s.closed.Load() }

// HTTPHandler serves /metrics (the injected registry), /healthz (200 while
// the process runs) and /readyz (200 when gRPC health is SERVING, else 503).
func (s *Server) HTTPHandler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(s.gatherer, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if !s.Serving() {
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = w.Write([]byte("not serving\n"))
			return
		}
		_, _ = w.Write([]byte("serving\n"))
	})
	return mux
}

// Shutdown turns health NOT_SERVING for good, then stops gs gracefully
// (in-flight checks finish); if ctx ends first it stops gs hard and returns
// ctx's error. gs may be nil to only flip health.
func (s *Server) Shutdown(ctx context.Context, gs *grpc.Server) error {
	s.SetServing(false)
	s.closed.Store(true)
	s.health.Shutdown()
	if gs == nil {
		return nil
	}
	return GracefulStop(ctx, gs)
}
