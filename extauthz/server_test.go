package extauthz

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"

	"github.com/flashgate/flashgate/descriptors"
	"github.com/flashgate/flashgate/enforce"
	"github.com/flashgate/flashgate/window"
	"github.com/flashgate/flashgate/window/guard"
)

func TestExampleRules(t *testing.T) {
	tests := map[string]struct {
		reqs    []req // sent round-robin, n in all
		n       int
		allowed int
		rule    string // the denying rule, if any
		limit   int
	}{
		"5/s per uid": {
			reqs: []req{{path: "/api/coupon/claim", headers: uid("u1")}}, n: 8, allowed: 5, rule: "coupon_per_uid", limit: 5,
		},
		"one uid bucket across coupon paths and IPs": {
			reqs: []req{
				{path: "/api/coupon/a", headers: uid("u1"), ip: "10.0.0.1"},
				{path: "/api/coupon/b?x=1", headers: uid("u1"), ip: "10.0.0.2"},
			}, n: 8, allowed: 5, rule: "coupon_per_uid", limit: 5,
		},
		"10/s per device": {
			reqs: []req{
				{path: "/api/coupon/a", headers: map[string]string{"x-device-fp": "d1", "x-uid": "a"}},
				{path: "/api/coupon/a", headers: map[string]string{"x-device-fp": "d1", "x-uid": "b"}},
				{path: "/api/coupon/a", headers: map[string]string{"x-device-fp": "d1", "x-uid": "c"}},
			}, n: 13, allowed: 10, rule: "coupon_per_device", limit: 10,
		},
		"100/s per IP on any path": {
			reqs: []req{{path: "/", ip: "192.0.2.7"}, {path: "/api/coupon/x", ip: "192.0.2.7"}}, n: 104, allowed: 100, rule: "per_ip", limit: 100,
		},
		"missing headers skip the coupon rules": {
			reqs: []req{{path: "/api/coupon/claim"}}, n: 50, allowed: 50,
		},
		"uid rule only under /api/coupon/": {
			reqs: []req{{path: "/api/other", headers: uid("u1")}}, n: 20, allowed: 20,
		},
		"query string does not make a prefix match": {
			reqs: []req{{path: "/api?/api/coupon/", headers: uid("u1")}}, n: 10, allowed: 10,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			e := newEnv(t, nil, nil)
			var last answer
			ok := 0
			for i := range tc.n {
				last = e.check(tc.reqs[i%len(tc.reqs)])
				if last.allowed {
					ok++
				}
			}
			if ok != tc.allowed {
				t.Fatalf("allowed %d of %d, want %d", ok, tc.n, tc.allowed)
			}
			if tc.rule != "" {
				wantDenied(t, last, tc.rule, tc.limit)
				if got := e.counter("checks", "flashsale", tc.rule, "denied"); got != float64(tc.n-tc.allowed) {
					t.Errorf("denied counter %v", got)
				}
			}
			// A second later the windows admit again.
			e.clock.Advance(time.Second)
			if a := e.check(tc.reqs[0]); !a.allowed {
				t.Errorf("denied after the window passed: %v", a)
			}
		})
	}
}

func TestAllowedHeadersTightest(t *testing.T) {
	e := newEnv(t, nil, nil)
	r := req{path: "/api/coupon/a", headers: map[string]string{"x-uid": "u", "x-device-fp": "d"}}
	for i := range 5 {
		a := e.check(r)
		if !a.allowed || a.headers["x-ratelimit-limit"] != "5" || atoi(t, a.headers["x-ratelimit-remaining"]) != 4-i {
			t.Fatalf("request %d: %+v", i, a)
		}
	}
	a := e.check(req{path: "/", ip: "10.9.9.9"})
	if a.headers["x-ratelimit-limit"] != "100" || a.headers["x-ratelimit-remaining"] != "99" {
		t.Errorf("IP rule only: %v", a.headers)
	}
	if _, ok := a.headers["x-ratelimit-shadow"]; ok {
		t.Error("shadow header on a plain admission")
	}
}

func TestDeniedResponse(t *testing.T) {
	e := newEnv(t, nil, nil)
	r := req{path: "/api/coupon/a", headers: uid("u")}
	e.run(r, 5)
	e.clock.Advance(300 * time.Millisecond)
	a := e.check(r)
	wantDenied(t, a, "coupon_per_uid", 5)
	var body struct {
		Error        string `json:"error"`
		Rule         string `json:"rule"`
		RetryAfterMS int    `json:"retry_after_ms"`
	}
	if err := json.Unmarshal([]byte(a.body), &body); err != nil {
		t.Fatal(err)
	}
	if body.Error != "too_many_requests" || body.Rule != "coupon_per_uid" || body.RetryAfterMS != 700 {
		t.Errorf("body %+v", body)
	}
	if a.headers["retry-after"] != "1" {
		t.Errorf("retry-after %s, want 1 (700ms rounded up)", a.headers["retry-after"])
	}
}

func TestAllOrNothing(t *testing.T) {
	// uid 5/s and device 10/s: requests denied by the uid rule must not
	// count against the device.
	e := newEnv(t, nil, nil)
	dev := func(u string) req {
		return req{path: "/api/coupon/a", headers: map[string]string{"x-uid": u, "x-device-fp": "d"}}
	}
	if got := e.run(dev("u1"), 20); got != 5 {
		t.Fatalf("u1 allowed %d, want 5", got)
	}
	if got := e.run(dev("u2"), 20); got != 5 {
		t.Fatalf("u2 allowed %d, want 5: denied requests were counted for the device", got)
	}
	a := e.check(dev("u3"))
	wantDenied(t, a, "coupon_per_device", 10)
}

const extYAML = `
domain: ext
sources:
  tenant: {context_extension: {key: tenant}}
  route: {context_extension: {key: route}}
descriptors:
  - key: route
    value: checkout
    descriptors:
      - key: tenant
        name: per_tenant
        rate_limit: {unit: second, requests_per_unit: 2}
`

func TestContextExtensions(t *testing.T) {
	e := newEnv(t, parse(t, extYAML), nil)
	r := req{path: "/x", ext: map[string]string{"route": "checkout", "tenant": "acme"}}
	if got := e.run(r, 4); got != 2 {
		t.Errorf("allowed %d, want 2", got)
	}
	r.ext["tenant"] = "other"
	if got := e.run(r, 4); got != 2 {
		t.Errorf("other tenant allowed %d, want 2", got)
	}
	if got := e.run(req{path: "/x", ext: map[string]string{"route": "browse", "tenant": "acme"}}, 4); got != 4 {
		t.Errorf("other route allowed %d, want 4", got)
	}
}

const shadowYAML = `
domain: shadow
sources:
  uid: {request_headers: {header_name: x-uid}}
descriptors:
  - key: uid
    name: soft
    shadow_mode: true
    rate_limit: {requests: 2, window: 1s}
  - key: remote_address
    name: hard
    rate_limit: {requests: 3, window: 1s}
`

func TestShadow(t *testing.T) {
	t.Run("rule", func(t *testing.T) {
		e := newEnv(t, parse(t, shadowYAML), nil)
		r := req{path: "/", headers: uid("u")}
		for i := range 3 {
			a := e.check(r)
			if !a.allowed {
				t.Fatalf("request %d denied", i)
			}
			if got := a.headers["x-ratelimit-shadow"]; (i == 2) != (got == "1") {
				t.Errorf("request %d: shadow header %q", i, got)
			}
		}
		if got := e.counter("checks", "shadow", "soft", "shadow_denied"); got != 1 {
			t.Errorf("shadow_denied %v, want 1", got)
		}
		// The enforcing rule still denies.
		wantDenied(t, e.check(r), "hard", 3)
	})
	t.Run("global", func(t *testing.T) {
		e := newEnv(t, parse(t, shadowYAML), func(o *enforce.Options) { o.Shadow = true })
		r := req{path: "/", headers: uid("u")}
		for i := range 10 {
			a := e.check(r)
			if !a.allowed {
				t.Fatalf("request %d denied under --shadow", i)
			}
			if got := a.headers["x-ratelimit-shadow"]; (i >= 2) != (got == "1") {
				t.Errorf("request %d: shadow header %q", i, got)
			}
		}
		// Each would-be denial is counted once, under the first rule over.
		if got := e.counter("checks", "shadow", "soft", "shadow_denied"); got != 8 {
			t.Errorf("shadow_denied{soft} = %v, want 8", got)
		}
	})
}

const missingYAML = `
domain: strict
sources:
  uid: {request_headers: {header_name: x-uid}}
  key: {request_headers: {header_name: x-api-key}}
descriptors:
  - key: uid
    name: need_uid
    on_missing: deny
    rate_limit: {requests: 5, window: 1m}
  - key: key
    name: soft_key
    on_missing: deny
    shadow_mode: true
    rate_limit: {requests: 5, window: 1m}
`

func TestOnMissing(t *testing.T) {
	e := newEnv(t, parse(t, missingYAML), nil)
	wantDenied(t, e.check(req{path: "/"}), "need_uid", 5)
	a := e.check(req{path: "/", headers: uid("u")})
	if !a.allowed || a.headers["x-ratelimit-shadow"] != "1" {
		t.Errorf("a missing value of a shadow rule: %+v", a)
	}
	a = e.check(req{path: "/", headers: map[string]string{"x-uid": "u", "x-api-key": "k"}})
	if !a.allowed || a.headers["x-ratelimit-shadow"] != "" {
		t.Errorf("all values present: %+v", a)
	}
	// A long value is a bucket of its own (hashed), not a missing one.
	if a := e.check(req{path: "/", headers: uid(strings.Repeat("u", 64<<10))}); !a.allowed {
		t.Errorf("a 64 KiB value was refused as missing: %+v", a)
	}
}

func TestHostileHeaders(t *testing.T) {
	huge := strings.Repeat("A", 1<<20)
	values := map[string]string{
		"1 MB":         huge,
		"NUL":          "u\x00ser",
		"invalid UTF8": "\xff\xfe\xfd",
		"braces":       "{tag}}{",
		"colons":       "a:b:c",
		"max length":   strings.Repeat("z", descriptors.MaxValueLen),
	}
	for name, v := range values {
		t.Run(name, func(t *testing.T) {
			e := newEnv(t, nil, nil)
			r := req{path: "/api/coupon/" + v, host: v, method: v,
				headers: map[string]string{"x-uid": v, "x-device-fp": v, "x-forwarded-for": v}}
			// Whatever the value, the per-uid rule (5/s) holds: long values
			// are hashed, never dropped.
			if allowed := e.run(r, 7); allowed != 5 {
				t.Errorf("allowed %d, want 5", allowed)
			}
			// The keys are bounded and carry no hash tag from the value.
			var m mapping
			mapCheck(e.srv.Config(), r.proto(), window.Keys{}, &m)
			for _, h := range m.Hits {
				if len(h.Key) > window.MaxKeyLen || strings.Count(h.Key, "{") != 1 {
					t.Errorf("key %q", h.Key)
				}
			}
		})
	}
}

const xffYAML = `
domain: xff
client_ip: {trusted_hops: 2}
descriptors:
  - key: remote_address
    name: per_ip
    rate_limit: {requests: 1, window: 1s}
`

func TestClientIP(t *testing.T) {
	tests := map[string]struct {
		yaml string
		xff  string
		peer string
		want string
	}{
		"no trusted hops ignores XFF":   {yaml: "", xff: "1.1.1.1", peer: "10.0.0.9", want: "10.0.0.9"},
		"two hops: 2nd from the right":  {yaml: xffYAML, xff: "6.6.6.6, 203.0.113.5, 10.1.1.1", peer: "10.0.0.9", want: "203.0.113.5"},
		"spoofed left entries ignored":  {yaml: xffYAML, xff: "1.2.3.4,5.6.7.8, 203.0.113.5 ,10.1.1.1", peer: "10.0.0.9", want: "203.0.113.5"},
		"too few entries: peer":         {yaml: xffYAML, xff: "10.1.1.1", peer: "10.0.0.9", want: "10.0.0.9"},
		"no XFF: peer":                  {yaml: xffYAML, peer: "10.0.0.9", want: "10.0.0.9"},
		"ip:port entry":                 {yaml: xffYAML, xff: "203.0.113.5:443, 10.1.1.1", peer: "10.0.0.9", want: "203.0.113.5"},
		"IPv6 entry":                    {yaml: xffYAML, xff: "2001:db8::1, 10.1.1.1", peer: "10.0.0.9", want: "2001:db8::1"},
		"garbage in a trusted position": {yaml: xffYAML, xff: "{evil}, 10.1.1.1", peer: "10.0.0.9", want: "10.0.0.9"},
		"IPv4-mapped IPv6 unmapped":     {yaml: xffYAML, xff: "::ffff:203.0.113.5, 10.1.1.1", peer: "10.0.0.9", want: "203.0.113.5"},
		"IPv4-mapped peer unmapped":     {yaml: "", peer: "::ffff:203.0.113.7", want: "203.0.113.7"},
		"IPv6 spelled long":             {yaml: xffYAML, xff: "2001:0db8:0000::0001, 10.1.1.1", peer: "10.0.0.9", want: "2001:db8::1"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			cfg, err := descriptors.ExampleConfig()
			if tc.yaml != "" {
				cfg, err = descriptors.ParseConfig("xff.yaml", []byte(tc.yaml))
			}
			if err != nil {
				t.Fatal(err)
			}
			r := req{path: "/", ip: tc.peer, headers: map[string]string{}}
			if tc.xff != "" {
				r.headers["x-forwarded-for"] = tc.xff
			}
			var m mapping
			mapCheck(cfg, r.proto(), window.Keys{}, &m)
			var got string
			for _, h := range m.Hits {
				if h.Rule == "per_ip" {
					got = h.Key
				}
			}
			want := ""
			if tc.want != "" {
				want = window.Keys{}.Key("per_ip", tc.want)
			}
			if got != want {
				t.Errorf("key %q, want %q", got, want)
			}
		})
	}
}

func TestNilAndEmptyRequests(t *testing.T) {
	e := newEnv(t, nil, nil)
	for name, r := range map[string]*authv3.CheckRequest{
		"nil":   nil,
		"empty": {},
	} {
		resp, err := e.srv.Check(context.Background(), r)
		if a := read(t, resp, err); !a.allowed {
			t.Errorf("%s: denied", name)
		}
	}
}

// failing is a Limiter that fails, optionally slowly and ignoring ctx.
type failing struct {
	err   error
	delay time.Duration
	calls atomic.Int64
}

func (f *failing) Decide(ctx context.Context, hits []window.Hit) (window.Decision, error) {
	f.calls.Add(1)
	if f.delay > 0 {
		time.Sleep(f.delay)
	}
	return window.Decision{}, f.err
}

const modesYAML = `
domain: modes
sources:
  uid: {request_headers: {header_name: x-uid}}
  dev: {request_headers: {header_name: x-dev}}
  key: {request_headers: {header_name: x-key}}
descriptors:
  - key: uid
    name: local_uid
    failure_mode: local
    rate_limit: {requests: 2, window: 1s}
  - key: dev
    name: deny_dev
    failure_mode: deny
    rate_limit: {requests: 2, window: 1s}
  - key: key
    name: allow_key
    failure_mode: allow
    rate_limit: {requests: 2, window: 1s}
`

func TestFailureModes(t *testing.T) {
	boom := errors.New("connection refused")
	tests := map[string]struct {
		headers map[string]string
		allowed int // of 5
		mode    string
	}{
		"local enforces in process": {headers: uid("u"), allowed: 2, mode: "local"},
		"deny refuses":              {headers: map[string]string{"x-dev": "d"}, allowed: 0, mode: "deny"},
		"allow admits":              {headers: map[string]string{"x-key": "k"}, allowed: 5, mode: "allow"},
		"deny wins over local":      {headers: map[string]string{"x-uid": "u", "x-dev": "d"}, allowed: 0, mode: "deny"},
		"local beats allow":         {headers: map[string]string{"x-uid": "u", "x-key": "k"}, allowed: 2, mode: "local"},
		"no hits: nothing to fail":  {headers: nil, allowed: 5},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			e := newEnv(t, parse(t, modesYAML), func(o *enforce.Options) {
				o.Limiter = &failing{err: boom}
			})
			if got := e.run(req{path: "/", headers: tc.headers}, 5); got != tc.allowed {
				t.Errorf("allowed %d of 5, want %d", got, tc.allowed)
			}
			if tc.mode != "" {
				if got := e.counter("failure_mode", tc.mode); got != 5 {
					t.Errorf("failure_mode{%s} = %v, want 5", tc.mode, got)
				}
				if got := e.counter("backend_errors", "other"); got != 5 {
					t.Errorf("backend_errors{other} = %v, want 5", got)
				}
			}
		})
	}
}

func TestBreaker(t *testing.T) {
	// Redis refusing connections: dead, not slow.
	f := &failing{err: fmt.Errorf("redis decide: %w", &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED})}
	e := newEnv(t, nil, func(o *enforce.Options) {
		// The stack's breaker in front of a failing backend: the server
		// takes the failure mode for its ErrBreakerOpen like any error.
		br, err := guard.NewBreaker(f, guard.BreakerOptions{ConnFailures: 3, Cooldown: time.Second, Now: o.Now})
		if err != nil {
			t.Fatal(err)
		}
		o.Limiter = br
	})
	r := req{path: "/"}
	e.run(r, 10)
	if got := f.calls.Load(); got != 3 {
		t.Fatalf("backend called %d times, want 3 before the breaker opens", got)
	}
	if got := e.counter("backend_errors", "breaker_open"); got != 7 {
		t.Errorf("breaker_open %v, want 7", got)
	}
	e.clock.Advance(time.Second)
	e.run(r, 5) // one probe, fails, reopens
	if got := f.calls.Load(); got != 4 {
		t.Fatalf("backend called %d times, want one probe", got)
	}
	f.err = nil // the backend recovers (Decide now admits)
	e.clock.Advance(time.Second)
	e.run(r, 5)
	if got := f.calls.Load(); got != 9 {
		t.Fatalf("backend called %d times after recovery, want 9", got)
	}
}

// TestRepeatedHeader: a header sent twice counts under its first value,
// whether Envoy joined the occurrences with "," in headers or listed them
// in header_map (encode_raw_headers): varying an appended duplicate never
// opens a fresh bucket.
func TestRepeatedHeader(t *testing.T) {
	for name, build := range map[string]func(i int) *authv3.CheckRequest{
		"joined by Envoy": func(i int) *authv3.CheckRequest {
			return req{path: "/api/coupon/a", headers: uid(fmt.Sprintf("u1,r%d", i))}.proto()
		},
		"joined with a space": func(i int) *authv3.CheckRequest {
			return req{path: "/api/coupon/a", headers: uid(fmt.Sprintf("u1 , r%d", i))}.proto()
		},
		"header_map": func(i int) *authv3.CheckRequest {
			r := req{path: "/api/coupon/a"}.proto()
			r.Attributes.Request.Http.HeaderMap = &corev3.HeaderMap{Headers: []*corev3.HeaderValue{
				{Key: "x-uid", RawValue: []byte("u1")},
				{Key: "X-Uid", RawValue: []byte(fmt.Sprintf("r%d", i))},
			}}
			return r
		},
	} {
		t.Run(name, func(t *testing.T) {
			e := newEnv(t, nil, nil)
			allowed := 0
			for i := range 7 {
				if e.check2(build(i)).allowed {
					allowed++
				}
			}
			if allowed != 5 {
				t.Fatalf("allowed %d of 7 requests with x-uid u1 and a varying duplicate, want 5", allowed)
			}
			// The plain header shares the bucket.
			wantDenied(t, e.check(req{path: "/api/coupon/a", headers: uid("u1")}), "coupon_per_uid", 5)
		})
	}
}

// check2 sends a CheckRequest as built.
func (e *env) check2(r *authv3.CheckRequest) answer {
	e.t.Helper()
	resp, err := e.srv.Check(context.Background(), r)
	return read(e.t, resp, err)
}
