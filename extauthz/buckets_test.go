package extauthz

import (
	"strings"
	"testing"
	"time"

	"github.com/flashgate/flashgate/window"
)

// bucketsYAML has one rule per way of choosing a window's algorithm.
const bucketsYAML = `
domain: d
sources:
  uid: {request_headers: {header_name: x-uid}}
descriptors:
  - key: uid
    name: small
    rate_limit: {requests: 10000, window: 1h}
  - key: remote_address
    name: large
    rate_limit: {requests: 10001, window: 1h}
  - key: path
    name: chosen
    rate_limit: {requests: 100000, window: 24h, buckets: 96}
  - key: method
    name: exact_large
    rate_limit: {unit: day, requests_per_unit: 100000, algorithm: exact}
  - key: authority
    name: small_bucketed
    rate_limit: {requests: 50, window: 1m, algorithm: buckets}
`

// TestRuleBuckets: a rule's window is exact up to window.AutoBucketsAbove
// requests and bucketed above it, unless the file says otherwise; the
// validate table shows the choice.
func TestRuleBuckets(t *testing.T) {
	cfg := parse(t, bucketsYAML)
	want := map[string]struct {
		buckets int
		auto    bool
		table   string
	}{
		"small":          {0, false, ""},
		"large":          {window.DefaultBuckets, true, "buckets=60 (auto)"},
		"chosen":         {96, false, "buckets=96"},
		"exact_large":    {0, false, ""},
		"small_bucketed": {window.DefaultBuckets, false, "buckets=60"},
	}
	var b strings.Builder
	if err := cfg.WriteTable(&b); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(b.String(), "\n")
	for _, r := range cfg.Rules {
		w := want[r.Name]
		if r.Limit.Buckets != w.buckets || r.AutoBuckets != w.auto {
			t.Errorf("rule %s: %d buckets (auto %v), want %d (auto %v)", r.Name, r.Limit.Buckets, r.AutoBuckets, w.buckets, w.auto)
		}
		for _, l := range lines {
			if !strings.HasPrefix(l, r.Name+" ") {
				continue
			}
			if w.table != "" && !strings.Contains(l, w.table) || w.table == "" && strings.Contains(l, "buckets") {
				t.Errorf("rule %s: table line %q, want %q", r.Name, l, w.table)
			}
		}
	}
	t.Logf("\n%s", b.String())
}

// TestCheckBucketed: a bucketed rule is enforced through Check, its
// retry-after saying when its oldest sub-window leaves (65s here, where the
// exact log would say 60s).
func TestCheckBucketed(t *testing.T) {
	e := newEnv(t, parse(t, `
domain: d
sources:
  uid: {request_headers: {header_name: x-uid}}
descriptors:
  - key: uid
    name: per_uid
    rate_limit: {requests: 3, window: 1m, buckets: 6}
`), nil)
	e.clock.Advance(5 * time.Second) // 5s into a sub-window of 10s
	r := req{path: "/", headers: uid("u1")}
	if n := e.run(r, 3); n != 3 {
		t.Fatalf("%d of 3 allowed", n)
	}
	a := e.check(r)
	wantDenied(t, a, "per_uid", 3)
	if a.headers["retry-after"] != "65" {
		t.Fatalf("retry-after %q, want 65", a.headers["retry-after"])
	}
	e.clock.Advance(61 * time.Second) // the exact log would admit
	if a := e.check(r); a.allowed || a.headers["retry-after"] != "4" {
		t.Fatalf("at 66s: allowed %v, retry-after %q; want denied for 4 more seconds", a.allowed, a.headers["retry-after"])
	}
	e.clock.Advance(4 * time.Second)
	if a := e.check(r); !a.allowed {
		t.Fatalf("at 70s: denied (%v)", a.headers)
	}
}
