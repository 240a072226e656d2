package extauthz

import (
	"context"
	"testing"
	"time"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"

	"github.com/flashgate/flashgate/internal/reqpath/reqpathtest"
	"github.com/flashgate/flashgate/window"
)

// grpcChecker sends checks to a Server of yaml through its own gRPC server
// (its codec included) as Envoy's CheckRequests.
func grpcChecker(t *testing.T, yaml string) func(path string) answer {
	t.Helper()
	e := newEnv(t, parse(t, yaml), nil)
	_, conn := serveBufconn(t, e.srv)
	client := authv3.NewAuthorizationClient(conn)
	return func(path string) answer {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		resp, err := client.Check(ctx, req{path: path}.proto())
		return read(t, resp, err)
	}
}

// TestPathSpellingsOverGRPC: every spelling of a path a rule holds counts
// in the rule's window, over ext_authz's gRPC server: after the path as
// written uses the one request, the spelling is denied by the rule; a
// path no rule holds is not.
func TestPathSpellingsOverGRPC(t *testing.T) {
	for _, tc := range reqpathtest.Cases {
		for _, s := range tc.Spellings {
			t.Run(tc.Rule+"/"+s.Form, func(t *testing.T) {
				check := grpcChecker(t, reqpathtest.Rules)
				if a := check(tc.First); !a.allowed {
					t.Fatalf("%s: denied, want the rule's one request admitted", tc.First)
				}
				a := check(s.Path)
				wantDenied(t, a, tc.Rule, 1)
			})
		}
	}
	for _, s := range reqpathtest.Outside {
		t.Run("outside/"+s.Form, func(t *testing.T) {
			check := grpcChecker(t, reqpathtest.Rules)
			for _, p := range []string{reqpathtest.Exact, "/api/coupon/x"} {
				if a := check(p); !a.allowed {
					t.Fatalf("%s: denied, want the rule's one request admitted", p)
				}
			}
			if a := check(s.Path); !a.allowed {
				t.Errorf("%s: denied, want admitted: no rule holds it", s.Path)
			}
		})
	}
}

// TestPathKeyedByCanonicalForm: a rule keyed by the path gives every
// spelling of one path one window, and LimitKey keys each spelling as the
// server does.
func TestPathKeyedByCanonicalForm(t *testing.T) {
	const yaml = `
domain: paths
descriptors:
  - key: path
    name: per_path
    rate_limit: {requests: 1, window: 1m}
`
	cfg := parse(t, yaml)
	want, _, err := cfg.LimitKey(window.Keys{}, "per_path", "/shop/item")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"/shop/item/", "//shop/./item", "/shop/%69tem", "/shop/item;v=1", "/shop/x/../item", "/shop%2Fitem"} {
		t.Run(p, func(t *testing.T) {
			check := grpcChecker(t, yaml)
			if a := check("/shop/item"); !a.allowed {
				t.Fatal("/shop/item: denied, want admitted")
			}
			wantDenied(t, check(p), "per_path", 1)
			if a := check("/shop/other"); !a.allowed {
				t.Error("/shop/other: denied, want a window of its own")
			}
			if got, _, err := cfg.LimitKey(window.Keys{}, "per_path", p); err != nil || got != want {
				t.Errorf("LimitKey(%q) = %q, %v; want %q, the key of /shop/item", p, got, err, want)
			}
		})
	}
}

// TestPathCaseInsensitive: with path_case: insensitive, a rule on a path
// holds it in any case; by default it does not.
func TestPathCaseInsensitive(t *testing.T) {
	rules := func(pathCase string) string {
		return "domain: paths\n" + pathCase + `
descriptors:
  - key: path
    value: /Api/Login
    name: login
    rate_limit: {requests: 1, window: 1m}
`
	}
	check := grpcChecker(t, rules("path_case: insensitive"))
	if a := check("/API/LOGIN/"); !a.allowed {
		t.Fatal("/API/LOGIN/: denied, want admitted")
	}
	wantDenied(t, check("/api/%6cogin"), "login", 1)

	check = grpcChecker(t, rules(""))
	if a := check("/Api/Login"); !a.allowed {
		t.Fatal("/Api/Login: denied, want admitted")
	}
	wantDenied(t, check("/Api/Login/"), "login", 1)
	if a := check("/api/login"); !a.allowed {
		t.Error("/api/login: denied, want admitted: paths are case-sensitive by default")
	}
}
