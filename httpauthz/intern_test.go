package httpauthz

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"google.golang.org/protobuf/proto"
)

// TestInternBounded: the table keeps at most maxInterned entries, no key
// longer than maxInternedLen, and answers every key right either way.
func TestInternBounded(t *testing.T) {
	var tab names
	for i := range 3 * maxInterned {
		k := "X-H" + strconv.Itoa(i)
		if got := tab.get(k, len(k), toLower); got != strings.ToLower(k) {
			t.Fatalf("get(%q) = %q", k, got)
		}
	}
	long := "X-" + strings.Repeat("L", maxInternedLen)
	var tab2 names
	if got := tab2.get(long, len(long), toLower); got != strings.ToLower(long) {
		t.Errorf("get(long) = %q", got)
	}
	if m := tab.m.Load(); m == nil || len(*m) != maxInterned {
		t.Errorf("table holds %d entries, want %d", len(*tab.m.Load()), maxInterned)
	}
	if tab2.m.Load() != nil {
		t.Error("a key longer than maxInternedLen was kept")
	}
}

// cloner is a Checker that keeps a copy of every request it is asked.
type cloner struct {
	mu   sync.Mutex
	reqs []*authv3.CheckRequest
}

func (c *cloner) Check(_ context.Context, req *authv3.CheckRequest) (*authv3.CheckResponse, error) {
	c.mu.Lock()
	c.reqs = append(c.reqs, proto.Clone(req).(*authv3.CheckRequest))
	c.mu.Unlock()
	return &authv3.CheckResponse{}, nil
}

// TestReusedRequestHoldsNothingOld: a check after another carries none of
// the first's headers or peer, whether the first was small or large.
func TestReusedRequestHoldsNothingOld(t *testing.T) {
	c := &cloner{}
	h, err := New(Options{Checker: c})
	if err != nil {
		t.Fatal(err)
	}
	first := newReq("GET", "http://a/one", "X-Tenant", "acme", "X-Uid", "a")
	big := newReq("GET", "http://a/big")
	for i := range 2 * maxPooledHeaders {
		big.Header.Set("X-B"+strconv.Itoa(i), "v")
	}
	second := newReq("GET", "http://a/two", "X-Uid", "b")
	second.RemoteAddr = "@"
	for _, r := range []*http.Request{first, big, second, first, second} {
		h.ServeHTTP(httptest.NewRecorder(), r)
	}
	for i, want := range []int{2, 2 * maxPooledHeaders, 1, 2, 1} {
		req := c.reqs[i]
		hs := req.GetAttributes().GetRequest().GetHttp().GetHeaders()
		if len(hs) != want+4 {
			t.Errorf("check %d: %d headers, want %d and the 4 pseudo-headers: %v", i+1, len(hs), want, hs)
		}
		if peer := req.GetAttributes().GetSource(); (peer == nil) != (i == 2 || i == 4) {
			t.Errorf("check %d: source %v", i+1, peer)
		}
	}
	if got := c.reqs[2].GetAttributes().GetRequest().GetHttp().GetHeaders()["x-uid"]; got != "b" {
		t.Errorf("x-uid %q, want b", got)
	}
}
