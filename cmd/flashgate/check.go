package main

import (
	"time"

	"github.com/spf13/cobra"

	"github.com/flashgate/flashgate/internal/checkreq"
)

// checkOptions are check's flags: the client's options, and the request
// of --api authz and http in the words of ParseSpec.
type checkOptions struct {
	checkreq.ClientOptions
	path, method, host, scheme, ip string
	headers, extensions            []string
	count                          int
	json                           bool
}

func newCheckCmd(e env) *cobra.Command {
	var o checkOptions
	cmd := &cobra.Command{
		Use:   "check --addr A --path P [--api authz|http] [--method M] [-H 'name: value']... [--ip IP] [-n N] [--json]\n  check --api rls --addr A --domain D --entry key=value... [-n N] [--json]",
		Short: "Send ext_authz Check or RLS ShouldRateLimit requests to a server and print the answers",
		Long: `check is an ext_authz client: it builds the CheckRequest Envoy would send for
one HTTP request and sends it N times, printing one line per answer: allowed
or denied, the HTTP status (200, or the denied status), the response headers
and the latency; or one JSON object per line with --json.

With --api http it asks serve's HTTP front-end (--http-authz-addr) instead,
as Envoy's ext_authz http_service does: the request itself, with --method,
--path, --host and the -H headers; the client IP is check's own address
(send -H 'x-forwarded-for: IP' to rules with trusted_hops).

With --api rls it asks the ratelimit service (serve --rls-config, or
envoyproxy/ratelimit itself) as Envoy's ratelimit filter does:
ShouldRateLimit of --domain with one descriptor of the --entry key=value
flags, in order (--hits-addend to count more than 1). An OK is printed as
allowed 200, an OVER_LIMIT as denied 429 (Envoy's default status), with the
headers to add to the response and, after "descriptors:", each
descriptor's status: its code, limit, remaining and seconds until reset.

A TLS server is asked with --tls (the system roots), --tls-ca, and
--tls-cert with --tls-key for mTLS (--api authz and rls).

A denial (429) is a valid answer: check exits non-zero only when a call fails
(connection refused, timeout, gRPC error; over HTTP also a 400, 431 or 5xx).`,
		Example: `  flashgate check --addr 127.0.0.1:9191 --path /api/coupon/1 -H 'x-uid: alice' -n 6
  flashgate check --api http --addr 127.0.0.1:9193 --path /api/coupon/1 -H 'x-uid: alice' -n 6
  flashgate check --api rls --addr 127.0.0.1:9191 --domain edge --entry remote_address=10.0.0.7 -n 3`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkreq.FlagsFit(cmd.Flags().Changed, o.API); err != nil {
				return err
			}
			co := o.ClientOptions
			if co.API != checkreq.APIRLS {
				spec, err := checkreq.ParseSpec(o.method, o.path, o.host, o.scheme, o.headers, o.ip, o.extensions)
				if err != nil {
					return err
				}
				co.Spec = spec
			}
			return checkreq.Run(cmd.Context(), e.stdout, co, o.count, o.json)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.API, "api", "authz", "what to ask: authz (ext_authz Check over gRPC), http (serve's HTTP front-end, --http-authz-addr, as Envoy's http_service does) or rls (the ratelimit service's ShouldRateLimit over gRPC)")
	f.StringVar(&o.Addr, "addr", "127.0.0.1:9191", "the server's address: host:port or unix:///path (--api http: also http://host:port)")
	f.StringVar(&o.path, "path", "", "request path, query string included (required but with --api rls)")
	f.StringVar(&o.method, "method", "GET", "request method")
	f.StringVar(&o.host, "host", "localhost", "request host (:authority)")
	f.StringVar(&o.scheme, "scheme", "http", "request scheme")
	f.StringArrayVarP(&o.headers, "header", "H", nil, "request header 'name: value' (repeatable)")
	f.StringVar(&o.ip, "ip", "127.0.0.1", "client IP address (source.address)")
	f.StringArrayVar(&o.extensions, "context-extension", nil, "per-route context_extensions entry key=value (repeatable)")
	f.IntVarP(&o.count, "count", "n", 1, "number of requests to send")
	f.BoolVar(&o.json, "json", false, "print one JSON object per answer")
	f.DurationVar(&o.Timeout, "timeout", 2*time.Second, "deadline of each call")
	f.StringVar(&o.Domain, "domain", "", "--api rls: the rate limit domain (required)")
	f.StringArrayVar(&o.Entries, "entry", nil, "--api rls: a descriptor entry key=value (repeat, in order; at least one)")
	f.Uint32Var(&o.HitsAddend, "hits-addend", 0, "--api rls: the request's hits_addend (0: ratelimit's default, 1)")
	o.TLS.AddFlags(f)
	return cmd
}
