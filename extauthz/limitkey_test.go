package extauthz

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/flashgate/flashgate/descriptors"
	"github.com/flashgate/flashgate/enforce"
	"github.com/flashgate/flashgate/window"
)

// keysYAML has a rule on every source, a rule of two keyed values, a rule
// with one key for all, and one whose keyed path another descriptor's
// pattern narrows.
const keysYAML = `
domain: keys
sources:
  path: {request_path: {}}
  p2: {request_path: {}}
  uid: {request_headers: {header_name: x-uid}}
  device: {request_headers: {header_name: x-device-fp}}
  ip: {remote_address: {}}
  tenant: {context_extension: {key: tenant}}
descriptors:
  - key: path
    value: /api/coupon/*
    descriptors:
      - key: uid
        name: per_uid
        rate_limit: {requests: 5, window: 1s}
        descriptors:
          - key: device
            name: per_uid_device
            rate_limit: {requests: 3, window: 1s}
  - key: ip
    name: per_ip
    rate_limit: {requests: 100, window: 1s}
  - key: method
    name: per_method
    rate_limit: {requests: 100, window: 1s}
  - key: authority
    name: per_host
    rate_limit: {requests: 100, window: 1s}
  - key: tenant
    name: per_tenant
    rate_limit: {requests: 100, window: 1s}
  - key: path
    value: /login
    name: login_all
    rate_limit: {requests: 100, window: 1s}
  - key: path
    value: /shop/*
    descriptors:
      - key: p2
        name: shop_paths
        rate_limit: {requests: 100, window: 1s}
`

// keyRecorder is a Limiter that admits every request and remembers the key of
// each hit by rule.
type keyRecorder struct {
	mu   sync.Mutex
	keys map[string][]string // rule → keys, in order
}

func (r *keyRecorder) Decide(_ context.Context, hits []window.Hit) (window.Decision, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, h := range hits {
		r.keys[h.Rule] = append(r.keys[h.Rule], h.Key)
	}
	return window.Decision{Allowed: true, Remaining: 1, ShadowIndex: -1}, nil
}

// keyOf sends req to a Server on cfg over gRPC (its own codec, so the keys
// come from the wire decoding the server does in production) and returns
// the key it gave rule's hit, "" when rule did not apply.
func keyOf(t *testing.T, cfg *descriptors.Config, keys window.Keys, rule string, req *authv3.CheckRequest) string {
	t.Helper()
	rec := &keyRecorder{keys: map[string][]string{}}
	core, err := enforce.New(enforce.Options{Limiter: rec, Registerer: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := NewServer(cfg, Options{Core: core, Keys: keys})
	if err != nil {
		t.Fatal(err)
	}
	_, conn := serveBufconn(t, srv)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := authv3.NewAuthorizationClient(conn).Check(ctx, req)
	if a := read(t, resp, err); !a.allowed {
		t.Fatalf("denied: %+v", a)
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	switch ks := rec.keys[rule]; len(ks) {
	case 0:
		return ""
	case 1:
		return ks[0]
	default:
		t.Fatalf("rule %s hit %d times by one request", rule, len(ks))
		return ""
	}
}

// TestLimitKeyIsTheServersKey: for each rule and values, LimitKey returns
// the key the server gives a CheckRequest (go-control-plane types, over
// gRPC) carrying those values.
func TestLimitKeyIsTheServersKey(t *testing.T) {
	cfg := parse(t, keysYAML)
	keys, err := window.NewKeys("lk")
	if err != nil {
		t.Fatal(err)
	}
	long := strings.Repeat("u", 200)
	tests := map[string]struct {
		cfg    *descriptors.Config // nil: keysYAML
		rule   string
		values []string
		req    req
	}{
		"header":               {rule: "per_uid", values: []string{"alice"}, req: req{path: "/api/coupon/7?x=1", headers: uid("alice")}},
		"header, long value":   {rule: "per_uid", values: []string{long}, req: req{path: "/api/coupon/7", headers: uid(long)}},
		"header, unsafe value": {rule: "per_uid", values: []string{"al ice/é"}, req: req{path: "/api/coupon/7", headers: uid("al ice/é")}},
		"header, repeated":     {rule: "per_uid", values: []string{"alice"}, req: req{path: "/api/coupon/7", headers: uid("alice , mallory")}},
		"two values": {rule: "per_uid_device", values: []string{"alice", "dev-1"},
			req: req{path: "/api/coupon/7", headers: map[string]string{"x-uid": "alice", "x-device-fp": "dev-1"}}},
		"client IPv4":        {rule: "per_ip", values: []string{"10.1.2.3"}, req: req{path: "/", ip: "10.1.2.3"}},
		"client IPv6":        {rule: "per_ip", values: []string{"2001:db8::1"}, req: req{path: "/", ip: "2001:0db8:0::1"}},
		"client IPv4-mapped": {rule: "per_ip", values: []string{"::ffff:10.1.2.4"}, req: req{path: "/", ip: "::ffff:10.1.2.4"}},
		"client IP, trusted hop": {cfg: parse(t, xffYAML), rule: "per_ip", values: []string{"1.1.1.1"},
			req: req{path: "/", ip: "10.0.0.9", headers: map[string]string{"x-forwarded-for": "1.1.1.1, 2.2.2.2"}}},
		"method":                                 {rule: "per_method", values: []string{"PATCH"}, req: req{path: "/", method: "PATCH"}},
		"authority":                              {rule: "per_host", values: []string{"shop.example.com:8443"}, req: req{path: "/", host: "shop.example.com:8443"}},
		"context extension":                      {rule: "per_tenant", values: []string{"acme/eu"}, req: req{path: "/", ext: map[string]string{"tenant": "acme/eu"}}},
		"one key for all":                        {rule: "login_all", req: req{path: "/login?next=/"}},
		"path under a pattern of its own source": {rule: "shop_paths", values: []string{"/shop/cart"}, req: req{path: "/shop/cart?id=3"}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			c := cfg
			if tc.cfg != nil {
				c = tc.cfg
			}
			key, r, err := c.LimitKey(keys, tc.rule, tc.values...)
			if err != nil {
				t.Fatal(err)
			}
			if r.Name != tc.rule {
				t.Errorf("rule %s, want %s", r.Name, tc.rule)
			}
			if got := keyOf(t, c, keys, tc.rule, tc.req.proto()); got != key {
				t.Errorf("LimitKey %q, the server's key %q", key, got)
			}
		})
	}
	// The limit and ban are the rule's.
	_, r, err := cfg.LimitKey(keys, "per_uid_device", "a", "b")
	if err != nil || r.Limit.Requests != 3 || r.Limit.Window != time.Second {
		t.Errorf("per_uid_device: %+v, %v", r, err)
	}
}

// TestLimitKeyErrors: an unknown rule, or values no request the rule
// applies to carries, are errors that say why; where a request can carry
// such a value, the server keys it otherwise.
func TestLimitKeyErrors(t *testing.T) {
	cfg := parse(t, keysYAML)
	keys := window.Keys{}
	tests := map[string]struct {
		rule   string
		values []string
		want   string
		// req, when set, carries the value: the server's key differs.
		req *req
	}{
		"unknown rule":          {rule: "nope", values: []string{"a"}, want: `unknown rule "nope"`},
		"not an IP":             {rule: "per_ip", values: []string{"alice"}, want: `"alice" is not an IP address`},
		"IP with port":          {rule: "per_ip", values: []string{"10.0.0.1:80"}, want: "is not an IP address"},
		"empty":                 {rule: "per_uid", values: []string{""}, want: "empty"},
		"too many values":       {rule: "per_uid", values: []string{"a", "b"}, want: "keys 1 request value(s), one for each of uid (header x-uid) in order; 2 given"},
		"too few values":        {rule: "per_uid_device", values: []string{"a"}, want: "uid (header x-uid), device (header x-device-fp)"},
		"no value":              {rule: "per_uid", want: "1 request value(s)"},
		"a value for one key":   {rule: "login_all", values: []string{"/login"}, want: "takes no value"},
		"comma in a header":     {rule: "per_uid", values: []string{"a,b"}, want: "comma", req: &req{path: "/api/coupon/1", headers: uid("a,b")}},
		"blanks around":         {rule: "per_uid", values: []string{" a"}, want: "blanks", req: &req{path: "/api/coupon/1", headers: uid(" a,b")}},
		"control character":     {rule: "per_uid", values: []string{"a\nb"}, want: "control"},
		"invalid UTF-8":         {rule: "per_uid", values: []string{"a\xffb"}, want: "UTF-8"},
		"query in a path":       {rule: "shop_paths", values: []string{"/shop/a?b"}, want: "query", req: &req{path: "/shop/a?b"}},
		"outside the pattern":   {rule: "shop_paths", values: []string{"/cart"}, want: `applies only where path is "/shop/*"`},
		"not a method":          {rule: "per_method", values: []string{"GE T"}, want: "not an HTTP method"},
		"blank in an authority": {rule: "per_host", values: []string{"a b"}, want: "blanks"},
		"too long":              {rule: "per_tenant", values: []string{strings.Repeat("x", maxRequestBytes+1)}, want: "more than a CheckRequest holds"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			_, _, err := cfg.LimitKey(keys, tc.rule, tc.values...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want one containing %q", err, tc.want)
			}
			want := descriptors.ErrNeverSeen
			if name == "unknown rule" {
				want = descriptors.ErrUnknownRule
			}
			if !errors.Is(err, want) {
				t.Errorf("err = %v, want one wrapping %v", err, want)
			}
			if tc.req == nil {
				return
			}
			raw := keys.Key(tc.rule, joinParts(slices.Concat(patternsOf(cfg.Rule(tc.rule)), tc.values)))
			if got := keyOf(t, cfg, keys, tc.rule, tc.req.proto()); got == raw {
				t.Errorf("the server keys a request carrying %q as %q: LimitKey refused it", tc.values, got)
			}
		})
	}
}

// patternsOf returns the patterns of r's descriptors that set one.
func patternsOf(r *descriptors.Rule) []string {
	var out []string
	for _, m := range r.Match {
		if m.HasValue {
			out = append(out, m.Pattern())
		}
	}
	return out
}
