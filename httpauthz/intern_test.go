package httpauthz

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/flashgate/flashgate/descriptors"
	"github.com/flashgate/flashgate/enforce"
)

// TestInternBounded: the table keeps at most maxInterned entries, no key
// longer than maxInternedLen, and answers every key right either way.
func TestInternBounded(t *testing.T) {
	var tab names
	for i := range 3 * maxInterned {
		k := "x-h" + strconv.Itoa(i)
		if got := tab.get(k, len(k), http.CanonicalHeaderKey); got != http.CanonicalHeaderKey(k) {
			t.Fatalf("get(%q) = %q", k, got)
		}
	}
	long := "x-" + strings.Repeat("l", maxInternedLen)
	var tab2 names
	if got := tab2.get(long, len(long), http.CanonicalHeaderKey); got != http.CanonicalHeaderKey(long) {
		t.Errorf("get(long) = %q", got)
	}
	if m := tab.m.Load(); m == nil || len(*m) != maxInterned {
		t.Errorf("table holds %d entries, want %d", len(*tab.m.Load()), maxInterned)
	}
	if tab2.m.Load() != nil {
		t.Error("a key longer than maxInternedLen was kept")
	}
}

// seen is what a Decider read of one request.
type seen struct {
	uid, tenant, big, peer string
}

// reader is a Decider that keeps what it reads of every request it is
// asked, and admits it.
type reader struct {
	mu   sync.Mutex
	seen []seen
}

func (c *reader) Decide(_ context.Context, req descriptors.Request, _ *enforce.Answer) error {
	get := func(name string) string {
		v, ok := req.Header(name)
		if !ok {
			return "(none)"
		}
		return v
	}
	c.mu.Lock()
	c.seen = append(c.seen, seen{get("x-uid"), get("x-tenant"), get("x-b0"), req.PeerAddress()})
	c.mu.Unlock()
	return nil
}

func (c *reader) Headers() enforce.Families { return enforce.FamiliesBoth }

// TestReusedRequestHoldsNothingOld: a check after another carries none of
// the first's headers or peer, whether the first was small or large.
func TestReusedRequestHoldsNothingOld(t *testing.T) {
	c := &reader{}
	h, err := New(Options{Decider: c})
	if err != nil {
		t.Fatal(err)
	}
	first := newReq("GET", "http://a/one", "X-Tenant", "acme", "X-Uid", "a")
	big := newReq("GET", "http://a/big")
	for i := range 128 {
		big.Header.Set("X-B"+strconv.Itoa(i), "v")
	}
	second := newReq("GET", "http://a/two", "X-Uid", "b")
	second.RemoteAddr = "@"
	for _, r := range []*http.Request{first, big, second, first, second} {
		h.ServeHTTP(httptest.NewRecorder(), r)
	}
	none, peer := "(none)", "192.0.2.7"
	for i, want := range []seen{
		{"a", "acme", none, peer}, {none, none, "v", peer}, {"b", none, none, ""}, {"a", "acme", none, peer}, {"b", none, none, ""},
	} {
		if got := c.seen[i]; got != want {
			t.Errorf("check %d read %+v, want %+v", i+1, got, want)
		}
	}
}
