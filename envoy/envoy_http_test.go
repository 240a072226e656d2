package envoy

import (
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	extauthzv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_authz/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
)

// checkHTTPService asserts what envoy-http.yaml's ext_authz must say to
// flashgate's HTTP front-end: where it is, which request headers it sees
// and which of its response headers reach the client.
func checkHTTPService(t *testing.T, authz *extauthzv3.ExtAuthz) {
	t.Helper()
	hs := authz.GetHttpService()
	if hs == nil {
		t.Fatalf("ext_authz has no http_service")
	}
	su := hs.GetServerUri()
	if su.GetCluster() != "flashgate" {
		t.Errorf("http_service.server_uri.cluster = %q, want flashgate", su.GetCluster())
	}
	if u, err := url.Parse(su.GetUri()); err != nil || u.Scheme != "http" || u.Host != flashgateFacts["envoy-http.yaml"].flashgateAddr {
		t.Errorf("http_service.server_uri.uri = %q, want http://%s (the cluster's endpoint)", su.GetUri(), flashgateFacts["envoy-http.yaml"].flashgateAddr)
	}
	if d := su.GetTimeout().AsDuration(); d <= 0 || d > 250*time.Millisecond {
		t.Errorf("http_service.server_uri.timeout = %v, want explicit and short (0 < t ≤ 250ms)", d)
	}
	if p := hs.GetPathPrefix(); !strings.HasPrefix(p, "/") || strings.HasSuffix(p, "/") || len(p) < 2 {
		t.Errorf("http_service.path_prefix = %q, want a path like /authz (flashgate's --http-authz-path-prefix)", p)
	}
	if hs.GetAuthorizationRequest().GetAllowedHeaders() != nil {
		t.Errorf("authorization_request.allowed_headers is deprecated: use ExtAuthz.allowed_headers")
	}
	if authz.GetGrpcService() != nil {
		t.Errorf("ext_authz sets both grpc_service and http_service")
	}

	// What a check carries: every header a rule of descriptors/flashsale.yaml
	// reads, x-forwarded-for for the per-IP rule, and nothing a client could
	// use to choose the method, path or denial status flashgate sees.
	allowed := authz.GetAllowedHeaders()
	for _, h := range []string{"x-uid", "x-device-fp", "x-forwarded-for"} {
		if !matchesList(t, allowed, h) {
			t.Errorf("allowed_headers does not pass %s to flashgate", h)
		}
	}
	for _, h := range spoofable {
		if matchesList(t, allowed, h) {
			t.Errorf("allowed_headers passes a client's %s to flashgate", h)
		}
	}

	resp := hs.GetAuthorizationResponse()
	denied := resp.GetAllowedClientHeaders()
	for _, h := range append([]string{"retry-after", "content-type"}, rateLimitFields...) {
		if !matchesList(t, denied, h) {
			t.Errorf("authorization_response.allowed_client_headers drops %s from a denial", h)
		}
	}
	onSuccess := resp.GetAllowedClientHeadersOnSuccess()
	for _, h := range rateLimitFields {
		if !matchesList(t, onSuccess, h) {
			t.Errorf("authorization_response.allowed_client_headers_on_success drops %s from an admission", h)
		}
	}
	// The app's own response framing must survive an admission.
	for _, h := range []string{"content-type", "content-length", "date", "server"} {
		if matchesList(t, onSuccess, h) {
			t.Errorf("allowed_client_headers_on_success would replace the app's %s with flashgate's", h)
		}
	}
}

// rateLimitFields are the response headers of every answer flashgate
// gives (the IETF fields and the x family).
var rateLimitFields = []string{"ratelimit", "ratelimit-policy", "x-ratelimit-limit", "x-ratelimit-remaining", "x-ratelimit-reset"}

// spoofable are the request headers by which the HTTP front-end learns the
// original method and path (from nginx, Caddy, Traefik) and the denial
// status: behind Envoy they must come from Envoy, never from a client.
var spoofable = []string{
	"x-original-uri", "x-original-method", "x-forwarded-method", "x-forwarded-uri",
	"x-forwarded-host", "x-forwarded-proto", "x-flashgate-deny-status",
}

// matchesList reports whether Envoy's ListStringMatcher l matches the
// lower-case header name h (a nil list matches nothing).
func matchesList(t *testing.T, l *matcherv3.ListStringMatcher, h string) bool {
	t.Helper()
	for _, p := range l.GetPatterns() {
		if matches(t, p, h) {
			return true
		}
	}
	return false
}

func matches(t *testing.T, m *matcherv3.StringMatcher, s string) bool {
	t.Helper()
	if m.GetIgnoreCase() {
		s = strings.ToLower(s)
	}
	fold := func(p string) string {
		if m.GetIgnoreCase() {
			return strings.ToLower(p)
		}
		return p
	}
	switch p := m.GetMatchPattern().(type) {
	case *matcherv3.StringMatcher_Exact:
		return s == fold(p.Exact)
	case *matcherv3.StringMatcher_Prefix:
		return strings.HasPrefix(s, fold(p.Prefix))
	case *matcherv3.StringMatcher_Suffix:
		return strings.HasSuffix(s, fold(p.Suffix))
	case *matcherv3.StringMatcher_Contains:
		return strings.Contains(s, fold(p.Contains))
	case *matcherv3.StringMatcher_SafeRegex:
		re, err := regexp.Compile("^(?:" + p.SafeRegex.GetRegex() + ")$")
		if err != nil {
			t.Fatalf("safe_regex %q: %v", p.SafeRegex.GetRegex(), err)
		}
		return re.MatchString(s)
	}
	t.Fatalf("string matcher %v: not understood by this test", m)
	return false
}

// TestHTTPServiceSpoofableHeadersCaught proves the header check itself: a
// pattern that lets a client's x-original-uri through is reported.
func TestHTTPServiceSpoofableHeadersCaught(t *testing.T) {
	l := &matcherv3.ListStringMatcher{Patterns: []*matcherv3.StringMatcher{
		{MatchPattern: &matcherv3.StringMatcher_Prefix{Prefix: "X-Original"}, IgnoreCase: true},
	}}
	if !matchesList(t, l, "x-original-uri") {
		t.Fatalf("prefix X-Original (ignore_case) does not match x-original-uri")
	}
	if matchesList(t, nil, "x-uid") {
		t.Fatalf("a nil list matched")
	}
}
