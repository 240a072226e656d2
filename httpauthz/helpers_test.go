package httpauthz_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/flashgate/flashgate/descriptors"
	"github.com/flashgate/flashgate/enforce"
	"github.com/flashgate/flashgate/enforce/enforcetest"
	"github.com/flashgate/flashgate/extauthz"
	"github.com/flashgate/flashgate/httpauthz"
	"github.com/flashgate/flashgate/window"
	"github.com/flashgate/flashgate/window/fallback"
	"github.com/flashgate/flashgate/window/memory"
	"github.com/flashgate/flashgate/window/testclock"
)

// rulesYAML are the test rules: 5 per second per x-uid on /api/coupon/,
// one DELETE per second, a shadow rule per x-tenant, a rule that refuses
// /api/vip/ requests without x-uid, 100 per second per client IP (the
// first trusted hop of x-forwarded-for).
const rulesYAML = `
domain: httptest
client_ip: {trusted_hops: 1}
sources:
  uid: {request_headers: {header_name: x-uid}}
  tenant: {request_headers: {header_name: x-tenant}}
descriptors:
  - key: path
    value: /api/coupon/*
    descriptors:
      - key: uid
        name: coupon_per_uid
        rate_limit: {requests: 5, window: 1s}
  - key: method
    value: DELETE
    name: deletes
    rate_limit: {requests: 1, window: 1s}
  - key: tenant
    name: tenant_shadow
    shadow_mode: true
    rate_limit: {requests: 1, window: 1s}
  - key: path
    value: /api/vip/*
    descriptors:
      - key: uid
        name: vip_needs_uid
        on_missing: deny
        rate_limit: {requests: 3, window: 1s}
  - key: remote_address
    name: per_ip
    rate_limit: {requests: 100, window: 1s}
`

// recorder is a Decider that asks the ext_authz server and keeps a copy
// of its last answer, so that a test can compare the HTTP answer with it.
type recorder struct {
	next httpauthz.Decider
	// mu guards last.
	mu   sync.Mutex
	last enforce.Answer
}

func (r *recorder) Decide(ctx context.Context, req descriptors.Request, a *enforce.Answer) error {
	err := r.next.Decide(ctx, req, a)
	r.mu.Lock()
	r.last = *a
	r.last.Policies, r.last.States = slices.Clone(a.Policies), slices.Clone(a.States)
	r.mu.Unlock()
	return err
}

func (r *recorder) Headers() enforce.Families { return r.next.Headers() }

// lastAnswer returns the last answer, with the families it is sent in.
func (r *recorder) lastAnswer() verdict {
	r.mu.Lock()
	defer r.mu.Unlock()
	return verdict{r.last, r.next.Headers()}
}

// verdict is an answer of the core, and the families it is sent in.
type verdict struct {
	a enforce.Answer
	f enforce.Families
}

// env is the HTTP front-end on a real ext_authz server, served over
// loopback by httptest.
type env struct {
	t      *testing.T
	clock  *testclock.Clock // newEnv's; nil on Redis
	rec    *recorder
	reg    *prometheus.Registry
	url    string
	client *http.Client
}

// newEnv serves the front-end (path prefix prefix) on an ext_authz server
// of yaml on the memory limiter with a test clock; mod may change the
// core's options.
func newEnv(t *testing.T, yaml, prefix string, mod func(*enforce.Options)) *env {
	t.Helper()
	clk := testclock.New()
	mem, err := memory.New(memory.Options{Now: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	fb, err := fallback.New(fallback.Options{Now: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	opts := enforce.Options{Limiter: mem, Fallback: fb, Now: clk.Now}
	if mod != nil {
		mod(&opts)
	}
	e := serveOn(t, yaml, prefix, opts, window.Keys{})
	e.clock = clk
	return e
}

// serveOn serves the front-end on an ext_authz server of yaml with keys on
// a core of opts (its Registerer replaced by the env's registry).
func serveOn(t *testing.T, yaml, prefix string, opts enforce.Options, keys window.Keys) *env {
	t.Helper()
	reg := prometheus.NewRegistry()
	opts.Registerer = reg
	core, err := enforce.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := descriptors.ParseConfig("test.yaml", []byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	srv, err := extauthz.NewServer(cfg, extauthz.Options{Core: core, Keys: keys})
	if err != nil {
		t.Fatal(err)
	}
	rec := &recorder{next: srv}
	h, err := httpauthz.New(httpauthz.Options{Decider: rec, PathPrefix: prefix, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(h)
	t.Cleanup(ts.Close)
	return &env{t: t, rec: rec, reg: reg, url: ts.URL, client: ts.Client()}
}

// reply is an HTTP answer read whole.
type reply struct {
	status int
	header http.Header
	body   string
}

func (r reply) String() string {
	return strconv.Itoa(r.status) + " " + r.body + " " + headerLine(r.header)
}

func headerLine(h http.Header) string {
	var b strings.Builder
	for k, vs := range h {
		b.WriteString(k + ": " + strings.Join(vs, ", ") + "; ")
	}
	return b.String()
}

// do sends method target (a path, resolved against the server) with the
// headers (name, value pairs) and reads the answer.
func (e *env) do(method, target string, headers ...string) reply {
	e.t.Helper()
	req, err := http.NewRequest(method, e.url+target, nil)
	if err != nil {
		e.t.Fatal(err)
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Add(headers[i], headers[i+1])
	}
	return send(e.t, e.client, req)
}

// send sends req with a generous deadline and reads the answer.
func send(t testing.TB, c *http.Client, req *http.Request) reply {
	t.Helper()
	ctx, cancel := context.WithTimeout(req.Context(), 10*time.Second)
	defer cancel()
	resp, err := c.Do(req.WithContext(ctx))
	if err != nil {
		t.Fatalf("%s %s: %v", req.Method, req.URL, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: read the body: %v", req.Method, req.URL, err)
	}
	return reply{status: resp.StatusCode, header: resp.Header, body: string(b)}
}

// mirrors fails unless r is v written as HTTP, as the ext_authz server
// writes it in a CheckResponse (enforce.Answer's Headers and Problem): an
// admission → 200 with exactly its headers; a denial → 429 (or override)
// with exactly its headers and its body.
func mirrors(t testing.TB, r reply, v verdict, override int) {
	t.Helper()
	want := map[string]string{}
	v.a.Headers(v.f, func(k, val string) { want[k] = val })
	status := http.StatusOK
	if !v.a.Denied {
		if r.body != "" {
			t.Errorf("allowed answer with body %q", r.body)
		}
	} else {
		status = http.StatusTooManyRequests
		if override != 0 {
			status = override
		}
		if r.body != v.a.Problem() && override == 0 {
			t.Errorf("body %q, want the denial's %q", r.body, v.a.Problem())
		}
	}
	if r.status != status {
		t.Errorf("status %d, want %d (%s)", r.status, status, r)
	}
	for k, val := range want {
		if got := r.header.Values(k); len(got) != 1 || got[0] != val {
			t.Errorf("header %s = %q, want %q", k, got, val)
		}
	}
	for k := range r.header {
		switch lk := strings.ToLower(k); {
		case lk == "date" || lk == "content-length":
		case want[lk] == "":
			t.Errorf("header %s: %q not in the answer", k, r.header[k])
		}
	}
}

// checkGrammar fails unless the rate-limit headers r carries are those of
// the IETF draft and the x family as enforcetest reads them (RFC 8941 lists,
// each RateLimit item naming a listed policy, Retry-After whole seconds and
// never before the denying policy's t), RateLimit-Policy is there (the
// servers here send both families; a failure mode's admission carries no
// RateLimit, as it knows no window), and a denial's body is the
// problem of the rule that refused, its status member the status sent.
func checkGrammar(t testing.TB, r reply) {
	t.Helper()
	got := enforcetest.ReadHeaders(t, r.header)
	if len(got.Policies) == 0 {
		t.Errorf("%s: want RateLimit-Policy", r)
	}
	if r.status == http.StatusOK {
		return
	}
	if got.RetryAfter < 1 {
		t.Errorf("%s: a denial without retry-after", r)
	}
	var body struct {
		Rule string `json:"rule"`
	}
	if err := json.Unmarshal([]byte(r.body), &body); err != nil {
		t.Errorf("%s: body is not JSON: %v", r, err)
		return
	}
	p := enforcetest.CheckProblem(t, r.header, r.body, r.status, body.Rule)
	if s, ok := got.State(p.Rule); !ok || s.Remaining != 0 || got.RetryAfter < s.T {
		t.Errorf("%s: the refusing rule %q's RateLimit item %+v: want r=0 and t ≤ retry-after %d", r, p.Rule, s, got.RetryAfter)
	}
}

// rejected reads flashgate_http_authz_rejected_total{reason}.
func (e *env) rejected(reason string) float64 {
	e.t.Helper()
	return enforcetest.Counter(e.t, e.reg, "flashgate_http_authz_rejected_total", reason)
}
