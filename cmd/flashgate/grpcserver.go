package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"github.com/flashgate/flashgate/extauthz"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"
)

// newGRPCServer returns a gRPC server with serve's transport settings
// (extauthz.GRPCServerOptions), so that the benchmark ceiling (noop-server)
// is measured like serve, with ext_authz, grpc.health.v1 and reflection
// registered.
func newGRPCServer(auth authv3.AuthorizationServer, hs *health.Server) *grpc.Server {
	s := grpc.NewServer(extauthz.GRPCServerOptions()...)
	authv3.RegisterAuthorizationServer(s, auth)
	healthpb.RegisterHealthServer(s, hs)
	reflection.Register(s)
	return s
}

// serveGRPC serves s on lis until ctx is done, then stops it gracefully,
// forcing it after grace: in-flight calls get up to grace to finish.
func serveGRPC(ctx context.Context, s *grpc.Server, lis net.Listener, grace time.Duration) error {
	errc := make(chan error, 1)
	go func() { errc <- s.Serve(lis) }()
	select {
	case err := <-errc:
		if err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			return fmt.Errorf("grpc server on %s: %w", lis.Addr(), err)
		}
		return nil
	case <-ctx.Done():
	}
	stopped := make(chan struct{})
	go func() {
		s.GracefulStop()
		close(stopped)
	}()
	timer := time.NewTimer(grace)
	defer timer.Stop()
	select {
	case <-stopped:
	case <-timer.C:
		s.Stop() // the deadline passed: close the remaining calls
		<-stopped
	}
	<-errc
	return nil
}
