package httpauthz

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"

	"github.com/flashgate/flashgate/descriptors"
)

// TestWithStatusMember: a JSON object's top-level numeric "status" member
// follows the status sent, and a top-level "title" that was the old
// status's reason phrase becomes the new one's; the rest byte for byte;
// anything else is left alone.
func TestWithStatusMember(t *testing.T) {
	tests := map[string]struct{ in, want string }{
		"problem": {
			`{"type":"https://iana.org/assignments/http-problem-types#quota-exceeded","title":"Too Many Requests","status":429,"violated-policies":["r"],"error":"too_many_requests","rule":"r","retry_after_ms":900}`,
			`{"type":"https://iana.org/assignments/http-problem-types#quota-exceeded","title":"Forbidden","status":403,"violated-policies":["r"],"error":"too_many_requests","rule":"r","retry_after_ms":900}`,
		},
		"title after status":    {`{"status":429, "title" : "Too Many Requests","x":1}`, `{"status":403, "title" : "Forbidden","x":1}`},
		"a title of its own":    {`{"title":"Slow down","status":429}`, `{"title":"Slow down","status":403}`},
		"title without status":  {`{"title":"Too Many Requests"}`, `{"title":"Too Many Requests"}`},
		"nested title":          {`{"d":{"title":"Too Many Requests"},"status":429}`, `{"d":{"title":"Too Many Requests"},"status":403}`},
		"spaced":                {"{ \"a\" : [1,{\"status\":429}] ,\n \"status\" :\t429 }", "{ \"a\" : [1,{\"status\":429}] ,\n \"status\" :\t403 }"},
		"status last":           {`{"x":{"status":1},"status":429}`, `{"x":{"status":1},"status":403}`},
		"old body, no status":   {`{"error":"too_many_requests","rule":"r","retry_after_ms":900}`, `{"error":"too_many_requests","rule":"r","retry_after_ms":900}`},
		"nested only":           {`{"detail":{"status":429}}`, `{"detail":{"status":429}}`},
		"status not a number":   {`{"status":"429"}`, `{"status":"429"}`},
		"not an object":         {`[{"status":429}]`, `[{"status":429}]`},
		"not JSON":              {`status: 429`, `status: 429`},
		"broken before status":  {`{"a":,"status":429}`, `{"a":,"status":429}`},
		"escaped key elsewhere": {`{"st\"atus":1,"status":429}`, `{"st\"atus":1,"status":403}`},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if got := withStatusMember(tc.in, 429, 403); got != tc.want {
				t.Errorf("got  %s\nwant %s", got, tc.want)
			}
		})
	}
}

// fixedChecker answers every check with one response.
type fixedChecker struct{ resp *authv3.CheckResponse }

func (c fixedChecker) CheckAttributes(context.Context, descriptors.Request) (*authv3.CheckResponse, error) {
	return c.resp, nil
}

func denial(code typev3.StatusCode, contentType, body string, extra ...*corev3.HeaderValueOption) *authv3.CheckResponse {
	hs := append([]*corev3.HeaderValueOption{
		{Header: &corev3.HeaderValue{Key: "content-type", Value: contentType}},
		{Header: &corev3.HeaderValue{Key: "retry-after", Value: "2"}},
	}, extra...)
	return &authv3.CheckResponse{
		Status: &status.Status{Code: int32(codes.ResourceExhausted)},
		HttpResponse: &authv3.CheckResponse_DeniedResponse{DeniedResponse: &authv3.DeniedHttpResponse{
			Status: &typev3.HttpStatus{Code: code}, Headers: hs, Body: body,
		}},
	}
}

// TestDenialWritten: the problem+json body's status follows the deny
// status override, a non-JSON body is kept; a denial without a status (or
// with a 2xx) is 403; framing and pseudo-headers of the response are not
// copied; repeated and appended headers follow their action.
func TestDenialWritten(t *testing.T) {
	problem := `{"title":"Too Many Requests","status":429,"violated-policies":["r"]}`
	appendHdr := &corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: "x-note", Value: "b"}, AppendAction: corev3.HeaderValueOption_APPEND_IF_EXISTS_OR_ADD}
	tests := map[string]struct {
		resp        *authv3.CheckResponse
		denyStatus  string
		status      int
		body, xNote string
	}{
		"problem, overridden": {denial(429, "application/problem+json", problem), "403", 403, `{"title":"Forbidden","status":403,"violated-policies":["r"]}`, ""},
		"problem, as is":      {denial(429, "application/problem+json", problem), "", 429, problem, ""},
		"text body kept":      {denial(429, "text/plain", `"status":429`), "401", 401, `"status":429`, ""},
		"no status":           {denial(0, "text/plain", "no"), "", 403, "no", ""},
		"a 2xx denial":        {denial(200, "text/plain", "no"), "", 403, "no", ""},
		"a redirect denial":   {denial(302, "text/plain", "go"), "", 302, "go", ""},
		"framing dropped": {denial(429, "text/plain", "x",
			&corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: "content-length", Value: "999"}},
			&corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: "transfer-encoding", Value: "chunked"}},
			&corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: ":status", Value: "200"}},
			&corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: "x-note", Value: "a"}},
			appendHdr), "", 429, "x", "a,b"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			h, err := New(Options{Checker: fixedChecker{tc.resp}})
			if err != nil {
				t.Fatal(err)
			}
			ts := httptest.NewServer(h)
			defer ts.Close()
			req, _ := http.NewRequest("GET", ts.URL+"/x", nil)
			if tc.denyStatus != "" {
				req.Header.Set(HeaderDenyStatus, tc.denyStatus)
			}
			client := ts.Client()
			client.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
			resp, err := client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			body, err := io.ReadAll(resp.Body)
			if err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != tc.status || string(body) != tc.body {
				t.Errorf("%d %s, want %d %s", resp.StatusCode, body, tc.status, tc.body)
			}
			if resp.Header.Get("Retry-After") != "2" {
				t.Errorf("retry-after %q, want 2", resp.Header.Get("Retry-After"))
			}
			if resp.ContentLength != int64(len(tc.body)) || len(resp.TransferEncoding) > 0 || resp.Header.Get(":status") != "" {
				t.Errorf("content-length %d, transfer-encoding %v: the response's framing headers were copied", resp.ContentLength, resp.TransferEncoding)
			}
			if got := strings.Join(resp.Header.Values("X-Note"), ","); got != tc.xNote {
				t.Errorf("x-note %q, want %q", got, tc.xNote)
			}
		})
	}
}
