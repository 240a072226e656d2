package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/flashgate/flashgate/internal/checkreq"
	"github.com/spf13/cobra"
	"google.golang.org/grpc/codes"
)

type checkOptions struct {
	api        string
	addr       string
	path       string
	method     string
	host       string
	scheme     string
	headers    []string
	ip         string
	extensions []string
	count      int
	json       bool
	timeout    time.Duration
	tls        checkreq.TLS
	// --api rls: the domain, one descriptor's entries, hits_addend.
	domain  string
	entries []string
	addend  uint32
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
			if err := checkreq.FlagsFit(cmd.Flags().Changed, o.api); err != nil {
				return err
			}
			return runCheck(cmd.Context(), e.stdout, o)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.api, "api", "authz", "what to ask: authz (ext_authz Check over gRPC), http (serve's HTTP front-end, --http-authz-addr, as Envoy's http_service does) or rls (the ratelimit service's ShouldRateLimit over gRPC)")
	f.StringVar(&o.addr, "addr", "127.0.0.1:9191", "the server's address: host:port or unix:///path (--api http: also http://host:port)")
	f.StringVar(&o.path, "path", "", "request path, query string included (required but with --api rls)")
	f.StringVar(&o.method, "method", "GET", "request method")
	f.StringVar(&o.host, "host", "localhost", "request host (:authority)")
	f.StringVar(&o.scheme, "scheme", "http", "request scheme")
	f.StringArrayVarP(&o.headers, "header", "H", nil, "request header 'name: value' (repeatable)")
	f.StringVar(&o.ip, "ip", "127.0.0.1", "client IP address (source.address)")
	f.StringArrayVar(&o.extensions, "context-extension", nil, "per-route context_extensions entry key=value (repeatable)")
	f.IntVarP(&o.count, "count", "n", 1, "number of requests to send")
	f.BoolVar(&o.json, "json", false, "print one JSON object per answer")
	f.DurationVar(&o.timeout, "timeout", 2*time.Second, "deadline of each call")
	f.StringVar(&o.domain, "domain", "", "--api rls: the rate limit domain (required)")
	f.StringArrayVar(&o.entries, "entry", nil, "--api rls: a descriptor entry key=value (repeat, in order; at least one)")
	f.Uint32Var(&o.addend, "hits-addend", 0, "--api rls: the request's hits_addend (0: ratelimit's default, 1)")
	o.tls.AddFlags(f)
	return cmd
}

// runCheck sends o.count checks and prints each answer; it fails when one
// did.
func runCheck(ctx context.Context, stdout io.Writer, o checkOptions) error {
	if o.count < 1 {
		return fmt.Errorf("-n %d: must be at least 1", o.count)
	}
	if o.timeout <= 0 {
		return fmt.Errorf("--timeout %s: must be positive", o.timeout)
	}
	co := checkreq.ClientOptions{API: o.api, Addr: o.addr, TLS: o.tls, Timeout: o.timeout,
		Domain: o.domain, Entries: o.entries, HitsAddend: o.addend}
	if o.api != checkreq.APIRLS {
		spec, err := checkreq.ParseSpec(o.method, o.path, o.host, o.scheme, o.headers, o.ip, o.extensions)
		if err != nil {
			return err
		}
		co.Spec = spec
	}
	client, err := checkreq.NewClient(co)
	if err != nil {
		return err
	}
	defer client.Close()
	enc := json.NewEncoder(stdout)
	return client.Repeat(ctx, o.count, func(res checkreq.Result) (err error) {
		if o.json {
			err = enc.Encode(res)
		} else {
			_, err = io.WriteString(stdout, line(res))
		}
		if err != nil {
			return fmt.Errorf("write: %w", err)
		}
		return nil
	})
}

// line formats r for people:
//
//	#1 allowed 200 0.412ms x-ratelimit-limit: 5; x-ratelimit-remaining: 4
func line(r checkreq.Result) string {
	var b strings.Builder
	fmt.Fprintf(&b, "#%d ", r.N)
	if r.Error != "" {
		fmt.Fprintf(&b, "error %.3fms %s\n", r.LatencyMS, r.Error)
		return b.String()
	}
	verdict := "denied"
	if r.Allowed {
		verdict = "allowed"
	}
	fmt.Fprintf(&b, "%s %d %.3fms", verdict, r.Status, r.LatencyMS)
	writeHeaders(&b, " ", r.Headers)
	if len(r.UpstreamHeaders) > 0 {
		writeHeaders(&b, " upstream: ", r.UpstreamHeaders)
	}
	if r.Body != "" {
		fmt.Fprintf(&b, " body: %s", r.Body)
	}
	for i, st := range r.Statuses {
		if i == 0 {
			b.WriteString(" descriptors:")
		}
		b.WriteByte(' ')
		b.WriteString(st.String())
	}
	if !r.Allowed && r.Code != "" && r.Code != codes.ResourceExhausted.String() && r.Code != checkreq.OverLimit {
		fmt.Fprintf(&b, " (code %s)", r.Code)
	}
	b.WriteByte('\n')
	return b.String()
}

func writeHeaders(b *strings.Builder, lead string, h map[string]string) {
	for i, k := range slices.Sorted(maps.Keys(h)) {
		if i == 0 {
			b.WriteString(lead)
		} else {
			b.WriteString("; ")
		}
		b.WriteString(k + ": " + h[k])
	}
}
