package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/flashgate/flashgate/daemon"
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
			d, err := newDaemon(e, c)
			if err != nil {
				return err
			}
			return serveDaemon(cmd.Context(), d)
		},
	}
	o.addFlags(cmd.Flags())
	withEnv(cmd, e)
	return cmd
}

// newDaemon builds the daemon of c, logging to e.stderr.
func newDaemon(e env, c *serveConfig) (*daemon.Daemon, error) {
	h, err := daemon.NewLogHandler(e.stderr, c.logLevel, c.logFormat)
	if err != nil {
		return nil, err
	}
	o := c.Options
	o.LogHandler = h
	return daemon.New(o)
}

// serveDaemon serves d until ctx ends, reloading it on every SIGHUP: the
// process's one handler of SIGHUP, which therefore never ends it.
func serveDaemon(ctx context.Context, d *daemon.Daemon) error {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	return d.ServeReloading(ctx, hup)
}
