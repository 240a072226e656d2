package extauthz

import (
	"fmt"
	"testing"

	"google.golang.org/protobuf/proto"
)

const bigLimitYAML = `
domain: big
sources:
  uid: {request_headers: {header_name: x-uid}}
descriptors:
  - key: uid
    name: big
    rate_limit: {requests: 3000, window: 1m}
`

// TestSharedResponsesStayPut: OK responses are shared between checks; an
// answer already handed out never changes, and remaining counts beyond the
// precomputed range are right too.
func TestSharedResponsesStayPut(t *testing.T) {
	e := newEnv(t, parse(t, bigLimitYAML), nil)
	r := req{path: "/", headers: uid("u")}
	first, err := e.srv.Check(t.Context(), r.proto())
	if err != nil {
		t.Fatal(err)
	}
	snapshot := proto.Clone(first)
	for i := 2; i <= 2100; i++ { // through and past maxCachedRemaining (1024)
		a := e.check(r)
		if want := fmt.Sprint(3000 - i); !a.allowed || a.headers["x-ratelimit-remaining"] != want {
			t.Fatalf("check %d: remaining %q, want %s", i, a.headers["x-ratelimit-remaining"], want)
		}
	}
	if !proto.Equal(first, snapshot) {
		t.Fatalf("a response handed out earlier changed:\nnow  %v\nwas  %v", first, snapshot)
	}
	// A second user with the same remaining count gets an equal answer.
	other, err := e.srv.Check(t.Context(), req{path: "/", headers: uid("v")}.proto())
	if err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(other, snapshot) {
		t.Fatalf("same remaining, different answer:\n%v\n%v", other, snapshot)
	}
}
