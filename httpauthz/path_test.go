package httpauthz_test

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/flashgate/flashgate/internal/reqpath/reqpathtest"
)

// pathStyles are the places the front-end reads a path from: the request
// line (less the path prefix, as Envoy's http_service sends it) and each
// proxy's header.
var pathStyles = []struct {
	name string
	ask  func(e *env, path string) reply
}{
	{"request line", func(e *env, p string) reply { return e.rawGet("/authz"+p, nil) }},
	{"X-Original-URI", func(e *env, p string) reply {
		return e.rawGet("/flashgate-auth", []string{"X-Original-URI: " + p, "X-Original-Method: GET"})
	}},
	{"X-Forwarded-Uri", func(e *env, p string) reply {
		return e.rawGet("/", []string{"X-Forwarded-Uri: " + p, "X-Forwarded-Method: GET"})
	}},
}

// rawGet sends "GET target" with headers over a connection of its own,
// byte for byte as written (no client cleans the target), and reads the
// answer.
func (e *env) rawGet(target string, headers []string) reply {
	e.t.Helper()
	addr := strings.TrimPrefix(e.url, "http://")
	conn, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		e.t.Fatal(err)
	}
	defer conn.Close()
	if err := conn.SetDeadline(time.Now().Add(10 * time.Second)); err != nil {
		e.t.Fatal(err)
	}
	msg := "GET " + target + " HTTP/1.1\r\nHost: shop.example\r\nConnection: close\r\n"
	for _, h := range headers {
		msg += h + "\r\n"
	}
	if _, err := io.WriteString(conn, msg+"\r\n"); err != nil {
		e.t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		e.t.Fatalf("GET %s: %v", target, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		e.t.Fatal(err)
	}
	return reply{status: resp.StatusCode, header: resp.Header, body: string(b)}
}

// TestPathSpellingsOverHTTP: through each place the HTTP front-end reads
// a path, every spelling of a path a rule holds counts in the rule's
// window: after the path as written uses the one request, the spelling is
// answered 429 by the rule; a path no rule holds is answered 200.
func TestPathSpellingsOverHTTP(t *testing.T) {
	for _, st := range pathStyles {
		t.Run(st.name, func(t *testing.T) {
			for _, tc := range reqpathtest.Cases {
				for _, s := range tc.Spellings {
					t.Run(tc.Rule+"/"+s.Form, func(t *testing.T) {
						e := newEnv(t, reqpathtest.Rules, "/authz", nil)
						if r := st.ask(e, tc.First); r.status != http.StatusOK {
							t.Fatalf("%s: %s, want 200", tc.First, r)
						}
						r := st.ask(e, s.Path)
						if r.status != http.StatusTooManyRequests || !strings.Contains(r.body, `"`+tc.Rule+`"`) {
							t.Errorf("%s: %s, want 429 by %s", s.Path, r, tc.Rule)
						}
					})
				}
			}
			for _, s := range reqpathtest.Outside {
				t.Run("outside/"+s.Form, func(t *testing.T) {
					e := newEnv(t, reqpathtest.Rules, "/authz", nil)
					for _, p := range []string{reqpathtest.Exact, "/api/coupon/x"} {
						if r := st.ask(e, p); r.status != http.StatusOK {
							t.Fatalf("%s: %s, want 200", p, r)
						}
					}
					if r := st.ask(e, s.Path); r.status != http.StatusOK {
						t.Errorf("%s: %s, want 200: no rule holds it", s.Path, r)
					}
				})
			}
		})
	}
}
