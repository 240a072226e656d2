package rlshttp

import (
	"context"
	"errors"
	"net/http/httptest"
	"strings"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// codeService answers every ShouldRateLimit with code, or fails with err.
type codeService struct {
	rlsv3.UnimplementedRateLimitServiceServer
	code rlsv3.RateLimitResponse_Code
	err  error
}

func (s codeService) ShouldRateLimit(context.Context, *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	return &rlsv3.RateLimitResponse{OverallCode: s.code}, s.err
}

// TestHandler: ratelimit's statuses for /healthcheck and
// /json (the real service's answers are TestBinaryAsRatelimit's).
func TestHandler(t *testing.T) {
	const req = `{"domain":"d","descriptors":[{"entries":[{"key":"k","value":"v"}]}]}`
	tests := map[string]struct {
		svc     codeService
		serving bool
		method  string
		path    string
		body    string
		code    int
		want    string
	}{
		"healthcheck serving":     {serving: true, method: "GET", path: "/healthcheck", code: 200, want: "OK"},
		"healthcheck not serving": {method: "GET", path: "/healthcheck", code: 500},
		"json ok":                 {svc: codeService{code: rlsv3.RateLimitResponse_OK}, method: "POST", path: "/json", body: req, code: 200, want: `"overallCode":"OK"`},
		"json over limit":         {svc: codeService{code: rlsv3.RateLimitResponse_OVER_LIMIT}, method: "POST", path: "/json", body: req, code: 429, want: `"overallCode":"OVER_LIMIT"`},
		"json unknown":            {svc: codeService{}, method: "POST", path: "/json", body: req, code: 500},
		"json bad body":           {method: "POST", path: "/json", body: `{"domain":1}`, code: 400},
		"json call fails":         {svc: codeService{err: errors.New("empty domain")}, method: "POST", path: "/json", body: req, code: 400},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			h := Handler(tc.svc, func() bool { return tc.serving })
			w := httptest.NewRecorder()
			h.ServeHTTP(w, httptest.NewRequest(tc.method, tc.path, strings.NewReader(tc.body)))
			if w.Code != tc.code || !strings.Contains(w.Body.String(), tc.want) {
				t.Errorf("%s %s: %d %q, want %d with %q", tc.method, tc.path, w.Code, w.Body.String(), tc.code, tc.want)
			}
			if tc.code != 500 && tc.path == "/json" && tc.code != 400 && w.Header().Get("Content-Type") != "application/json" {
				t.Errorf("Content-Type %q", w.Header().Get("Content-Type"))
			}
		})
	}
}
