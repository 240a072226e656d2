package httpauthz

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/flashgate/flashgate/descriptors"
	"github.com/flashgate/flashgate/enforce"
	"github.com/flashgate/flashgate/window"
)

// fixedDecider answers every check with one answer, in families f.
type fixedDecider struct {
	a enforce.Answer
	f enforce.Families
}

func (d fixedDecider) Decide(_ context.Context, _ descriptors.Request, a *enforce.Answer) error {
	*a = d.a
	a.Policies, a.States = slices.Clone(d.a.Policies), slices.Clone(d.a.States)
	return nil
}

func (d fixedDecider) Headers() enforce.Families { return d.f }

// TestAnswerWritten: an answer is written with the header fields of the
// decider's families, each once, as enforce names them; a denial is 429
// with its problem body, or the deny status asked for, the body's status
// and title following it; an admission has no body; the framing is the
// server's (Content-Length, never chunked).
func TestAnswerWritten(t *testing.T) {
	p := enforce.NewPolicy("r", window.Limit{Requests: 5, Window: time.Second})
	denied := enforce.Answer{Policies: []*enforce.Policy{p}, States: []enforce.State{{Policy: p, T: 2}}, Binding: 0,
		Denied: true, RetryAfter: 1500 * time.Millisecond}
	shadow := enforce.Answer{Policies: []*enforce.Policy{p}, States: []enforce.State{{Policy: p, T: 1}}, Binding: 0, Shadow: true}
	problem := denied.Problem()
	tests := map[string]struct {
		a          enforce.Answer
		f          enforce.Families
		denyStatus string
		status     int
		body       string
		fields     []string
	}{
		"problem, as is": {denied, enforce.FamiliesBoth, "", 429, problem,
			[]string{"Retry-After", "Ratelimit-Policy", "Ratelimit", "X-Ratelimit-Limit", "X-Ratelimit-Remaining", "X-Ratelimit-Reset", "Content-Type"}},
		"problem, overridden": {denied, enforce.FamiliesBoth, "403", 403,
			strings.Replace(problem, `"title":"Too Many Requests","status":429`, `"title":"Forbidden","status":403`, 1),
			[]string{"Retry-After", "Ratelimit-Policy", "Ratelimit", "X-Ratelimit-Limit", "X-Ratelimit-Remaining", "X-Ratelimit-Reset", "Content-Type"}},
		"401, no families": {denied, enforce.FamiliesNone, "401", 401,
			strings.Replace(problem, `"title":"Too Many Requests","status":429`, `"title":"Unauthorized","status":401`, 1),
			[]string{"Retry-After", "Content-Type"}},
		"shadow admission": {shadow, enforce.FamiliesIETF, "403", 200, "", []string{"Ratelimit-Policy", "Ratelimit", "X-Ratelimit-Shadow"}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			h, err := New(Options{Decider: fixedDecider{tc.a, tc.f}})
			if err != nil {
				t.Fatal(err)
			}
			ts := httptest.NewServer(h)
			defer ts.Close()
			req, _ := http.NewRequest("GET", ts.URL+"/x", nil)
			if tc.denyStatus != "" {
				req.Header.Set(HeaderDenyStatus, tc.denyStatus)
			}
			resp, err := ts.Client().Do(req)
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
			want := map[string]string{}
			tc.a.Headers(tc.f, func(k, v string) { want[http.CanonicalHeaderKey(k)] = v })
			var got []string
			for k, vs := range resp.Header {
				if k == "Date" || k == "Content-Length" {
					continue
				}
				got = append(got, k)
				if len(vs) != 1 || vs[0] != want[k] {
					t.Errorf("%s: %q, want %q", k, vs, want[k])
				}
			}
			slices.Sort(got)
			wantNames := slices.Sorted(slices.Values(tc.fields))
			if !slices.Equal(got, wantNames) {
				t.Errorf("fields %q, want %q", got, wantNames)
			}
			if resp.ContentLength != int64(len(tc.body)) || len(resp.TransferEncoding) > 0 {
				t.Errorf("content-length %d, transfer-encoding %v, want %d, none", resp.ContentLength, resp.TransferEncoding, len(tc.body))
			}
		})
	}
}
