package httpauthz_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/flashgate/flashgate/descriptors"
	"github.com/flashgate/flashgate/enforce"
	"github.com/flashgate/flashgate/enforce/enforcetest"
	"github.com/flashgate/flashgate/httpauthz"
)

// style is how a proxy asks about the request it holds.
type style struct {
	name string
	// ask returns the method, target and headers of the check a proxy sends
	// for method path with headers.
	ask func(method, path string, headers ...string) (string, string, []string)
}

var styles = []style{
	{"Envoy http_service", func(m, p string, hs ...string) (string, string, []string) {
		return m, "/authz" + p, hs
	}},
	{"nginx auth_request", func(m, p string, hs ...string) (string, string, []string) {
		return "GET", "/flashgate-auth", append([]string{"X-Original-URI", p, "X-Original-Method", m}, hs...)
	}},
	{"Caddy forward_auth", func(m, p string, hs ...string) (string, string, []string) {
		return "GET", "/", append([]string{"X-Forwarded-Method", m, "X-Forwarded-Uri", p, "X-Forwarded-Host", "shop.example", "X-Forwarded-Proto", "https"}, hs...)
	}},
}

// ask sends the check style s makes for method path with headers.
func (e *env) ask(s style, method, path string, headers ...string) reply {
	e.t.Helper()
	m, target, hs := s.ask(method, path, headers...)
	return e.do(m, target, hs...)
}

// TestLimitThroughEachProxyStyle: through each proxy's way of asking, one
// x-uid gets 5 answers 200 with its x-ratelimit headers, then 429 with
// retry-after and the JSON body; another user is unaffected; a second
// later the user is admitted again. Every answer is exactly the ext_authz
// server's response written as HTTP, and its headers are well formed.
func TestLimitThroughEachProxyStyle(t *testing.T) {
	for _, s := range styles {
		t.Run(s.name, func(t *testing.T) {
			e := newEnv(t, rulesYAML, "/authz", nil)
			for i := range 5 {
				r := e.ask(s, "POST", "/api/coupon/1?x=1", "X-Uid", "alice")
				if r.status != http.StatusOK {
					t.Fatalf("request %d: %s, want 200", i+1, r)
				}
				mirrors(t, r, e.rec.lastAnswer(), 0)
				checkGrammar(t, r)
				if got := r.header.Get("X-Ratelimit-Remaining"); got != string(rune('0'+4-i)) {
					t.Errorf("request %d: x-ratelimit-remaining %q", i+1, got)
				}
			}
			r := e.ask(s, "POST", "/api/coupon/2", "X-Uid", "alice")
			if r.status != http.StatusTooManyRequests || r.header.Get("Retry-After") == "" || !strings.Contains(r.body, `"coupon_per_uid"`) {
				t.Fatalf("6th request: %s, want 429 with retry-after and the rule", r)
			}
			mirrors(t, r, e.rec.lastAnswer(), 0)
			checkGrammar(t, r)
			if r := e.ask(s, "POST", "/api/coupon/1", "X-Uid", "bob"); r.status != http.StatusOK {
				t.Errorf("another user: %s, want 200", r)
			}
			if r := e.ask(s, "POST", "/api/other", "X-Uid", "alice"); r.status != http.StatusOK {
				t.Errorf("a path outside the rule: %s, want 200", r)
			}
			e.clock.Advance(time.Second)
			if r := e.ask(s, "POST", "/api/coupon/1", "X-Uid", "alice"); r.status != http.StatusOK {
				t.Errorf("a window later: %s, want 200", r)
			}
		})
	}
}

// TestMethodFromEachStyle: the DELETE rule sees the original method
// however the proxy passes it.
func TestMethodFromEachStyle(t *testing.T) {
	for _, s := range styles {
		t.Run(s.name, func(t *testing.T) {
			e := newEnv(t, rulesYAML, "/authz", nil)
			if r := e.ask(s, "DELETE", "/api/x"); r.status != http.StatusOK {
				t.Fatalf("first DELETE: %s", r)
			}
			if r := e.ask(s, "DELETE", "/api/x"); r.status != http.StatusTooManyRequests || !strings.Contains(r.body, `"deletes"`) {
				t.Errorf("second DELETE: %s, want 429 by deletes", r)
			}
			if r := e.ask(s, "GET", "/api/x"); r.status != http.StatusOK {
				t.Errorf("a GET: %s", r)
			}
		})
	}
}

// TestHeaderPrecedence: X-Original-* outranks X-Forwarded-*, which
// outranks the request itself, field by field.
func TestHeaderPrecedence(t *testing.T) {
	e := newEnv(t, rulesYAML, "", nil)
	// The path from X-Original-URI (/api/other) wins over X-Forwarded-Uri:
	// the coupon rule never applies.
	for range 7 {
		if r := e.do("GET", "/api/coupon/self", "X-Original-URI", "/api/other", "X-Forwarded-Uri", "/api/coupon/1", "X-Uid", "p"); r.status != http.StatusOK {
			t.Fatalf("%s: the coupon rule applied", r)
		}
	}
	// X-Forwarded-Uri wins over the request's own path.
	n := 0
	for range 7 {
		if r := e.do("GET", "/api/other", "X-Forwarded-Uri", "/api/coupon/1", "X-Uid", "q"); r.status == http.StatusOK {
			n++
		}
	}
	if n != 5 {
		t.Errorf("X-Forwarded-Uri /api/coupon/1: %d of 7 admitted, want 5", n)
	}
	// X-Original-Method wins over X-Forwarded-Method and the request's.
	e.do("PUT", "/x", "X-Original-Method", "DELETE", "X-Forwarded-Method", "GET")
	if r := e.do("PUT", "/x", "X-Original-Method", "DELETE", "X-Forwarded-Method", "GET"); r.status != http.StatusTooManyRequests {
		t.Errorf("second X-Original-Method DELETE: %s, want 429", r)
	}
	if r := e.do("DELETE", "/x", "X-Forwarded-Method", "GET"); r.status != http.StatusOK {
		t.Errorf("DELETE request, X-Forwarded-Method GET: %s, want 200 (the rule sees GET)", r)
	}
}

// TestDenyStatus: X-Flashgate-Deny-Status 401 or 403 answers a denial
// with that status, headers and body kept; any other value is ignored;
// allowed answers stay 200.
func TestDenyStatus(t *testing.T) {
	e := newEnv(t, rulesYAML, "", nil)
	for range 5 {
		if r := e.do("GET", "/", "X-Original-URI", "/api/coupon/1", "X-Uid", "d", "X-Flashgate-Deny-Status", "403"); r.status != http.StatusOK {
			t.Fatalf("allowed with the deny-status header: %s, want 200", r)
		}
	}
	for value, want := range map[string]int{"403": 403, "401": 401, " 401 ": 401, "429": 429, "500": 429, "200": 429, "forbidden": 429, "": 429} {
		r := e.do("GET", "/", "X-Original-URI", "/api/coupon/1", "X-Uid", "d", "X-Flashgate-Deny-Status", value)
		if r.status != want {
			t.Errorf("X-Flashgate-Deny-Status %q: %s, want %d", value, r, want)
			continue
		}
		override := 0
		if want != 429 {
			override = want
		}
		mirrors(t, r, e.rec.lastAnswer(), override)
		checkGrammar(t, r)
		// The body is the denial's, its "status" and "title" members (the
		// problem body's) following the status sent.
		last := e.rec.lastAnswer()
		body := last.a.Problem()
		want := strings.Replace(body, `"title":"Too Many Requests","status":429`,
			`"title":"`+http.StatusText(r.status)+`","status":`+strconv.Itoa(r.status), 1)
		if r.body != want {
			t.Errorf("X-Flashgate-Deny-Status %q: body %q, want %q", value, r.body, want)
		}
	}
}

// TestShadowAndMissing: a shadow rule's would-be denial is answered 200
// marked x-ratelimit-shadow; on_missing: deny refuses a request without
// the value; --shadow admits everything.
func TestShadowAndMissing(t *testing.T) {
	e := newEnv(t, rulesYAML, "", nil)
	e.do("GET", "/t", "X-Tenant", "acme")
	r := e.do("GET", "/t", "X-Tenant", "acme")
	if r.status != http.StatusOK || r.header.Get("X-Ratelimit-Shadow") != "1" {
		t.Errorf("shadow rule's second request: %s, want 200 marked shadow", r)
	}
	mirrors(t, r, e.rec.lastAnswer(), 0)
	checkGrammar(t, r)
	r = e.do("GET", "/api/vip/1")
	if r.status != http.StatusTooManyRequests || !strings.Contains(r.body, `"vip_needs_uid"`) {
		t.Errorf("vip without x-uid: %s, want 429 by vip_needs_uid", r)
	}
	mirrors(t, r, e.rec.lastAnswer(), 0)
	checkGrammar(t, r)

	shadow := newEnv(t, rulesYAML, "", func(o *enforce.Options) { o.Shadow = true })
	for i := range 8 {
		r := shadow.do("GET", "/api/coupon/1", "X-Uid", "s")
		if r.status != http.StatusOK {
			t.Fatalf("--shadow request %d: %s, want 200", i+1, r)
		}
		mirrors(t, r, shadow.rec.lastAnswer(), 0)
		checkGrammar(t, r)
		if i >= 5 && r.header.Get("X-Ratelimit-Shadow") != "1" {
			t.Errorf("--shadow request %d: %s, want the shadow mark", i+1, r)
		}
	}
}

// TestClientIPFromForwardedFor: the proxy is the peer; with trusted_hops 1
// the client is the last X-Forwarded-For entry, so two clients behind one
// proxy have two buckets, and one client's bucket is shared whatever the
// entries it wrote itself before the proxy's.
func TestClientIPFromForwardedFor(t *testing.T) {
	e := newEnv(t, strings.Replace(rulesYAML, "{requests: 100, window: 1s}", "{requests: 2, window: 1s}", 1), "", nil)
	for i, xff := range []string{"203.0.113.1", "1.1.1.1, 203.0.113.1", "9.9.9.9,203.0.113.1"} {
		r := e.do("GET", "/ip", "X-Forwarded-For", xff)
		want := http.StatusOK
		if i == 2 {
			want = http.StatusTooManyRequests
		}
		if r.status != want {
			t.Errorf("request %d from 203.0.113.1 (X-Forwarded-For %q): %s, want %d", i+1, xff, r, want)
		}
	}
	if r := e.do("GET", "/ip", "X-Forwarded-For", "203.0.113.2"); r.status != http.StatusOK {
		t.Errorf("another client behind the same proxy: %s, want 200", r)
	}
}

// TestMalformed: a request that describes no check is answered 400 with a
// plain-text reason, counted by reason, and decides nothing.
func TestMalformed(t *testing.T) {
	e := newEnv(t, rulesYAML, "/authz", nil)
	tests := map[string]struct {
		target  string
		headers []string
		reason  string
	}{
		"outside the prefix":     {"/other/api/coupon/1", nil, httpauthz.ReasonOutsidePrefix},
		"relative URI":           {"/authz/", []string{"X-Original-URI", "api/coupon/1"}, httpauthz.ReasonBadURI},
		"two URIs":               {"/authz/", []string{"X-Forwarded-Uri", "/a", "X-Forwarded-Uri", "/b"}, httpauthz.ReasonBadURI},
		"bad method":             {"/authz/", []string{"X-Forwarded-Method", "G(E)T"}, httpauthz.ReasonBadMethod},
		"headers too large":      {"/authz/", []string{"X-Pad", strings.Repeat("p", httpauthz.MaxHeaderBytes)}, httpauthz.ReasonHeadersTooLarge},
		"a header list too long": {"/authz/", manyHeaderPairs(2100), httpauthz.ReasonHeadersTooLarge},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			before := e.rejected(tc.reason)
			r := e.do("GET", tc.target, append(tc.headers, "X-Uid", "m")...)
			if r.status != http.StatusBadRequest || !strings.HasPrefix(r.header.Get("Content-Type"), "text/plain") || r.body == "" {
				t.Errorf("%s, want 400 with a plain-text reason", r)
			}
			if strings.Contains(r.body, "coupon") || strings.Contains(r.body, "ppppp") {
				t.Errorf("the reason %q echoes the request", r.body)
			}
			if got := e.rejected(tc.reason); got != before+1 {
				t.Errorf("rejected{reason=%q} went %v → %v, want +1", tc.reason, before, got)
			}
		})
	}
	if n := e.rejected(httpauthz.ReasonCheckFailed); n != 0 {
		t.Errorf("check_failed %v, want 0", n)
	}
}

// manyHeaderPairs returns n small distinct headers as name, value pairs.
func manyHeaderPairs(n int) []string {
	out := make([]string, 0, 2*n)
	for i := range n {
		out = append(out, "X-H-"+strings.Repeat("a", i%5)+string(rune('a'+i%26))+string(rune('a'+i/26%26)), "v")
	}
	return out
}

// TestHostileHeaders: values an attacker controls are decided, not
// crashed on: invalid UTF-8 and padded x-uids are buckets of their own,
// headers just under the cap pass, a repeated x-uid is keyed by its
// first value as over gRPC.
func TestHostileHeaders(t *testing.T) {
	e := newEnv(t, rulesYAML, "", nil)
	admitted := func(uid string, n int, extra ...string) int {
		ok := 0
		for range n {
			hs := append([]string{"X-Original-URI", "/api/coupon/1", "X-Uid", uid}, extra...)
			switch r := e.do("GET", "/", hs...); r.status {
			case http.StatusOK:
				ok++
			case http.StatusTooManyRequests:
			default:
				t.Fatalf("x-uid %q: %s", uid[:min(len(uid), 16)], r)
			}
		}
		return ok
	}
	if n := admitted("bad\xff\xfeutf8", 7); n != 5 {
		t.Errorf("invalid UTF-8 x-uid: %d of 7 admitted, want 5", n)
	}
	long := strings.Repeat("u", 40<<10)
	if n := admitted(long, 7); n != 5 {
		t.Errorf("40 KiB x-uid: %d of 7 admitted, want 5", n)
	}
	if n := admitted(long+"x", 6); n != 5 {
		t.Errorf("a different 40 KiB x-uid shares a bucket: %d of 6 admitted, want 5", n)
	}
	// A second x-uid header does not open a fresh bucket: the first value
	// keys the request.
	if n := admitted("rep", 5); n != 5 {
		t.Fatalf("x-uid rep: %d of 5 admitted", n)
	}
	if n := admitted("rep", 1, "X-Uid", "fresh"); n != 0 {
		t.Errorf("x-uid rep repeated with another value: admitted, want the rep bucket's 429")
	}
	// Many headers under the cap are a check like any other.
	if r := e.do("GET", "/", append(manyHeaderPairs(500), "X-Original-URI", "/x")...); r.status != http.StatusOK {
		t.Errorf("500 headers: %s, want 200", r)
	}
}

// errDecider fails every check.
type errDecider struct{}

func (errDecider) Decide(context.Context, descriptors.Request, *enforce.Answer) error {
	return errors.New("backend on fire")
}

func (errDecider) Headers() enforce.Families { return enforce.FamiliesBoth }

// TestDeciderError: a Decider that fails gets 503 (a proxy's "authorizer
// failed"), counted as check_failed.
func TestDeciderError(t *testing.T) {
	reg := prometheus.NewRegistry()
	h, err := httpauthz.New(httpauthz.Options{Decider: errDecider{}, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := httpauthz.New(httpauthz.Options{Decider: errDecider{}, Registerer: reg}); err == nil {
		t.Error("a second handler registered its metric on the same registry")
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/x", nil))
	if rec.Code != http.StatusServiceUnavailable || strings.Contains(rec.Body.String(), "fire") {
		t.Errorf("%d %q, want 503 without the error's text", rec.Code, rec.Body.String())
	}
	if n := enforcetest.Counter(t, reg, "flashgate_http_authz_rejected_total", httpauthz.ReasonCheckFailed); n != 1 {
		t.Errorf("check_failed %v, want 1", n)
	}
}

// TestNew: a Handler needs a Decider and a prefix that is a path.
func TestNew(t *testing.T) {
	if _, err := httpauthz.New(httpauthz.Options{}); err == nil {
		t.Error("New without a decider succeeded")
	}
	if _, err := httpauthz.New(httpauthz.Options{Decider: errDecider{}, PathPrefix: "authz"}); err == nil {
		t.Error("New with prefix \"authz\" succeeded")
	}
}
