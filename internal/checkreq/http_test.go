package checkreq

import (
	"context"
	"net/netip"
	"testing"
	"time"
)

// TestHTTPVerdict: 2xx allowed; 400, 431 and 5xx a failed check; any
// other status a denial.
func TestHTTPVerdict(t *testing.T) {
	for status, want := range map[int]string{200: "allowed", 204: "allowed", 429: "denied", 403: "denied", 401: "denied", 302: "denied",
		400: "failed", 431: "failed", 500: "failed", 503: "failed"} {
		allowed, err := HTTPVerdict(status)
		got := "denied"
		switch {
		case err != nil:
			got = "failed"
		case allowed:
			got = "allowed"
		}
		if got != want {
			t.Errorf("HTTPVerdict(%d): %s, want %s", status, got, want)
		}
	}
}

// TestHTTPRequest: the request Envoy's http_service sends: method, path
// after the base, Host, the headers but the pseudo-headers.
func TestHTTPRequest(t *testing.T) {
	s := Spec{Method: "POST", Path: "/api/x?y=1", Host: "shop.example", IP: netip.MustParseAddr("192.0.2.1"),
		Headers: map[string]string{"x-uid": "alice", ":path": "/ignored"}}
	req, err := HTTPRequest(context.Background(), "http://127.0.0.1:9", s)
	if err != nil {
		t.Fatal(err)
	}
	if req.Method != "POST" || req.URL.String() != "http://127.0.0.1:9/api/x?y=1" || req.Host != "shop.example" {
		t.Errorf("%s %s Host %s", req.Method, req.URL, req.Host)
	}
	if req.Header.Get("X-Uid") != "alice" || len(req.Header) != 1 {
		t.Errorf("headers %v, want x-uid only", req.Header)
	}
	for addr, base := range map[string]string{"127.0.0.1:9": "http://127.0.0.1:9", "http://h:1/": "http://h:1", "unix:///tmp/s": "http://flashgate"} {
		if _, got, err := HTTPClient(addr, 1, time.Second); err != nil || got != base {
			t.Errorf("HTTPClient(%q): base %q, %v; want %q", addr, got, err, base)
		}
	}
	for _, bad := range []string{"", "https://h:1", "ftp://h"} {
		if _, _, err := HTTPClient(bad, 1, time.Second); err == nil {
			t.Errorf("HTTPClient(%q) accepted", bad)
		}
	}
}
