package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"github.com/flashgate/flashgate/extauthz"
	"github.com/spf13/cobra"
	"google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// newNoopServerCmd returns noop-server: an ext_authz server that admits
// everything and does nothing else, on the same gRPC server settings as
// flashgate serve. flashgate-bench against it measures the ceiling of a Go
// gRPC ext_authz server on the machine, to compare with serve under the
// same flags.
func newNoopServerCmd(e env) *cobra.Command {
	var addr string
	cmd := &cobra.Command{
		Use:   "noop-server --addr A",
		Short: "Serve ext_authz answering OK to everything: the ceiling to compare serve with",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			lis, err := net.Listen("tcp", addr)
			if err != nil {
				return fmt.Errorf("listen on %s: %w", addr, err)
			}
			return runNoopServer(cmd.Context(), lis, e.stderr)
		},
	}
	cmd.Flags().StringVar(&addr, "addr", "127.0.0.1:9191", "gRPC listen address")
	return cmd
}

// runNoopServer serves the do-nothing ext_authz server on lis until ctx is
// done.
func runNoopServer(ctx context.Context, lis net.Listener, log io.Writer) error {
	hs := health.NewServer()
	hs.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	s := extauthz.NewGRPCServer(noopAuth{}, hs)
	fmt.Fprintf(log, "noop-server: ext_authz answering OK to everything on %s\n", lis.Addr())
	return serveGRPC(ctx, s, lis, 5*time.Second)
}

// noopAuth admits every request.
type noopAuth struct {
	authv3.UnimplementedAuthorizationServer
}

var _ authv3.AuthorizationServer = noopAuth{}

func (noopAuth) Check(context.Context, *authv3.CheckRequest) (*authv3.CheckResponse, error) {
	return &authv3.CheckResponse{Status: &status.Status{}}, nil
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
	gctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), grace)
	defer cancel()
	_ = extauthz.GracefulStop(gctx, s) // past grace the remaining calls are cut
	<-errc
	return nil
}
