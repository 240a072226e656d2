package checkreq

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
)

// APIs a [Client] asks.
const (
	APIAuthz = "authz" // ext_authz Check over gRPC
	APIHTTP  = "http"  // flashgate's HTTP front-end, as Envoy's http_service asks
	APIRLS   = "rls"   // the ratelimit service's ShouldRateLimit over gRPC
)

// Result is one answer, read as the Envoy filter that asked would read it;
// its JSON form is flashgate check --json's.
type Result struct {
	N         int     `json:"n"`
	Allowed   bool    `json:"allowed"`
	Code      string  `json:"code,omitempty"`   // gRPC status code, or the RLS's overall code
	Status    int     `json:"status,omitempty"` // HTTP status Envoy would answer with
	LatencyMS float64 `json:"latency_ms"`
	// Headers are added to the response to the client; UpstreamHeaders,
	// for an allowed request, to the request sent upstream.
	Headers         map[string]string `json:"headers,omitempty"`
	UpstreamHeaders map[string]string `json:"upstream_headers,omitempty"`
	Body            string            `json:"body,omitempty"`
	// Statuses are the RLS's, one per descriptor.
	Statuses []RLSStatus `json:"statuses,omitempty"`
	Error    string      `json:"error,omitempty"`
}

// RLSStatus is one descriptor's status of a ShouldRateLimit answer.
type RLSStatus struct {
	Code string `json:"code"`
	// Limit is current_limit's requests per unit, Unit its unit ("" for
	// a descriptor without a limit).
	Limit     uint32 `json:"limit,omitempty"`
	Unit      string `json:"unit,omitempty"`
	Remaining uint32 `json:"remaining"`
	// ResetSeconds is duration_until_reset in seconds (0: none).
	ResetSeconds float64 `json:"reset_seconds,omitempty"`
}

// String formats s for people: "OK 2/minute remaining=1 reset=60s", or
// "OK no-limit".
func (s RLSStatus) String() string {
	if s.Unit == "" {
		return s.Code + " no-limit"
	}
	return fmt.Sprintf("%s %d/%s remaining=%d reset=%gs", s.Code, s.Limit, s.Unit, s.Remaining, s.ResetSeconds)
}

// OverLimit is the code of an RLS OVER_LIMIT answer.
var OverLimit = rlsv3.RateLimitResponse_OVER_LIMIT.String()

// ClientOptions say what a [Client] asks and where.
type ClientOptions struct {
	// API is APIAuthz, APIHTTP or APIRLS.
	API string
	// Addr is host:port or unix:///path (APIHTTP: also http://host:port).
	Addr string
	// TLS secures the gRPC APIs.
	TLS TLS
	// Timeout bounds each call.
	Timeout time.Duration
	// Spec is the request of APIAuthz and APIHTTP, each sent with a new ID.
	Spec Spec
	// Domain, Entries (key=value, in order: one descriptor) and HitsAddend
	// are the request of APIRLS.
	Domain     string
	Entries    []string
	HitsAddend uint32
}

// ParseSpec reads the HTTP request flashgate check's flags describe.
func ParseSpec(method, path, host, scheme string, headers []string, ip string, extensions []string) (Spec, error) {
	if !strings.HasPrefix(path, "/") {
		return Spec{}, fmt.Errorf("--path %q: must start with /", path)
	}
	addr, err := ParseIP(ip)
	if err != nil {
		return Spec{}, err
	}
	hs, err := ParseHeaders(headers)
	if err != nil {
		return Spec{}, err
	}
	ext, err := ParsePairs("context-extension", extensions)
	if err != nil {
		return Spec{}, err
	}
	return Spec{Method: strings.ToUpper(method), Path: path, Host: host, Scheme: scheme, Headers: hs, IP: addr, ContextExtensions: ext}, nil
}

// Client sends one request again and again; it is not safe for concurrent
// use. Close releases its connection.
type Client struct {
	ask   func(ctx context.Context, n int) (Result, error)
	close func()
}

// NewClient returns a client of o's server. It does not connect yet.
func NewClient(o ClientOptions) (*Client, error) {
	var req *rlsv3.RateLimitRequest
	switch o.API {
	case APIAuthz:
	case APIRLS:
		if o.Domain == "" || len(o.Entries) == 0 {
			return nil, errors.New("--api rls needs --domain and at least one --entry key=value")
		}
		desc, err := ParseEntries(o.Entries)
		if err != nil {
			return nil, err
		}
		req = &rlsv3.RateLimitRequest{Domain: o.Domain, Descriptors: []*ratelimitv3.RateLimitDescriptor{desc}, HitsAddend: o.HitsAddend}
	case APIHTTP:
		client, base, err := HTTPClient(o.Addr, 1, o.Timeout)
		if err != nil {
			return nil, err
		}
		return &Client{ask: func(ctx context.Context, n int) (Result, error) {
			spec := o.Spec
			spec.ID = NewID()
			return askHTTP(ctx, client, base, n, spec)
		}, close: client.CloseIdleConnections}, nil
	default:
		return nil, fmt.Errorf("--api %q: want authz, http or rls", o.API)
	}
	creds, err := o.TLS.DialOptions(o.Addr)
	if err != nil {
		return nil, err
	}
	conn, err := Dial(o.Addr, creds...)
	if err != nil {
		return nil, err
	}
	authz, rls := authv3.NewAuthorizationClient(conn), rlsv3.NewRateLimitServiceClient(conn)
	return &Client{ask: func(ctx context.Context, n int) (Result, error) {
		ctx, cancel := context.WithTimeout(ctx, o.Timeout)
		defer cancel()
		start := time.Now()
		if o.API == APIRLS {
			resp, err := rls.ShouldRateLimit(ctx, req)
			if err != nil {
				return Result{N: n, LatencyMS: ms(time.Since(start)), Error: err.Error()}, err
			}
			return describeRLS(n, resp, time.Since(start)), nil
		}
		spec := o.Spec
		spec.ID = NewID()
		resp, err := authz.Check(ctx, Build(spec))
		if err != nil {
			return Result{N: n, LatencyMS: ms(time.Since(start)), Error: err.Error()}, err
		}
		return describeCheck(n, resp, time.Since(start)), nil
	}, close: func() { conn.Close() }}, nil
}

// Ask sends the request as check number n and returns the answer; a
// failed call is also recorded in the result's Error.
func (c *Client) Ask(ctx context.Context, n int) (Result, error) { return c.ask(ctx, n) }

// Close releases the client's connections.
func (c *Client) Close() { c.close() }

// Repeat asks count times, handing each answer to print, and fails when a
// call or print did; it stops at the end of ctx.
func (c *Client) Repeat(ctx context.Context, count int, print func(Result) error) error {
	var failed int
	var lastErr error
	for i := 1; i <= count; i++ {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		res, err := c.Ask(ctx, i)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			failed++
			lastErr = err
		}
		if err := print(res); err != nil {
			return err
		}
	}
	if failed > 0 {
		return fmt.Errorf("%d of %d checks failed: %w", failed, count, lastErr)
	}
	return nil
}

// FlagsFit refuses the flags of flashgate check that do not apply to
// api, and the required ones it lacks (changed: whether a flag was set).
func FlagsFit(changed func(string) bool, api string) error {
	rlsFlags := []string{"domain", "entry", "hits-addend"}
	switch api {
	case "http":
		for _, name := range rlsFlags {
			if changed(name) {
				return fmt.Errorf("--%s applies to --api rls only", name)
			}
		}
		for _, name := range append([]string{"ip", "scheme", "context-extension"}, TLSFlagNames()...) {
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

// askHTTP sends spec to the HTTP front-end at base and reads the answer as
// a proxy would: 2xx allowed, 400, 431 and 5xx a failed check, any other
// status denied.
func askHTTP(ctx context.Context, client *http.Client, base string, n int, spec Spec) (Result, error) {
	req, err := HTTPRequest(ctx, base, spec)
	if err != nil {
		return Result{N: n, Error: err.Error()}, err
	}
	start := time.Now()
	resp, err := client.Do(req)
	if err != nil {
		return Result{N: n, LatencyMS: ms(time.Since(start)), Error: err.Error()}, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	latency := time.Since(start)
	if err != nil {
		return Result{N: n, LatencyMS: ms(latency), Error: err.Error()}, err
	}
	res := Result{N: n, Status: resp.StatusCode, LatencyMS: ms(latency), Body: string(body)}
	res.Allowed, err = HTTPVerdict(resp.StatusCode)
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

// describeCheck reads a CheckResponse as Envoy's ext_authz filter would.
func describeCheck(n int, resp *authv3.CheckResponse, latency time.Duration) Result {
	code := codes.Code(resp.GetStatus().GetCode())
	res := Result{N: n, Code: code.String(), LatencyMS: ms(latency)}
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

// describeRLS reads a RateLimitResponse as Envoy's ratelimit filter
// would: OK is the request let through (200), OVER_LIMIT a 429 (its
// default rate_limited_status) with raw_body as the body.
func describeRLS(n int, resp *rlsv3.RateLimitResponse, latency time.Duration) Result {
	res := Result{N: n, Code: resp.GetOverallCode().String(), LatencyMS: ms(latency), Status: 200, Allowed: true}
	if resp.GetOverallCode() == rlsv3.RateLimitResponse_OVER_LIMIT {
		res.Allowed, res.Status, res.Body = false, 429, string(resp.GetRawBody())
	}
	res.Headers = headerValueMap(resp.GetResponseHeadersToAdd())
	res.UpstreamHeaders = headerValueMap(resp.GetRequestHeadersToAdd())
	for _, st := range resp.GetStatuses() {
		s := RLSStatus{Code: st.GetCode().String(), Remaining: st.GetLimitRemaining(), ResetSeconds: st.GetDurationUntilReset().AsDuration().Seconds()}
		if l := st.GetCurrentLimit(); l != nil {
			s.Limit, s.Unit = l.GetRequestsPerUnit(), strings.ToLower(l.GetUnit().String())
		}
		res.Statuses = append(res.Statuses, s)
	}
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

// ParseEntries reads --entry key=value flags, in order, as one RLS
// descriptor.
func ParseEntries(entries []string) (*ratelimitv3.RateLimitDescriptor, error) {
	desc := &ratelimitv3.RateLimitDescriptor{}
	for _, e := range entries {
		key, value, ok := strings.Cut(e, "=")
		if !ok || key == "" {
			return nil, fmt.Errorf("--entry %q: want key=value", e)
		}
		desc.Entries = append(desc.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: key, Value: value})
	}
	return desc, nil
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
