package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
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
			if err := checkFlagsFit(cmd.Flags().Changed, o.api); err != nil {
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

// checkFlagsFit refuses the flags that do not apply to api, and the
// required ones it lacks (changed reports whether a flag was set).
func checkFlagsFit(changed func(string) bool, api string) error {
	rlsFlags := []string{"domain", "entry", "hits-addend"}
	switch api {
	case "http":
		for _, name := range rlsFlags {
			if changed(name) {
				return fmt.Errorf("--%s applies to --api rls only", name)
			}
		}
		for _, name := range append([]string{"ip", "scheme", "context-extension"}, checkreq.TLSFlagNames()...) {
			if changed(name) {
				return fmt.Errorf("--%s applies to --api authz only: over HTTP the peer, scheme and route are the connection's", name)
			}
		}
		if !changed("addr") {
			return fmt.Errorf("--api http needs --addr: serve's --http-authz-addr")
		}
	case "rls":
		for _, name := range []string{"path", "method", "host", "scheme", "header", "ip", "context-extension"} {
			if changed(name) {
				return fmt.Errorf("--%s does not apply to --api rls: it sends --domain and --entry", name)
			}
		}
		return nil
	default:
		for _, name := range rlsFlags {
			if changed(name) {
				return fmt.Errorf("--%s applies to --api rls only", name)
			}
		}
	}
	if !changed("path") {
		return errors.New(`required flag(s) "path" not set`)
	}
	return nil
}

// checkResult is one answer, as printed by check --json.
type checkResult struct {
	N         int     `json:"n"`
	Allowed   bool    `json:"allowed"`
	Code      string  `json:"code,omitempty"`   // gRPC status code of the CheckResponse
	Status    int     `json:"status,omitempty"` // HTTP status Envoy would answer with
	LatencyMS float64 `json:"latency_ms"`
	// Headers: the headers added to the response to the client.
	Headers map[string]string `json:"headers,omitempty"`
	// UpstreamHeaders: for an allowed request, headers added to the request
	// sent upstream.
	UpstreamHeaders map[string]string `json:"upstream_headers,omitempty"`
	Body            string            `json:"body,omitempty"`
	// Statuses: --api rls, each descriptor's status.
	Statuses []rlsStatus `json:"statuses,omitempty"`
	Error    string      `json:"error,omitempty"`
}

func runCheck(ctx context.Context, stdout io.Writer, o checkOptions) error {
	if o.count < 1 {
		return fmt.Errorf("-n %d: must be at least 1", o.count)
	}
	if o.timeout <= 0 {
		return fmt.Errorf("--timeout %s: must be positive", o.timeout)
	}
	if o.api == "rls" {
		return runCheckRLS(ctx, stdout, o)
	}
	if !strings.HasPrefix(o.path, "/") {
		return fmt.Errorf("--path %q: must start with /", o.path)
	}
	if o.api != "authz" && o.api != "http" {
		return fmt.Errorf("--api %q: want authz, http or rls", o.api)
	}
	ip, err := checkreq.ParseIP(o.ip)
	if err != nil {
		return err
	}
	headers, err := checkreq.ParseHeaders(o.headers)
	if err != nil {
		return err
	}
	ext, err := checkreq.ParsePairs("context-extension", o.extensions)
	if err != nil {
		return err
	}
	spec := checkreq.Spec{
		Method: strings.ToUpper(o.method), Path: o.path, Host: o.host, Scheme: o.scheme,
		Headers: headers, IP: ip, ContextExtensions: ext,
	}
	ask, closeFn, err := checker(o)
	if err != nil {
		return err
	}
	defer closeFn()
	return repeatCheck(ctx, stdout, o, func(ctx context.Context, n int) (checkResult, error) {
		spec.ID = checkreq.NewID()
		return ask(ctx, n, spec)
	})
}

// repeatCheck sends o.count checks with ask, printing each answer, and
// fails when one did.
func repeatCheck(ctx context.Context, stdout io.Writer, o checkOptions, ask func(ctx context.Context, n int) (checkResult, error)) error {
	enc := json.NewEncoder(stdout)
	var failed int
	var lastErr error
	for i := 1; i <= o.count; i++ {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		res, err := ask(ctx, i)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			failed++
			lastErr = err
		}
		if o.json {
			if err := enc.Encode(res); err != nil {
				return fmt.Errorf("write: %w", err)
			}
		} else if _, err := io.WriteString(stdout, res.line()); err != nil {
			return fmt.Errorf("write: %w", err)
		}
	}
	if failed > 0 {
		return fmt.Errorf("%d of %d checks failed: %w", failed, o.count, lastErr)
	}
	return nil
}

// askFunc sends check n of spec and returns its answer; err is the
// failure recorded in res.Error.
type askFunc func(ctx context.Context, n int, spec checkreq.Spec) (res checkResult, err error)

// checker returns how to ask o's server (--api), and how to let it go.
func checker(o checkOptions) (askFunc, func(), error) {
	if o.api == "http" {
		client, base, err := checkreq.HTTPClient(o.addr, 1, o.timeout)
		if err != nil {
			return nil, nil, err
		}
		return func(ctx context.Context, n int, spec checkreq.Spec) (checkResult, error) {
			return askHTTP(ctx, client, base, n, spec)
		}, client.CloseIdleConnections, nil
	}
	creds, err := o.tls.DialOptions(o.addr)
	if err != nil {
		return nil, nil, err
	}
	conn, err := checkreq.Dial(o.addr, creds...)
	if err != nil {
		return nil, nil, err
	}
	client := authv3.NewAuthorizationClient(conn)
	return func(ctx context.Context, n int, spec checkreq.Spec) (checkResult, error) {
		callCtx, cancel := context.WithTimeout(ctx, o.timeout)
		defer cancel()
		start := time.Now()
		resp, err := client.Check(callCtx, checkreq.Build(spec))
		latency := time.Since(start)
		if err != nil {
			return checkResult{N: n, LatencyMS: ms(latency), Error: err.Error()}, err
		}
		return describeResponse(n, resp, latency), nil
	}, func() { conn.Close() }, nil
}

// askHTTP sends spec to the HTTP front-end at base and reads the answer as
// a proxy would: 2xx allowed, 400, 431 and 5xx a failed check, any other
// status denied.
func askHTTP(ctx context.Context, client *http.Client, base string, n int, spec checkreq.Spec) (checkResult, error) {
	req, err := checkreq.HTTPRequest(ctx, base, spec)
	if err != nil {
		return checkResult{N: n, Error: err.Error()}, err
	}
	start := time.Now()
	resp, err := client.Do(req)
	if err != nil {
		return checkResult{N: n, LatencyMS: ms(time.Since(start)), Error: err.Error()}, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	latency := time.Since(start)
	if err != nil {
		return checkResult{N: n, LatencyMS: ms(latency), Error: err.Error()}, err
	}
	res := checkResult{N: n, Status: resp.StatusCode, LatencyMS: ms(latency), Body: string(body)}
	res.Allowed, err = checkreq.HTTPVerdict(resp.StatusCode)
	if err != nil {
		res.Error = fmt.Sprintf("%v: %s", err, strings.TrimSpace(res.Body))
		return res, errors.New(res.Error)
	}
	res.Headers = make(map[string]string, len(resp.Header))
	for k, vs := range resp.Header {
		if k != "Date" && k != "Content-Length" {
			res.Headers[strings.ToLower(k)] = strings.Join(vs, ", ")
		}
	}
	return res, nil
}

// describeResponse reads a CheckResponse as Envoy's ext_authz filter would.
func describeResponse(n int, resp *authv3.CheckResponse, latency time.Duration) checkResult {
	code := codes.Code(resp.GetStatus().GetCode())
	res := checkResult{N: n, Code: code.String(), LatencyMS: ms(latency)}
	if code == codes.OK {
		res.Allowed = true
		res.Status = 200
		ok := resp.GetOkResponse()
		res.Headers = headerMap(ok.GetResponseHeadersToAdd())
		res.UpstreamHeaders = headerMap(ok.GetHeaders())
		return res
	}
	denied := resp.GetDeniedResponse()
	res.Status = int(denied.GetStatus().GetCode())
	if res.Status == 0 {
		res.Status = 403 // Envoy's default for a denial without a status
	}
	res.Headers = headerMap(denied.GetHeaders())
	res.Body = denied.GetBody()
	return res
}

func headerMap(opts []*corev3.HeaderValueOption) map[string]string {
	hs := make([]*corev3.HeaderValue, len(opts))
	for i, o := range opts {
		hs[i] = o.GetHeader()
	}
	return headerValueMap(hs)
}

// headerValueMap maps headers by lower-case name, a repeated name's values
// joined with ", "; nil for none.
func headerValueMap(hs []*corev3.HeaderValue) map[string]string {
	if len(hs) == 0 {
		return nil
	}
	m := make(map[string]string, len(hs))
	for _, h := range hs {
		k, v := strings.ToLower(h.GetKey()), h.GetValue()
		if v == "" && len(h.GetRawValue()) > 0 {
			v = string(h.GetRawValue())
		}
		if old, ok := m[k]; ok {
			v = old + ", " + v
		}
		m[k] = v
	}
	return m
}

// line formats r for people:
//
//	#1 allowed 200 0.412ms x-ratelimit-limit: 5; x-ratelimit-remaining: 4
func (r checkResult) line() string {
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
	if !r.Allowed && r.Code != "" && r.Code != codes.ResourceExhausted.String() && r.Code != rlsOverLimit {
		fmt.Fprintf(&b, " (code %s)", r.Code)
	}
	b.WriteByte('\n')
	return b.String()
}

func writeHeaders(b *strings.Builder, lead string, h map[string]string) {
	keys := make([]string, 0, len(h))
	for k := range h {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for i, k := range keys {
		if i == 0 {
			b.WriteString(lead)
		} else {
			b.WriteString("; ")
		}
		b.WriteString(k)
		b.WriteString(": ")
		b.WriteString(h[k])
	}
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
