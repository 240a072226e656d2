package httpauthz

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
)

// newReq returns a server-side request for target with headers (name,
// value pairs; a name may repeat), from peer 192.0.2.7:5555.
func newReq(method, target string, headers ...string) *http.Request {
	r := httptest.NewRequest(method, target, nil)
	r.RemoteAddr = "192.0.2.7:5555"
	for i := 0; i+1 < len(headers); i += 2 {
		r.Header.Add(headers[i], headers[i+1])
	}
	return r
}

// TestOriginalRequest: method, path, authority and scheme come from the
// first source present: X-Original-* (nginx), X-Forwarded-* (Caddy,
// Traefik), else the request itself less the path prefix (Envoy).
func TestOriginalRequest(t *testing.T) {
	tests := map[string]struct {
		r                          *http.Request
		prefix                     string
		method, path, host, scheme string
	}{
		"the request itself (Envoy http_service)": {
			r:      newReq("POST", "http://shop.example/api/coupon/1?x=1"),
			method: "POST", path: "/api/coupon/1?x=1", host: "shop.example", scheme: "http",
		},
		"prefix stripped": {
			r: newReq("PUT", "http://a/authz/api/coupon/1"), prefix: "/authz",
			method: "PUT", path: "/api/coupon/1", host: "a", scheme: "http",
		},
		"prefix alone is /": {
			r: newReq("GET", "http://a/authz"), prefix: "/authz",
			method: "GET", path: "/", host: "a", scheme: "http",
		},
		"prefix before a query": {
			r: newReq("GET", "http://a/authz?q=1"), prefix: "/authz",
			method: "GET", path: "/?q=1", host: "a", scheme: "http",
		},
		"nginx: X-Original-*": {
			r: newReq("GET", "http://flashgate/auth",
				"X-Original-URI", "/api/coupon/7?a=b", "X-Original-Method", "DELETE"),
			prefix: "/authz", // not applied to a URI from a header
			method: "DELETE", path: "/api/coupon/7?a=b", host: "flashgate", scheme: "http",
		},
		"Caddy/Traefik: X-Forwarded-*": {
			r: newReq("GET", "http://flashgate/",
				"X-Forwarded-Method", "PATCH", "X-Forwarded-Uri", "/api/coupon/2",
				"X-Forwarded-Host", "shop.example", "X-Forwarded-Proto", "https"),
			method: "PATCH", path: "/api/coupon/2", host: "shop.example", scheme: "https",
		},
		"X-Original-* before X-Forwarded-*": {
			r: newReq("GET", "http://flashgate/",
				"X-Original-Method", "POST", "X-Forwarded-Method", "PATCH",
				"X-Original-URI", "/a", "X-Forwarded-Uri", "/b"),
			method: "POST", path: "/a", host: "flashgate", scheme: "http",
		},
		"each field from its own first source": {
			r:      newReq("GET", "http://flashgate/self", "X-Forwarded-Method", "PUT", "X-Original-URI", "/o"),
			method: "PUT", path: "/o", host: "flashgate", scheme: "http",
		},
		"absolute URI in a header": {
			r:      newReq("GET", "http://f/", "X-Forwarded-Uri", "HTTPS://shop.example:8443/api/x?y=1"),
			method: "GET", path: "/api/x?y=1", host: "f", scheme: "http",
		},
		"absolute URI without a path": {
			r:      newReq("GET", "http://f/", "X-Forwarded-Uri", "http://shop.example?y=1"),
			method: "GET", path: "/?y=1", host: "f", scheme: "http",
		},
		"forwarded host and proto: the first element": {
			r:      newReq("GET", "http://f/", "X-Forwarded-Host", "shop.example, proxy.internal", "X-Forwarded-Proto", "https,http"),
			method: "GET", path: "/", host: "shop.example", scheme: "https",
		},
		"spaces around header values": {
			r:      newReq("GET", "http://f/", "X-Original-Method", " GET ", "X-Original-URI", " /p "),
			method: "GET", path: "/p", host: "f", scheme: "http",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			a, err := readRequest(tc.r, tc.prefix)
			if err != nil {
				t.Fatal(err)
			}
			got := [4]string{a.Method(), a.Path(), a.Authority(), a.scheme}
			want := [4]string{tc.method, tc.path, tc.host, tc.scheme}
			if got != want {
				t.Errorf("method, path, host, scheme = %q, want %q", got, want)
			}
			hs := func(name string) string { v, _ := a.Header(name); return v }
			if hs(":method") != tc.method || hs(":path") != tc.path || hs(":authority") != tc.host || hs(":scheme") != tc.scheme {
				t.Errorf("pseudo-headers %q %q %q %q do not follow the checked request", hs(":method"), hs(":path"), hs(":authority"), hs(":scheme"))
			}
		})
	}
}

// TestRejected: requests that describe no usable original request are
// refused with their reason.
func TestRejected(t *testing.T) {
	tests := map[string]struct {
		r      *http.Request
		prefix string
		reason string
	}{
		"outside the prefix":            {newReq("GET", "http://a/other"), "/authz", ReasonOutsidePrefix},
		"prefix not at a / boundary":    {newReq("GET", "http://a/authzx/y"), "/authz", ReasonOutsidePrefix},
		"empty X-Original-URI":          {newReq("GET", "http://a/", "X-Original-URI", ""), "", ReasonBadURI},
		"relative URI":                  {newReq("GET", "http://a/", "X-Forwarded-Uri", "api/x"), "", ReasonBadURI},
		"asterisk":                      {newReq("GET", "http://a/", "X-Original-URI", "*"), "", ReasonBadURI},
		"another scheme":                {newReq("GET", "http://a/", "X-Original-URI", "ftp://h/x"), "", ReasonBadURI},
		"two X-Original-URI":            {newReq("GET", "http://a/", "X-Original-URI", "/a", "X-Original-URI", "/b"), "", ReasonBadURI},
		"method not a token":            {newReq("GET", "http://a/", "X-Original-Method", "GE T"), "", ReasonBadMethod},
		"empty method":                  {newReq("GET", "http://a/", "X-Forwarded-Method", ""), "", ReasonBadMethod},
		"method too long":               {newReq("GET", "http://a/", "X-Original-Method", strings.Repeat("G", 65)), "", ReasonBadMethod},
		"two methods":                   {newReq("GET", "http://a/", "X-Forwarded-Method", "GET", "X-Forwarded-Method", "PUT"), "", ReasonBadMethod},
		"headers over MaxHeaderBytes":   {newReq("GET", "http://a/", "X-Big", strings.Repeat("a", MaxHeaderBytes)), "", ReasonHeadersTooLarge},
		"too many headers for the cap":  {manyHeaders(MaxHeaderBytes/32 + 1), "", ReasonHeadersTooLarge},
		"URI counts toward the cap too": {newReq("GET", "http://a/"+strings.Repeat("p", MaxHeaderBytes)), "", ReasonHeadersTooLarge},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			_, err := readRequest(tc.r, tc.prefix)
			var rej *rejection
			if !errors.As(err, &rej) {
				t.Fatalf("error %v, want a rejection", err)
			}
			if rej.reason != tc.reason {
				t.Errorf("reason %q, want %q", rej.reason, tc.reason)
			}
		})
	}
}

// manyHeaders returns a request with n one-letter headers.
func manyHeaders(n int) *http.Request {
	r := newReq("GET", "http://a/")
	for i := range n {
		r.Header["X-H"+strconv.Itoa(i)] = []string{""}
	}
	return r
}

// TestHeaderMap: the headers as Envoy's headers map reads them: by
// lower-case name, repeated values joined by ",", invalid UTF-8 repaired,
// the pseudo-headers of the checked request; the peer as the source
// address.
func TestHeaderMap(t *testing.T) {
	r := newReq("GET", "http://a/p",
		"X-Uid", "alice", "X-Forwarded-For", "198.51.100.1", "X-Forwarded-For", "203.0.113.9",
		"X-Device-Fp", "fp\xff\xfe1", "X-Request-Id", "rid-1")
	r.Header["lowercase-already"] = []string{"v"}
	a, err := readRequest(r, "")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"x-uid": "alice", "x-forwarded-for": "198.51.100.1,203.0.113.9", "x-device-fp": "fp\uFFFD1",
		"x-request-id": "rid-1", "lowercase-already": "v",
		":method": "GET", ":path": "/p", ":authority": "a", ":scheme": "http",
	}
	for k, v := range want {
		if got, ok := a.Header(k); !ok || got != v {
			t.Errorf("header %s = %q (present %v), want %q", k, got, ok, v)
		}
	}
	for _, k := range []string{"x-absent", "host", ":status"} {
		if got, ok := a.Header(k); ok {
			t.Errorf("header %s = %q, want none", k, got)
		}
	}
	if got := a.PeerAddress(); got != "192.0.2.7" {
		t.Errorf("peer %q, want 192.0.2.7", got)
	}

	r.RemoteAddr = "@" // a unix socket's peer: no source address
	a, err = readRequest(r, "")
	if err != nil {
		t.Fatal(err)
	}
	if got := a.PeerAddress(); got != "" {
		t.Errorf("peer %q for a peer without an address, want none", got)
	}
}

// readRequest reads the checked request of r, prefix the normalized path
// prefix, as a Handler does.
func readRequest(r *http.Request, prefix string) (*attrs, error) {
	var a attrs
	if err := a.fill(r, prefix, &names{}); err != nil {
		return nil, err
	}
	return &a, nil
}

// TestNormalizePrefix: "" and "/" mean none; a trailing "/" is dropped; a
// prefix that is no path is refused.
func TestNormalizePrefix(t *testing.T) {
	for in, want := range map[string]string{"": "", "/": "", "/authz": "/authz", "/authz/": "/authz", "/a/b//": "/a/b"} {
		if got, err := NormalizePrefix(in); err != nil || got != want {
			t.Errorf("NormalizePrefix(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, bad := range []string{"authz", "/a?b", "/a b", "http://x/"} {
		if _, err := NormalizePrefix(bad); err == nil {
			t.Errorf("NormalizePrefix(%q) accepted", bad)
		}
	}
}
