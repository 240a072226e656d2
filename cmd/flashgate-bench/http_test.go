package main

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/flashgate/flashgate/httpauthz"
	"github.com/flashgate/flashgate/internal/testing/authtest"
)

// TestBenchHTTPAgainstLimiter: --api http sends each user's x-uid and IP
// (X-Forwarded-For) to an HTTP front-end, here on a fake ext_authz server
// that admits 5 per x-uid: 5 allowed per user, the rest denied.
func TestBenchHTTPAgainstLimiter(t *testing.T) {
	auth := authtest.NewLimitAuth(5)
	h, err := httpauthz.New(httpauthz.Options{Decider: auth})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(h)
	defer ts.Close()
	r := benchJSON(t, "--api", "http", "--addr", ts.URL, "--duration", "1s", "--concurrency", "4", "--users", "3", "--quiet", "--shape", "envoy")
	checkBenchInvariants(t, r)
	if r.API != "http" {
		t.Errorf("api %q, want http", r.API)
	}
	count := auth.Counts()
	want := 0
	for _, uid := range []string{"u0000000", "u0000001", "u0000002"} {
		want += min(count[uid], 5)
	}
	if r.Allowed != uint64(want) || r.Denied == 0 {
		t.Errorf("allowed %d, denied %d; want %d allowed (5 per user of %v) and the rest denied", r.Allowed, r.Denied, want, count)
	}
	last := auth.Last().GetAttributes().GetRequest().GetHttp()
	if last.GetMethod() != "POST" || last.GetPath() != "/api/coupon/1" || !strings.HasPrefix(last.GetHeaders()["x-forwarded-for"], "10.0.0.") ||
		last.GetHeaders()["cookie"] == "" {
		t.Errorf("last request %s %s, headers %v: want POST /api/coupon/1, the envoy shape, the user's X-Forwarded-For", last.GetMethod(), last.GetPath(), last.GetHeaders())
	}
}

// TestBenchHTTPNoop: against the do-nothing HTTP server everything is
// allowed; the table names the HTTP target.
func TestBenchHTTPNoop(t *testing.T) {
	addr := startReference(t, runNoopHTTPServer)
	r := benchJSON(t, "--api", "http", "--addr", addr, "--duration", "1s", "--concurrency", "2", "--users", "10", "--quiet")
	checkBenchInvariants(t, r)
	if r.Allowed != r.Requests {
		t.Errorf("allowed %d of %d", r.Allowed, r.Requests)
	}
	out, _, err := runArgs("--api", "http", "--addr", "http://"+addr, "--duration", "300ms", "--concurrency", "1", "--quiet")
	if err != nil || !strings.Contains(out, "over HTTP") {
		t.Errorf("table: %v\n%s", err, out)
	}
}

// TestNoopHTTPFields: with --ratelimit-fields the do-nothing HTTP server's
// 200 carries the five rate-limit fields of serve's admission, framed as
// serve frames it (Content-Length 0).
func TestNoopHTTPFields(t *testing.T) {
	addr := startReference(t, func(ctx context.Context, lis net.Listener, log io.Writer) error {
		return runNoopHTTP(ctx, lis, log, noopHTTPFields)
	})
	resp, err := http.Get("http://" + addr + "/api/coupon/1")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	for _, k := range []string{"Ratelimit-Policy", "Ratelimit", "X-Ratelimit-Limit", "X-Ratelimit-Remaining", "X-Ratelimit-Reset"} {
		if resp.Header.Get(k) == "" {
			t.Errorf("no %s in %v", k, resp.Header)
		}
	}
	if resp.StatusCode != http.StatusOK || resp.ContentLength != 0 {
		t.Errorf("%d, content-length %d; want 200, 0", resp.StatusCode, resp.ContentLength)
	}
}

// TestBenchHTTPErrors: a 5xx or 400 is an error by its status, not a
// denial; an unreachable front-end is reported before the run.
func TestBenchHTTPErrors(t *testing.T) {
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	defer ts.Close()
	out, _, err := runArgs("--api", "http", "--addr", ts.URL, "--duration", "300ms", "--concurrency", "1", "--quiet", "--json")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, `"errors_by_code":{"HTTP 503":`) || !strings.Contains(out, `"denied":0`) {
		t.Errorf("503s: %s, want errors by HTTP 503 and no denial", out)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	lis.Close()
	if _, _, err := runArgs("--api", "http", "--addr", addr, "--duration", "300ms"); err == nil || !strings.Contains(err.Error(), "cannot reach") {
		t.Errorf("unreachable: %v, want cannot reach", err)
	}
}
