package extauthz

import (
	"context"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/grpc/codes"

	"github.com/flashgate/flashgate/descriptors"
	"github.com/flashgate/flashgate/enforce"
	"github.com/flashgate/flashgate/enforce/enforcetest"
	"github.com/flashgate/flashgate/window/fallback"
	"github.com/flashgate/flashgate/window/memory"
	"github.com/flashgate/flashgate/window/testclock"
)

// clock is a settable test clock.
type clock = testclock.Clock

func newClock() *clock { return testclock.New() }

// env is a Server on a Memory limiter with an injected clock.
type env struct {
	t     *testing.T
	srv   *Server
	clock *clock
	reg   *prometheus.Registry
}

func parse(t testing.TB, yaml string) *descriptors.Config {
	t.Helper()
	c, err := descriptors.ParseConfig("test.yaml", []byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// newEnv builds a Server on cfg (nil: the example); mod may change its
// core's options.
func newEnv(t *testing.T, cfg *descriptors.Config, mod func(*enforce.Options)) *env {
	t.Helper()
	clk := newClock()
	mem, err := memory.New(memory.Options{Now: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	if cfg == nil {
		if cfg, err = descriptors.ExampleConfig(); err != nil {
			t.Fatal(err)
		}
	}
	reg := prometheus.NewRegistry()
	fb, err := fallback.New(fallback.Options{Now: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	opts := enforce.Options{Limiter: mem, Fallback: fb, Registerer: reg, Now: clk.Now}
	if mod != nil {
		mod(&opts)
	}
	core, err := enforce.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	s, err := NewServer(cfg, Options{Core: core})
	if err != nil {
		t.Fatal(err)
	}
	return &env{t: t, srv: s, clock: clk, reg: reg}
}

// req describes a test request.
type req struct {
	path    string
	method  string
	host    string
	ip      string
	headers map[string]string
	ext     map[string]string
}

func (r req) proto() *authv3.CheckRequest {
	method := r.method
	if method == "" {
		method = "GET"
	}
	ip := r.ip
	if ip == "" {
		ip = "10.0.0.1"
	}
	return &authv3.CheckRequest{Attributes: &authv3.AttributeContext{
		Source: &authv3.AttributeContext_Peer{Address: &corev3.Address{Address: &corev3.Address_SocketAddress{
			SocketAddress: &corev3.SocketAddress{Address: ip, PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: 40000}},
		}}},
		Request: &authv3.AttributeContext_Request{Http: &authv3.AttributeContext_HttpRequest{
			Method: method, Path: r.path, Host: r.host, Headers: r.headers, Scheme: "http", Protocol: "HTTP/1.1",
		}},
		ContextExtensions: r.ext,
	}}
}

// answer is a CheckResponse made readable.
type answer struct {
	allowed bool
	code    codes.Code
	status  int // HTTP status of a denial
	headers map[string]string
	body    string
	list    []string // "name: value", in order
	hdr     http.Header
	got     enforcetest.Got // the rate-limit fields, read
}

func read(t testing.TB, resp *authv3.CheckResponse, err error) answer {
	t.Helper()
	if err != nil {
		t.Fatalf("Check returned an error: %v", err)
	}
	a := answer{code: codes.Code(resp.GetStatus().GetCode()), headers: map[string]string{}}
	var hs []*corev3.HeaderValueOption
	switch h := resp.GetHttpResponse().(type) {
	case *authv3.CheckResponse_OkResponse:
		a.allowed = true
		hs = h.OkResponse.GetResponseHeadersToAdd()
		if len(h.OkResponse.GetHeaders()) > 0 {
			t.Errorf("OK response sets upstream headers: %v", h.OkResponse.GetHeaders())
		}
	case *authv3.CheckResponse_DeniedResponse:
		hs = h.DeniedResponse.GetHeaders()
		a.status = int(h.DeniedResponse.GetStatus().GetCode())
		a.body = h.DeniedResponse.GetBody()
	default:
		t.Fatalf("response has no http_response: %v", resp)
	}
	for _, h := range hs {
		a.headers[h.GetHeader().GetKey()] = h.GetHeader().GetValue()
		a.list = append(a.list, h.GetHeader().GetKey()+": "+h.GetHeader().GetValue())
	}
	// Lower-case names, each once, and rate-limit fields as the draft
	// spells them, consistent with each other.
	a.hdr = enforcetest.GRPCHeaders(t, hs)
	a.got = enforcetest.ReadHeaders(t, a.hdr)
	if a.allowed != (a.code == codes.OK) {
		t.Errorf("allowed %v with status %v", a.allowed, a.code)
	}
	if !a.allowed && (a.code != codes.ResourceExhausted || a.status != 429) {
		t.Errorf("denial with status %v / HTTP %d", a.code, a.status)
	}
	return a
}

func (e *env) check(r req) answer {
	e.t.Helper()
	resp, err := e.srv.Check(context.Background(), r.proto())
	return read(e.t, resp, err)
}

// run sends r n times and returns how many were allowed.
func (e *env) run(r req, n int) int {
	e.t.Helper()
	ok := 0
	for range n {
		if e.check(r).allowed {
			ok++
		}
	}
	return ok
}

// counter reads a counter: ext_authz's own (checks, reloads) by its
// labels, the core's (backend_errors, failure_mode, local_denials) by
// their one label, from the registry as /metrics shows it.
func (e *env) counter(name string, labels ...string) float64 {
	e.t.Helper()
	var c prometheus.Collector
	m := e.srv.metrics
	switch name {
	case "checks":
		c = m.checks.WithLabelValues(labels...)
	case "reloads":
		c = e.srv.core.Metrics().Reloads.WithLabelValues(labels...)
	case "backend_errors", "failure_mode", "local_denials":
		return enforcetest.Counter(e.t, e.reg, map[string]string{
			"backend_errors": "flashgate_backend_errors_total",
			"failure_mode":   "flashgate_failure_mode_decisions_total",
			"local_denials":  "flashgate_local_denials_total",
		}[name], labels[0])
	default:
		e.t.Fatalf("unknown counter %s", name)
	}
	var out dto.Metric
	if err := c.(prometheus.Metric).Write(&out); err != nil {
		e.t.Fatal(err)
	}
	return out.GetCounter().GetValue()
}

func uid(u string) map[string]string { return map[string]string{"x-uid": u} }

func atoi(t testing.TB, s string) int {
	t.Helper()
	n, err := strconv.Atoi(s)
	if err != nil {
		t.Fatalf("%q is not a number", s)
	}
	return n
}

func wantDenied(t testing.TB, a answer, rule string, limit int) {
	t.Helper()
	if a.allowed {
		t.Fatalf("allowed, want denied by %s", rule)
	}
	if got := a.headers["x-ratelimit-limit"]; got != strconv.Itoa(limit) {
		t.Errorf("x-ratelimit-limit %q, want %d", got, limit)
	}
	if a.headers["x-ratelimit-remaining"] != "0" {
		t.Errorf("headers %v", a.headers)
	}
	if ra := atoi(t, a.headers["retry-after"]); ra < 1 || a.headers["x-ratelimit-reset"] != a.headers["retry-after"] {
		t.Errorf("retry-after %d, reset %s", ra, a.headers["x-ratelimit-reset"])
	}
	if st, ok := a.got.State(rule); !ok || st.Remaining != 0 || st.T != int64(atoi(t, a.headers["retry-after"])) {
		t.Errorf("ratelimit %q: want %s with r=0 and t the retry-after", a.headers["ratelimit"], rule)
	}
	if !slices.ContainsFunc(a.got.Policies, func(p enforcetest.Policy) bool { return p.Name == rule && p.Quota == int64(limit) }) {
		t.Errorf("ratelimit-policy %q: want %s with q=%d", a.headers["ratelimit-policy"], rule, limit)
	}
	enforcetest.CheckProblem(t, a.hdr, a.body, 429, rule)
}

// maxRequestBytes is the bound descriptors puts on a request value: the
// gRPC message limit.
const maxRequestBytes = 4 << 20

// joinParts joins key parts as a limit key holds them (see
// descriptors.Rule): one part as is, several each prefixed by its length.
func joinParts(parts []string) string {
	if len(parts) == 1 {
		return parts[0]
	}
	var b strings.Builder
	for _, s := range parts {
		b.WriteString(strconv.Itoa(len(s)) + ":" + s)
	}
	return b.String()
}
