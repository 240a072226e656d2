package rls

import (
	"context"
	"slices"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/flashgate/flashgate/enforce"
	"github.com/flashgate/flashgate/enforce/enforcetest"
	"github.com/flashgate/flashgate/window/fallback"
	"github.com/flashgate/flashgate/window/memory"
	"github.com/flashgate/flashgate/window/testclock"
)

var allFamilies = []enforce.Families{enforce.FamiliesBoth, enforce.FamiliesIETF, enforce.FamiliesX, enforce.FamiliesNone}

// clockServer is a Server on the good configs with a memory limiter on a
// test clock, which stands still.
func clockServer(t *testing.T, mod func(*testOptions)) *Server {
	t.Helper()
	clk := testclock.New()
	mem, err := memory.New(memory.Options{Now: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	o := testOptions{coreOptions: coreOptions{Limiter: mem, Registerer: prometheus.NewRegistry(), Now: clk.Now}}
	if mod != nil {
		mod(&o)
	}
	return newServer(t, loadGood(t), o)
}

// checkRLS calls s with req and checks the answer's overall code, its
// rate-limit headers against w under f, and an OVER_LIMIT's raw body.
func checkRLS(t *testing.T, s *Server, req *rlsv3.RateLimitRequest, f enforce.Families, code rlsv3.RateLimitResponse_Code, w enforcetest.Want) {
	t.Helper()
	resp, err := s.ShouldRateLimit(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	if resp.GetOverallCode() != code {
		t.Fatalf("overall %s, want %s", resp.GetOverallCode(), code)
	}
	w.Families = f
	h := enforcetest.HeaderValues(t, resp.GetResponseHeadersToAdd())
	enforcetest.CheckHeaders(t, h, w)
	if w.Denied {
		enforcetest.CheckProblem(t, h, string(resp.GetRawBody()), 429, w.Binding)
	} else if len(resp.GetRawBody()) > 0 {
		t.Errorf("raw body %q on an OK answer", resp.GetRawBody())
	}
}

func TestHeadersDecided(t *testing.T) {
	ip := enforcetest.Policy{Name: "remote_address_10.0.0.1", Quota: 5, Window: 60}
	msg := enforcetest.Policy{Name: "message_type_marketing.to_number", Quota: 2, Window: 60}
	req := request("basic", desc("remote_address", "10.0.0.1"), desc("message_type", "marketing", "to_number", "1"))
	for _, f := range allFamilies {
		t.Run(f.String(), func(t *testing.T) {
			s := clockServer(t, func(o *testOptions) { o.Headers = f })
			for i := range 2 {
				checkRLS(t, s, req, f, ok, enforcetest.Want{Policies: []enforcetest.Policy{ip, msg}, Binding: msg.Name,
					States: []enforcetest.State{{Name: ip.Name, Remaining: int64(4 - i), T: 60}, {Name: msg.Name, Remaining: int64(1 - i), T: 60}}})
			}
			checkRLS(t, s, req, f, over, enforcetest.Want{Policies: []enforcetest.Policy{ip, msg}, Binding: msg.Name, Denied: true, RetryAfter: 60,
				States: []enforcetest.State{{Name: ip.Name, Remaining: 3, T: 60}, {Name: msg.Name, Remaining: 0, T: 60}}})
			// A limit of 0 refuses without asking: retry no sooner than its window.
			blocked := enforcetest.Policy{Name: "remote_address_50.0.0.5", Quota: 0, Window: 60}
			checkRLS(t, s, request("basic", desc("remote_address", "50.0.0.5")), f, over, enforcetest.Want{
				Policies: []enforcetest.Policy{blocked}, Binding: blocked.Name, Denied: true, RetryAfter: 60,
				States: []enforcetest.State{{Name: blocked.Name, Remaining: 0, T: 60}}})
			// An unknown domain, an unlimited descriptor: no policy.
			checkRLS(t, s, request("nowhere", desc("a", "b")), f, ok, enforcetest.Want{})
		})
	}
}

func TestHeadersShadow(t *testing.T) {
	userA := enforcetest.Policy{Name: "service.user_user-a", Quota: 2, Window: 60}
	blocked := enforcetest.Policy{Name: "remote_address_50.0.0.5", Quota: 0, Window: 60}
	anyIP := enforcetest.Policy{Name: "remote_address", Quota: 3, Window: 60}
	for _, f := range allFamilies {
		t.Run(f.String(), func(t *testing.T) {
			// shadow_mode: the would-be denial is admitted, marked, with its
			// would-be values.
			s := clockServer(t, func(o *testOptions) { o.Headers = f })
			req := request("shadow", desc("service", "s", "user", "user-a"))
			for i := range 2 {
				checkRLS(t, s, req, f, ok, enforcetest.Want{Policies: []enforcetest.Policy{userA}, Binding: userA.Name,
					States: []enforcetest.State{{Name: userA.Name, Remaining: int64(1 - i), T: 60}}})
			}
			checkRLS(t, s, req, f, ok, enforcetest.Want{Policies: []enforcetest.Policy{userA}, Binding: userA.Name, Shadow: true,
				States: []enforcetest.State{{Name: userA.Name, Remaining: 0}}})
			// --shadow: a limit of 0 is a would-be refusal too.
			s = clockServer(t, func(o *testOptions) { o.Headers, o.Shadow = f, true })
			checkRLS(t, s, request("basic", desc("remote_address", "50.0.0.5"), desc("remote_address", "1.1.1.1")), f, ok,
				enforcetest.Want{Policies: []enforcetest.Policy{blocked, anyIP}, Binding: anyIP.Name, Shadow: true,
					States: []enforcetest.State{{Name: blocked.Name, Remaining: 0, T: 60}, {Name: anyIP.Name, Remaining: 2, T: 60}}})
		})
	}
}

func TestHeadersFailureModes(t *testing.T) {
	user := enforcetest.Policy{Name: "tenant.user", Quota: 2, Window: 3600}
	quiet := enforcetest.Policy{Name: "quiet", Quota: 2, Window: 60}
	apiKey := enforcetest.Policy{Name: "api_key", Quota: 2, Window: 90}
	for _, f := range allFamilies {
		t.Run(f.String(), func(t *testing.T) {
			clk := testclock.New()
			fb, err := fallback.New(fallback.Options{Now: clk.Now})
			if err != nil {
				t.Fatal(err)
			}
			s := clockServer(t, func(o *testOptions) {
				o.Limiter, o.Fallback, o.FailureMode, o.Headers, o.Now = failing{}, fb, enforce.FailureLocal, f, clk.Now
			})
			// deny: refused by the deny rule alone, retry after a second.
			checkRLS(t, s, request("flashgate", desc("tenant", "t", "user", "u"), desc("quiet", "q")), f, over, enforcetest.Want{
				Policies: []enforcetest.Policy{user}, Binding: user.Name, Denied: true, RetryAfter: 1,
				States: []enforcetest.State{{Name: user.Name, Remaining: 0, T: 1}}})
			// allow: admitted without a decision: the policy, no state.
			checkRLS(t, s, request("flashgate", desc("quiet", "q")), f, ok, enforcetest.Want{Policies: []enforcetest.Policy{quiet}})
			// local beside allow: the fallback's numbers for the local rule.
			req := request("flashgate", desc("quiet", "q"), desc("api_key", "k"))
			both := []enforcetest.Policy{quiet, apiKey}
			for i := range 2 {
				checkRLS(t, s, req, f, ok, enforcetest.Want{Policies: both, Binding: apiKey.Name,
					States: []enforcetest.State{{Name: apiKey.Name, Remaining: int64(1 - i), T: 90}}})
			}
			checkRLS(t, s, req, f, over, enforcetest.Want{Policies: both, Binding: apiKey.Name, Denied: true, RetryAfter: 90,
				States: []enforcetest.State{{Name: apiKey.Name, Remaining: 0, T: 90}}})
		})
	}
}

// TestOmitExtras: with OmitExtras and the families none, every answer is
// ratelimit's: no header and no raw_body, on OK, OVER_LIMIT, a limit of 0
// and a shadow admission alike; with ResponseHeaders, ratelimit's three
// headers alone. Other families still come when asked, without the
// denial's fields.
func TestOmitExtras(t *testing.T) {
	reqs := []*rlsv3.RateLimitRequest{
		request("basic", desc("remote_address", "10.0.0.1"), desc("message_type", "marketing", "to_number", "1")),
		request("basic", desc("remote_address", "50.0.0.5")),
		request("shadow", desc("service", "s", "user", "user-a")),
	}
	// answers sends each request 3 times and returns the answers.
	answers := func(s *Server) []*rlsv3.RateLimitResponse {
		var out []*rlsv3.RateLimitResponse
		for _, req := range reqs {
			for range 3 {
				resp, err := s.ShouldRateLimit(context.Background(), req)
				if err != nil {
					t.Fatal(err)
				}
				out = append(out, resp)
			}
		}
		return out
	}
	overs := 0
	for i, resp := range answers(clockServer(t, func(o *testOptions) { o.OmitExtras, o.Headers = true, enforce.FamiliesNone })) {
		if resp.GetOverallCode() == over {
			overs++
		}
		if len(resp.GetResponseHeadersToAdd()) > 0 || resp.GetRawBody() != nil {
			t.Errorf("answer %d: headers %v, raw_body %q, want neither", i, resp.GetResponseHeadersToAdd(), resp.GetRawBody())
		}
	}
	if overs != 4 {
		t.Errorf("%d OVER_LIMIT answers, want 4 (one of the first request, three of the limit of 0)", overs)
	}
	names := DefaultHeaderNames()
	for i, resp := range answers(clockServer(t, func(o *testOptions) {
		o.OmitExtras, o.Headers, o.ResponseHeaders = true, enforce.FamiliesNone, true
	})) {
		var keys []string
		for _, h := range resp.GetResponseHeadersToAdd() {
			keys = append(keys, h.GetKey())
		}
		if want := []string{names.Limit, names.Remaining, names.Reset}; !slices.Equal(keys, want) || resp.GetRawBody() != nil {
			t.Errorf("answer %d: headers %v, raw_body %q, want %v alone", i, keys, resp.GetRawBody(), want)
		}
	}
	for i, resp := range answers(clockServer(t, func(o *testOptions) { o.OmitExtras, o.Headers = true, enforce.FamiliesBoth })) {
		h := enforcetest.HeaderValues(t, resp.GetResponseHeadersToAdd())
		for _, k := range []string{enforce.HeaderRetryAfter, enforce.HeaderContentType, enforce.HeaderShadow} {
			if h.Get(k) != "" {
				t.Errorf("answer %d: %s with OmitExtras", i, k)
			}
		}
		if h.Get(enforce.HeaderRateLimitPolicy) == "" || resp.GetRawBody() != nil {
			t.Errorf("answer %d: headers %v, raw_body %q, want the families, no raw_body", i, h, resp.GetRawBody())
		}
	}
}
