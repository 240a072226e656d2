package extauthz

import (
	"os"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"

	"github.com/flashgate/flashgate/descriptors"
	"github.com/flashgate/flashgate/enforce"
	"github.com/flashgate/flashgate/window"
	"github.com/flashgate/flashgate/window/fallback"
	"github.com/flashgate/flashgate/window/guard"
)

// A rule is the tag of its hits: it names the Guard's penalty box and the
// Fallback's share for them.
var (
	_ guard.RuleBan      = (*descriptors.Rule)(nil)
	_ fallback.RuleShare = (*descriptors.Rule)(nil)
)

func TestMappingKeys(t *testing.T) {
	cfg, err := descriptors.ExampleConfig()
	if err != nil {
		t.Fatal(err)
	}
	k := window.Keys{}
	tests := map[string]struct {
		req  *authv3.CheckRequest
		cfg  *descriptors.Config // nil: the example
		want []string
	}{
		"headers map": {
			req:  req{path: "/api/coupon/a?q", ip: "10.0.0.1", headers: map[string]string{"x-uid": "u1"}}.proto(),
			want: []string{k.Key("coupon_per_uid", joinParts([]string{"/api/coupon/*", "u1"})), k.Key("per_ip", "10.0.0.1")},
		},
		"header_map (encode_raw_headers)": {
			req: &authv3.CheckRequest{Attributes: &authv3.AttributeContext{
				Request: &authv3.AttributeContext_Request{Http: &authv3.AttributeContext_HttpRequest{
					Path: "/api/coupon/b",
					HeaderMap: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{
						{Key: "X-Device-FP", RawValue: []byte("d1")},
						{Key: "x-device-fp", RawValue: []byte("d2")},
					}},
				}},
			}},
			want: []string{k.Key("coupon_per_device", joinParts([]string{"/api/coupon/*", "d1"}))},
		},
		"repeated header joined by Envoy: the first value": {
			req:  req{path: "/api/coupon/a", ip: "10.0.0.1", headers: map[string]string{"x-uid": "u1 ,u2,u3"}}.proto(),
			want: []string{k.Key("coupon_per_uid", joinParts([]string{"/api/coupon/*", "u1"})), k.Key("per_ip", "10.0.0.1")},
		},
		"empty first value is missing": {
			req:  req{path: "/api/coupon/a", ip: "10.0.0.1", headers: map[string]string{"x-uid": ",u2"}}.proto(),
			want: []string{k.Key("per_ip", "10.0.0.1")},
		},
		"x-forwarded-for keeps every entry": {
			req: &authv3.CheckRequest{Attributes: &authv3.AttributeContext{
				Request: &authv3.AttributeContext_Request{Http: &authv3.AttributeContext_HttpRequest{
					HeaderMap: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{
						{Key: "x-forwarded-for", RawValue: []byte("9.9.9.9")},
						{Key: "x-forwarded-for", RawValue: []byte("1.1.1.1, 2.2.2.2")},
					}},
				}},
			}},
			cfg:  parse(t, xffYAML),
			want: []string{k.Key("per_ip", "1.1.1.1")},
		},
		"nil request": {req: nil},
		"empty header value is missing": {
			req:  req{path: "/api/coupon/a", ip: "10.0.0.1", headers: map[string]string{"x-uid": ""}}.proto(),
			want: []string{k.Key("per_ip", "10.0.0.1")},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			var m mapping
			c := cfg
			if tc.cfg != nil {
				c = tc.cfg
			}
			mapCheck(c, tc.req, k, &m)
			var got []string
			for _, h := range m.Hits {
				got = append(got, h.Key)
			}
			if len(got) != len(tc.want) {
				t.Fatalf("keys %q, want %q", got, tc.want)
			}
			for i := range got {
				if got[i] != tc.want[i] {
					t.Errorf("key %d: %q, want %q", i, got[i], tc.want[i])
				}
			}
		})
	}
}

func TestDerivedNames(t *testing.T) {
	cfg := parse(t, `
domain: d
sources:
  uid: {request_headers: {header_name: X-Uid}}
descriptors:
  - key: path
    value: /api/coupon/*
    descriptors:
      - key: uid
        rate_limit: {requests: 1, window: 1s}
  - key: method
    value: POST
    rate_limit: {requests: 1, window: 1s}
`)
	want := []string{"path_api_coupon.uid", "method_POST"}
	for i, r := range cfg.Rules {
		if r.Name != want[i] {
			t.Errorf("rule %d named %q, want %q", i, r.Name, want[i])
		}
	}
	if src := cfg.Sources()["uid"]; src.Name != "x-uid" {
		t.Errorf("header name %q not lower-cased", src.Name)
	}
}

// TestMappingTag: each hit is tagged with its rule, which carries the
// rule's policy to the layers that read it, and receives the hit's own
// outcome.
func TestMappingTag(t *testing.T) {
	cfg := parse(t, localShareYAML(t))
	var m mapping
	mapCheck(cfg, req{path: "/api/x", ip: "10.0.0.1", headers: map[string]string{"x-uid": "u1"}}.proto(), window.Keys{}, &m)
	if len(m.Hits) == 0 {
		t.Fatal("no hits")
	}
	for i, h := range m.Hits {
		if tag, ok := h.Tag.(*enforce.HitTag); !ok || tag.Rule != m.Rules[i] {
			t.Errorf("hit %s: tag %v, want its rule", h.Rule, h.Tag)
		}
		r, ok := h.Tag.(window.HitReporter)
		if !ok {
			t.Fatalf("hit %s: tag %T takes no report", h.Rule, h.Tag)
		}
		r.ReportHit(window.HitReport{Known: true, Remaining: i})
		if got := m.Report(i); !got.Known || got.Remaining != i {
			t.Errorf("hit %s: report %+v, want remaining %d", h.Rule, got, i)
		}
	}
	m.Reset()
	if len(m.tags) != 0 || cap(m.tags) == 0 {
		t.Errorf("Reset left %d tags (capacity %d)", len(m.tags), cap(m.tags))
	}
}

// TestMappingLocalShare: each hit carries its rule's local_share to the
// Fallback.
func TestMappingLocalShare(t *testing.T) {
	cfg := parse(t, localShareYAML(t))
	var m mapping
	mapCheck(cfg, req{path: "/api/x", ip: "10.0.0.1", headers: map[string]string{"x-uid": "u1"}}.proto(), window.Keys{}, &m)
	want := []int{2, 10, 0}
	if len(m.Hits) != len(want) {
		t.Fatalf("%d hits, want %d", len(m.Hits), len(want))
	}
	for i, h := range m.Hits {
		r, ok := h.Tag.(fallback.RuleShare)
		if !ok {
			t.Fatalf("hit %s: tag %T names no local share", h.Rule, h.Tag)
		}
		if got := r.FallbackShare(); got != want[i] {
			t.Errorf("hit %s: local share %d, want %d", h.Rule, got, want[i])
		}
	}
}

// localShareYAML returns descriptors' local_share fixture: local_share set
// on a parent, overridden on one nested rule, a third rule left to the
// default.
func localShareYAML(t testing.TB) string {
	t.Helper()
	b, err := os.ReadFile("../descriptors/testdata/local_share.yaml")
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
