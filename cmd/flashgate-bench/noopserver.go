package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"github.com/flashgate/flashgate/extauthz"
	"github.com/flashgate/flashgate/host"
	"github.com/spf13/cobra"
	"google.golang.org/genproto/googleapis/rpc/status"
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
// done, then stops it gracefully: in-flight calls get up to 5s to finish.
func runNoopServer(ctx context.Context, lis net.Listener, log io.Writer) error {
	h, err := host.New(host.Options{GRPC: lis, Codec: extauthz.Codec()})
	if err != nil {
		return err
	}
	authv3.RegisterAuthorizationServer(h, noopAuth{})
	h.SetServing(true)
	fmt.Fprintf(log, "noop-server: ext_authz answering OK to everything on %s\n", lis.Addr())
	err = h.Serve(ctx)
	gctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	_ = h.Shutdown(gctx) // past grace the remaining calls are cut
	return err
}

// noopAuth admits every request.
type noopAuth struct {
	authv3.UnimplementedAuthorizationServer
}

var _ authv3.AuthorizationServer = noopAuth{}

func (noopAuth) Check(context.Context, *authv3.CheckRequest) (*authv3.CheckResponse, error) {
	return &authv3.CheckResponse{Status: &status.Status{}}, nil
}

// newNoopHTTPServerCmd returns noop-http-server: an HTTP server that
// answers 200 to every request and does nothing else, on the settings of
// flashgate serve's HTTP front-end (package host: HTTP/1.1 and h2c,
// timeouts, header limit, connection cap). flashgate-bench --api http
// against it measures the ceiling of a Go HTTP authorizer on the machine,
// to compare with serve --http-authz-addr under the same flags.
func newNoopHTTPServerCmd(e env) *cobra.Command {
	var addr string
	cmd := &cobra.Command{
		Use:   "noop-http-server --addr A",
		Short: "Serve HTTP answering 200 to everything: the ceiling to compare serve's HTTP front-end with",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			lis, err := net.Listen("tcp", addr)
			if err != nil {
				return fmt.Errorf("listen on %s: %w", addr, err)
			}
			return runNoopHTTPServer(cmd.Context(), lis, e.stderr)
		},
	}
	cmd.Flags().StringVar(&addr, "addr", "127.0.0.1:9193", "HTTP listen address")
	return cmd
}

// noopHTTPMaxConns is the do-nothing HTTP server's connection cap: serve's
// default --http-authz-max-conns.
const noopHTTPMaxConns = 1024

// runNoopHTTPServer serves the do-nothing HTTP server on lis until ctx is
// done, then stops it gracefully: in-flight requests get up to 5s. The
// host it runs on needs a gRPC listener too: one on a free loopback port,
// which stays idle.
func runNoopHTTPServer(ctx context.Context, lis net.Listener, log io.Writer) error {
	idle, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		lis.Close()
		return fmt.Errorf("listen for the idle gRPC server: %w", err)
	}
	h, err := host.New(host.Options{
		GRPC: idle, HTTPAuthz: lis, HTTPAuthzHandler: http.HandlerFunc(noopHTTP), HTTPAuthzMaxConns: noopHTTPMaxConns,
	})
	if err != nil {
		idle.Close()
		lis.Close()
		return err
	}
	h.SetServing(true)
	fmt.Fprintf(log, "noop-http-server: answering 200 to everything on %s\n", lis.Addr())
	err = h.Serve(ctx)
	gctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	_ = h.Shutdown(gctx) // past grace the remaining requests are cut
	return err
}

// noopHTTP answers 200 with no body.
func noopHTTP(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) }
