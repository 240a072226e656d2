package extauthz

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"

	"github.com/flashgate/flashgate/enforce"
	"github.com/flashgate/flashgate/enforce/enforcetest"
	"github.com/flashgate/flashgate/window"
	"github.com/flashgate/flashgate/window/guard"
)

var allFamilies = []enforce.Families{enforce.FamiliesBoth, enforce.FamiliesIETF, enforce.FamiliesX, enforce.FamiliesNone}

// recorder is a Limiter that passes hits on and keeps what the last
// decision reported of each hit's own window.
type recorder struct {
	window.Limiter

	// mu guards reports.
	mu      sync.Mutex
	reports []window.HitReport
}

func (r *recorder) Decide(ctx context.Context, hits []window.Hit) (window.Decision, error) {
	d, err := r.Limiter.Decide(ctx, hits)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.reports = r.reports[:0]
	for _, h := range hits {
		r.reports = append(r.reports, h.Tag.(*enforce.HitTag).Report)
	}
	return d, err
}

// reported returns what the last decision reported of hit i.
func (r *recorder) reported(i int) window.HitReport {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.reports[i]
}

// admitT is the t the draft wants of an admitted window that gains room
// after the report's Reset: whole seconds rounded up; the window, w, when
// the limiter does not know (Reset 0).
func admitT(rep window.HitReport, w int64) int64 {
	if rep.Reset == 0 {
		return w
	}
	return int64((rep.Reset + time.Second - 1) / time.Second)
}

const headersYAML = `
domain: hdr
sources:
  uid: {request_headers: {header_name: x-uid}}
descriptors:
  - key: uid
    name: per_uid
    rate_limit: {requests: 3, window: 1m}
  - key: remote_address
    name: per_ip
    rate_limit: {requests: 10, window: 90s}
`

// checkAnswer checks a's rate-limit fields against w under f, and a
// denial's body.
func checkAnswer(t *testing.T, a answer, f enforce.Families, w enforcetest.Want) enforcetest.Got {
	t.Helper()
	w.Families = f
	if a.allowed == w.Denied {
		t.Fatalf("allowed %v, want denied %v", a.allowed, w.Denied)
	}
	got := enforcetest.CheckHeaders(t, a.hdr, w)
	if w.Denied {
		enforcetest.CheckProblem(t, a.hdr, a.body, 429, w.Binding)
	}
	return got
}

// TestHeadersAdmittedAndDenied: a user's answers through a minute's
// window, then refused by the backend and by the Guard: every rule that
// decided has its RateLimit item, t as the limiter's reset says (or the
// window when it does not know), Retry-After the refusing rule's t, in
// every family.
func TestHeadersAdmittedAndDenied(t *testing.T) {
	pUID := enforcetest.Policy{Name: "per_uid", Quota: 3, Window: 60}
	pIP := enforcetest.Policy{Name: "per_ip", Quota: 10, Window: 90}
	both := []enforcetest.Policy{pUID, pIP}
	for _, f := range allFamilies {
		t.Run(f.String(), func(t *testing.T) {
			var rec *recorder
			var g *guard.Guard
			e := newEnv(t, parse(t, headersYAML), func(o *enforce.Options) {
				var err error
				if g, err = guard.NewGuard(o.Limiter, guard.GuardOptions{Now: o.Now}); err != nil {
					t.Fatal(err)
				}
				rec = &recorder{Limiter: g}
				o.Limiter, o.Headers = rec, f
			})
			t.Cleanup(g.Close)
			r := req{path: "/", headers: uid("u")}
			for i := range 3 {
				a := e.check(r)
				ru, ri := rec.reported(0), rec.reported(1)
				tu, ti := admitT(ru, 60), admitT(ri, 90)
				if i == 0 && (tu != 60 || ti != 90) {
					t.Errorf("first admission: t %d and %d, want the whole windows 60 and 90", tu, ti)
				}
				checkAnswer(t, a, f, enforcetest.Want{Policies: both, Binding: "per_uid", States: []enforcetest.State{
					{Name: "per_uid", Remaining: int64(2 - i), T: tu}, {Name: "per_ip", Remaining: int64(9 - i), T: ti},
				}})
				e.clock.Advance(10 * time.Second)
			}
			// Refused by the backend, 30 s in: the first admission leaves in 30 s.
			a := e.check(r)
			ti := admitT(rec.reported(1), 90)
			checkAnswer(t, a, f, enforcetest.Want{Policies: both, Binding: "per_uid", Denied: true, RetryAfter: 30,
				States: []enforcetest.State{{Name: "per_uid", Remaining: 0, T: 30}, {Name: "per_ip", Remaining: 7, T: ti}}})
			// Refused by the Guard, which knows only the refusing window.
			e.clock.Advance(5 * time.Second)
			a = e.check(r)
			checkAnswer(t, a, f, enforcetest.Want{Policies: both, Binding: "per_uid", Denied: true, RetryAfter: 25,
				States: []enforcetest.State{{Name: "per_uid", Remaining: 0, T: 25}}})
			if e.counter("local_denials", "full") != 1 {
				t.Errorf("the second refusal did not come from the Guard")
			}
		})
	}
}

func TestHeadersShadow(t *testing.T) {
	pSoft := enforcetest.Policy{Name: "soft", Quota: 2, Window: 1}
	pHard := enforcetest.Policy{Name: "hard", Quota: 3, Window: 1}
	for _, f := range allFamilies {
		t.Run(f.String(), func(t *testing.T) {
			e := newEnv(t, parse(t, shadowYAML), func(o *enforce.Options) { o.Headers = f })
			r := req{path: "/", headers: uid("u")}
			e.run(r, 2)
			// soft is over: a would-be denial, its would-be values.
			checkAnswer(t, e.check(r), f, enforcetest.Want{Policies: []enforcetest.Policy{pSoft, pHard}, Binding: "soft", Shadow: true,
				States: []enforcetest.State{{Name: "soft", Remaining: 0, T: 1}, {Name: "hard", Remaining: 0, T: 1}}})
			// --shadow: every rule a shadow rule; a missing value of an
			// on_missing: deny rule marks the answer, without a policy.
			e = newEnv(t, parse(t, missingYAML), func(o *enforce.Options) { o.Headers, o.Shadow = f, true })
			checkAnswer(t, e.check(req{path: "/"}), f, enforcetest.Want{Shadow: true})
		})
	}
}

func TestHeadersFailureModes(t *testing.T) {
	boom := errors.New("connection refused")
	pol := func(name string) enforcetest.Policy { return enforcetest.Policy{Name: name, Quota: 2, Window: 1} }
	for _, f := range allFamilies {
		t.Run(f.String(), func(t *testing.T) {
			e := newEnv(t, parse(t, modesYAML), func(o *enforce.Options) {
				o.Limiter, o.Headers = &failing{err: boom}, f
			})
			// allow: admitted without a decision: the policies, no state.
			checkAnswer(t, e.check(req{path: "/", headers: map[string]string{"x-key": "k"}}), f,
				enforcetest.Want{Policies: []enforcetest.Policy{pol("allow_key")}})
			// deny: refused by the deny rule alone, retry after a second.
			checkAnswer(t, e.check(req{path: "/", headers: map[string]string{"x-dev": "d", "x-key": "k"}}), f,
				enforcetest.Want{Policies: []enforcetest.Policy{pol("deny_dev")}, Binding: "deny_dev", Denied: true, RetryAfter: 1,
					States: []enforcetest.State{{Name: "deny_dev", Remaining: 0, T: 1}}})
			// local beside allow: the fallback's decision of the local
			// rule; the allow rule's policy without a state.
			both := []enforcetest.Policy{pol("local_uid"), pol("allow_key")}
			r := req{path: "/", headers: map[string]string{"x-uid": "u", "x-key": "k"}}
			for i := range 2 {
				checkAnswer(t, e.check(r), f, enforcetest.Want{Policies: both, Binding: "local_uid",
					States: []enforcetest.State{{Name: "local_uid", Remaining: int64(1 - i), T: 1}}})
			}
			checkAnswer(t, e.check(r), f, enforcetest.Want{Policies: both, Binding: "local_uid", Denied: true, RetryAfter: 1,
				States: []enforcetest.State{{Name: "local_uid", Remaining: 0, T: 1}}})
		})
	}
}

func TestHeadersOnMissingAndNoRule(t *testing.T) {
	for _, f := range allFamilies {
		t.Run(f.String(), func(t *testing.T) {
			e := newEnv(t, parse(t, missingYAML), func(o *enforce.Options) { o.Headers = f })
			checkAnswer(t, e.check(req{path: "/"}), f, enforcetest.Want{
				Policies: []enforcetest.Policy{{Name: "need_uid", Quota: 5, Window: 60}}, Binding: "need_uid", Denied: true, RetryAfter: 1,
				States: []enforcetest.State{{Name: "need_uid", Remaining: 0, T: 1}}})
			e = newEnv(t, parse(t, extYAML), func(o *enforce.Options) { o.Headers = f })
			if a := e.check(req{path: "/"}); !a.allowed || len(a.headers) != 0 {
				t.Errorf("no rule matched: %+v, want OK without headers", a)
			}
		})
	}
}

// TestAssembleAsEnforceSays: the responses the server assembles from its
// shared parts carry what enforce.Answer says, field for field, in every
// family, within the parts' bounds and beyond them.
func TestAssembleAsEnforceSays(t *testing.T) {
	cfg := parse(t, `
domain: a
sources:
  uid: {request_headers: {header_name: x-uid}}
descriptors:
  - key: uid
    name: small
    rate_limit: {requests: 5, window: 2s}
  - key: uid
    name: big
    rate_limit: {requests: 5000, window: 1h}
  - key: remote_address
    name: ip
    rate_limit: {requests: 100, window: 1s}
`)
	type st struct {
		rule      int
		remaining int
		t         int64
	}
	plans := map[string]struct {
		rules  []int
		states []st
		bind   int
		denied bool
		retry  time.Duration
		shadow bool
	}{
		"one state":               {rules: []int{0}, states: []st{{0, 4, 2}}, bind: 0},
		"three states":            {rules: []int{0, 1, 2}, states: []st{{0, 4, 2}, {1, 4000, 3600}, {2, 99, 1}}, bind: 0},
		"beyond the kept":         {rules: []int{1}, states: []st{{1, 4999, 3600}}, bind: 0},
		"denied":                  {rules: []int{0, 2}, states: []st{{0, 0, 2}, {2, 50, 1}}, bind: 0, denied: true, retry: 1500 * time.Millisecond},
		"denied, penalty box":     {rules: []int{0, 2}, states: []st{{0, 0, 300}}, bind: 0, denied: true, retry: 300 * time.Second},
		"shadow":                  {rules: []int{0, 2}, states: []st{{0, 0, 2}, {2, 7, 1}}, bind: 0, shadow: true},
		"policies only":           {rules: []int{0, 1, 2}, bind: -1},
		"shadow without policies": {bind: -1, shadow: true},
	}
	for _, f := range allFamilies {
		e := newEnv(t, cfg, func(o *enforce.Options) { o.Headers = f })
		rs := e.srv.rules.Load()
		for name, tc := range plans {
			t.Run(f.String()+"/"+name, func(t *testing.T) {
				p := &enforce.Answer{Binding: -1}
				for _, i := range tc.rules {
					p.Policies = append(p.Policies, rs.rules[i].policy)
				}
				for _, s := range tc.states {
					p.States = append(p.States, enforce.State{Policy: rs.rules[s.rule].policy, Remaining: s.remaining, T: s.t})
				}
				p.Binding, p.Denied, p.RetryAfter, p.Shadow = tc.bind, tc.denied, tc.retry, tc.shadow
				var want []string
				p.Headers(f, func(k, v string) { want = append(want, k+": "+v) })
				for _, resp := range []*authv3.CheckResponse{rs.assemble(p), rs.build(p), rs.build(p)} {
					a := read(t, resp, nil)
					if !slices.Equal(a.list, want) {
						t.Errorf("headers\n%q, want\n%q", a.list, want)
					}
					if tc.denied && a.body != p.Problem() {
						t.Errorf("body %s, want %s", a.body, p.Problem())
					}
				}
			})
		}
	}
}

// TestResponsesShared: answers of the same key are one shared response,
// encoded once; the rule set keeps at most maxCachedResponses of them, and
// the encodings of those it drops go too.
func TestResponsesShared(t *testing.T) {
	e := newEnv(t, parse(t, headersYAML), nil)
	rs := e.srv.rules.Load()
	ctx := context.Background()
	// Two users' third refusals, the same instant: one response.
	r1, r2 := req{path: "/", ip: "10.0.0.1", headers: uid("a")}, req{path: "/", ip: "10.0.0.2", headers: uid("b")}
	e.run(r1, 3)
	e.run(r2, 3)
	d1, _ := e.srv.Check(ctx, r1.proto())
	d2, _ := e.srv.Check(ctx, r2.proto())
	if d1.GetDeniedResponse() == nil || d1 != d2 {
		t.Fatalf("two equal refusals: %p and %p, want one shared denial", d1, d2)
	}
	if _, ok := rs.encoded.Load(d1); !ok {
		t.Error("the shared denial has no stored encoding")
	}
	// Many distinct answers: a refusal per millisecond of retry-after.
	for i := range 3 * maxCachedResponses {
		e.clock.Advance(time.Millisecond)
		if a := e.check(r1); a.allowed {
			t.Fatalf("refusal %d admitted", i)
		}
	}
	n := 0
	for i := range rs.resps.slots {
		if rs.resps.slots[i].Load() != nil {
			n++
		}
	}
	enc := 0
	rs.encoded.Range(func(_, _ any) bool { enc++; return true })
	if n < maxCachedResponses/4 || enc != n+1 { // okPlain's too
		t.Errorf("%d responses kept, %d encodings; want many, each with its encoding", n, enc)
	}
}

type intKey int

func (k intKey) hash() uint64 { return uint64(k) }

func TestSlotCache(t *testing.T) {
	var dropped []int
	c := newSlotCache[intKey](4, func(v int) { dropped = append(dropped, v) })
	for k := range intKey(4) {
		c.put(k, int(k)*10)
	}
	for k := range intKey(4) {
		if v, ok := c.get(k); !ok || v != int(k)*10 {
			t.Errorf("get(%d) = %d, %v", k, v, ok)
		}
	}
	if len(dropped) != 0 {
		t.Fatalf("dropped %v with a slot each", dropped)
	}
	c.put(5, 50) // slot 1: replaces 1
	if _, ok := c.get(1); ok || !slices.Equal(dropped, []int{10}) {
		t.Errorf("after 5 took 1's slot: 1 still kept, or dropped %v, want [10]", dropped)
	}
	if v, ok := c.get(5); !ok || v != 50 {
		t.Errorf("get(5) = %d, %v", v, ok)
	}
	if _, ok := c.get(9); ok {
		t.Error("get of a key never put found a value")
	}
}
