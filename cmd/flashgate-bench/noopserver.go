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

// serveFunc serves a reference server on lis until ctx is done, telling
// log where.
type serveFunc func(ctx context.Context, lis net.Listener, log io.Writer) error

// newReferenceCmd returns the command use of a reference server: listen on
// --addr (default addr), then serve.
func newReferenceCmd(e env, use, short, addr string, serve serveFunc) *cobra.Command {
	cmd := &cobra.Command{
		Use:   use + " --addr A",
		Short: short,
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			lis, err := net.Listen("tcp", addr)
			if err != nil {
				return fmt.Errorf("listen on %s: %w", addr, err)
			}
			return serve(cmd.Context(), lis, e.stderr)
		},
	}
	cmd.Flags().StringVar(&addr, "addr", addr, "listen address")
	return cmd
}

// newNoopServerCmd returns noop-server: an ext_authz server that admits
// everything and does nothing else, on the same gRPC server settings as
// flashgate serve. flashgate-bench against it measures the ceiling of a Go
// gRPC ext_authz server on the machine, to compare with serve under the
// same flags.
func newNoopServerCmd(e env) *cobra.Command {
	return newReferenceCmd(e, "noop-server", "Serve ext_authz answering OK to everything: the ceiling to compare serve with",
		"127.0.0.1:9191", runNoopServer)
}

// runNoopServer serves the do-nothing ext_authz server on lis until ctx is
// done, then stops it gracefully (see serveHost).
func runNoopServer(ctx context.Context, lis net.Listener, log io.Writer) error {
	h, err := host.New(host.Options{GRPC: lis, Codec: extauthz.Codec()})
	if err != nil {
		return err
	}
	authv3.RegisterAuthorizationServer(h, noopAuth{})
	fmt.Fprintf(log, "noop-server: ext_authz answering OK to everything on %s\n", lis.Addr())
	return serveHost(ctx, h)
}

// serveHost serves h, SERVING, until ctx is done, then stops it
// gracefully: in-flight calls get up to 5s to finish.
func serveHost(ctx context.Context, h *host.Host) error {
	h.SetServing(true)
	err := h.Serve(ctx)
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
// to compare with serve --http-authz-addr under the same flags. With
// --ratelimit-fields its 200 carries the header fields of serve's
// admission, fixed: what net/http charges for sending them.
func newNoopHTTPServerCmd(e env) *cobra.Command {
	var fields bool
	cmd := newReferenceCmd(e, "noop-http-server", "Serve HTTP answering 200 to everything: the ceiling to compare serve's HTTP front-end with",
		"127.0.0.1:9193", func(ctx context.Context, lis net.Listener, log io.Writer) error {
			h := http.HandlerFunc(noopHTTP)
			if fields {
				h = noopHTTPFields
			}
			return runNoopHTTP(ctx, lis, log, h)
		})
	cmd.Flags().BoolVar(&fields, "ratelimit-fields", false, "answer with the five rate-limit header fields of serve's admission (--ratelimit-headers both), fixed values")
	return cmd
}

// noopHTTPMaxConns is the do-nothing HTTP server's connection cap: serve's
// default --http-authz-max-conns.
const noopHTTPMaxConns = 1024

// runNoopHTTPServer serves the do-nothing HTTP server on lis until ctx is
// done, then stops it gracefully (see serveHost).
func runNoopHTTPServer(ctx context.Context, lis net.Listener, log io.Writer) error {
	return runNoopHTTP(ctx, lis, log, http.HandlerFunc(noopHTTP))
}

// runNoopHTTP serves handler as the do-nothing HTTP server. The host it
// runs on needs a gRPC listener too: one on a free loopback port, which
// stays idle.
func runNoopHTTP(ctx context.Context, lis net.Listener, log io.Writer, handler http.HandlerFunc) error {
	idle, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		lis.Close()
		return fmt.Errorf("listen for the idle gRPC server: %w", err)
	}
	h, err := host.New(host.Options{
		GRPC: idle, HTTPAuthz: lis, HTTPAuthzHandler: handler, HTTPAuthzMaxConns: noopHTTPMaxConns,
	})
	if err != nil {
		idle.Close()
		lis.Close()
		return err
	}
	fmt.Fprintf(log, "noop-http-server: answering 200 to everything on %s\n", lis.Addr())
	return serveHost(ctx, h)
}

// noopHTTP answers 200 with no body.
func noopHTTP(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) }

// noopFields are the header fields of serve's admission under one rule,
// with fixed values; shared, never modified.
var noopFields = http.Header{
	"Ratelimit-Policy":      {`"coupon_per_uid";q=5;w=1`},
	"Ratelimit":             {`"coupon_per_uid";r=4;t=1`},
	"X-Ratelimit-Limit":     {"5"},
	"X-Ratelimit-Remaining": {"4"},
	"X-Ratelimit-Reset":     {"1"},
}

// noopHTTPFields answers 200 with noopFields and no body.
func noopHTTPFields(w http.ResponseWriter, _ *http.Request) {
	hd := w.Header()
	for k, vs := range noopFields {
		hd[k] = vs
	}
	w.WriteHeader(http.StatusOK)
}
