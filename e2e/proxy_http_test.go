package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/flashgate/flashgate/enforce"
	"github.com/flashgate/flashgate/enforce/enforcetest"
	"github.com/flashgate/flashgate/internal/testing/proxytest"
	"github.com/flashgate/flashgate/window/redistest"
)

// The rules of testdata/proxy_http.yaml.
const (
	proxyUIDRule   = "coupon_per_uid"
	proxyUIDLimit  = 5
	proxyIPRule    = "per_ip"
	proxyIPLimit   = 3
	proxyLoginRule = "login"
	proxyWindowSec = 60
)

// TestHTTPFrontBehindProxies runs the shipped nginx and Caddy configs
// (proxy/) in real nginx and caddy processes in front of an upstream,
// asking a flashgate serve's HTTP front-end, on memory and on Redis. Through
// each: one x-uid gets 5 answers from the upstream, each carrying RateLimit
// and RateLimit-Policy, then 429s with Retry-After, those fields and a
// problem body, which the upstream never sees; other users are unaffected;
// the path's spellings count as one; the per-IP rule sees the client's
// address, not the proxy's; a client's X-Original-URI changes nothing; a
// denial writes no nginx error-log line. With flashgate stopped both fail
// closed: 503 with Retry-After: 1, and nothing reaches the upstream.
func TestHTTPFrontBehindProxies(t *testing.T) {
	proxies := []struct {
		name   string
		config string
		start  func(testing.TB, proxytest.Options) *proxytest.Proxy
	}{
		{"nginx", "../proxy/nginx/flashgate.conf", proxytest.StartNginx},
		{"caddy", "../proxy/caddy/Caddyfile", proxytest.StartCaddy},
	}
	for _, backend := range []string{"memory", "redis"} {
		for _, px := range proxies {
			t.Run(backend+"/"+px.name, func(t *testing.T) {
				args := []string{"--config", "testdata/proxy_http.yaml"}
				if backend == "redis" {
					rs := redistest.Start(t)
					args = append(args, "--backend", "redis", "--redis-addr", rs.Addr(), "--key-prefix", "e2eproxy")
				}
				fg, err := launchRetryWith(t, args, launchOpts{httpAuthz: true})
				if err != nil {
					t.Fatalf("start flashgate serve: %v", err)
				}
				up := proxytest.StartUpstream(t)
				p := px.start(t, proxytest.Options{Config: px.config, Authz: fg.HTTPAuthzAddr, Upstream: up.Addr()})
				checkBehindProxy(t, p, up)
				if p.Name() == "nginx" {
					if bad := nginxSevere.FindAllString(p.ErrorLog(), -1); len(bad) > 0 {
						t.Errorf("nginx logged %d lines at warn or above before flashgate stopped:\n%s", len(bad), p.ErrorLog())
					}
				}

				// flashgate gone: fail closed.
				fg.kill()
				before := len(up.Requests())
				a := viaProxy(t, p, "", "/api/coupon/x", "x-uid", freshUID("proxy-down"))
				if a.status != http.StatusServiceUnavailable || a.header.Get("Retry-After") != "1" || a.fromUpstream() {
					t.Errorf("flashgate stopped: %v, want 503 with Retry-After: 1 from %s", a, p.Name())
				}
				if n := len(up.Requests()) - before; n != 0 {
					t.Errorf("flashgate stopped: %d requests reached the upstream", n)
				}
			})
		}
	}
}

// nginxSevere matches nginx error-log lines at warn level and above.
var nginxSevere = regexp.MustCompile(`\[(warn|error|crit|alert|emerg)\]`)

func checkBehindProxy(t *testing.T, p *proxytest.Proxy, up *proxytest.Upstream) {
	t.Helper()
	alice := freshUID("alice")
	for i := 1; i <= proxyUIDLimit; i++ {
		a := viaProxy(t, p, "", "/api/coupon/claim", "x-uid", alice)
		if a.status != http.StatusOK || !a.fromUpstream() {
			t.Fatalf("request %d: %v, want 200 from the upstream", i, a)
		}
		rl := rateLimitFields(t, a)
		got, _ := rl.State(proxyUIDRule)
		if got.Remaining != int64(proxyUIDLimit-i) || got.T < 1 || got.T > proxyWindowSec {
			t.Errorf("request %d: RateLimit %q, want r=%d and 1 ≤ t ≤ %d", i, a.header.Get("RateLimit"), proxyUIDLimit-i, proxyWindowSec)
		}
	}
	for i := 0; i < 2; i++ {
		checkProxyDenial(t, viaProxy(t, p, "", "/api/coupon/claim", "x-uid", alice), proxyUIDRule)
	}
	// A client's own X-Original-URI (and deny status) changes nothing.
	checkProxyDenial(t, viaProxy(t, p, "", "/api/coupon/claim", "x-uid", alice,
		"X-Original-URI", "/somewhere/free", "X-Flashgate-Deny-Status", "401"), proxyUIDRule)
	if n := up.Count(alice); n != proxyUIDLimit {
		t.Errorf("the upstream saw %d of %s's requests, want %d", n, alice, proxyUIDLimit)
	}

	// Another user is unaffected.
	if a := viaProxy(t, p, "", "/api/coupon/claim", "x-uid", freshUID("bob")); a.status != http.StatusOK || !a.fromUpstream() {
		t.Errorf("another user: %v, want 200 from the upstream", a)
	}

	// /api/%63oupon/ is /api/coupon/: one budget.
	carol := freshUID("carol")
	for i := 1; i <= proxyUIDLimit; i++ {
		target := "/api/coupon/x"
		if i%2 == 1 {
			target = "/api/%63oupon/x"
		}
		if a := viaProxy(t, p, "", target, "x-uid", carol); a.status != http.StatusOK {
			t.Fatalf("%s request %d (%s): %v, want 200", carol, i, target, a)
		}
	}
	checkProxyDenial(t, viaProxy(t, p, "", "/api/%63oupon/y", "x-uid", carol), proxyUIDRule)

	// A trailing slash is no way around an exact rule: the proxies pass it
	// on, and the rules match the canonical path.
	for _, target := range []string{"/api/login", "/api/login/"} {
		if a := viaProxy(t, p, "", target); a.status != http.StatusOK {
			t.Fatalf("%s: %v, want 200", target, a)
		}
	}
	checkProxyDenial(t, viaProxy(t, p, "", "/api/login/"), proxyLoginRule)

	// The per-IP rule counts the client's address (trusted_hops: 1 reads
	// what the proxy appended to X-Forwarded-For), not the proxy's.
	for i := 1; i <= proxyIPLimit; i++ {
		if a := viaProxy(t, p, "127.0.0.2", "/api/ip/x"); a.status != http.StatusOK {
			t.Fatalf("from 127.0.0.2, request %d: %v, want 200", i, a)
		}
	}
	checkProxyDenial(t, viaProxy(t, p, "127.0.0.2", "/api/ip/x", "X-Forwarded-For", "198.51.100.7"), proxyIPRule)
	if a := viaProxy(t, p, "127.0.0.3", "/api/ip/x"); a.status != http.StatusOK {
		t.Errorf("from 127.0.0.3: %v, want 200 (another client)", a)
	}
}

// checkProxyDenial asserts a denial as a client behind the proxy sees it:
// 429, Retry-After, RateLimit with the denying rule exhausted and t no later
// than Retry-After, RateLimit-Policy, and an RFC 9457 problem naming rule.
func checkProxyDenial(t *testing.T, a proxyAnswer, rule string) {
	t.Helper()
	if a.status != http.StatusTooManyRequests || a.fromUpstream() {
		t.Fatalf("want a 429 from the proxy, got %v", a)
	}
	retry, err := strconv.Atoi(a.header.Get("Retry-After"))
	if err != nil || retry < 1 || retry > proxyWindowSec {
		t.Errorf("Retry-After %q: want whole seconds in [1, %d]", a.header.Get("Retry-After"), proxyWindowSec)
	}
	rl := rateLimitFields(t, a)
	if got, ok := rl.State(rule); !ok || got.Remaining != 0 || got.T < 1 || got.T > int64(retry) {
		t.Errorf("RateLimit %q: want %q with r=0 and 1 ≤ t ≤ Retry-After (%d)", a.header.Get("RateLimit"), rule, retry)
	}
	// nginx writes the problem itself from the fields it copied (it cannot
	// pass flashgate's body through auth_request): the RFC 9457 members,
	// not the older error/rule/retry_after_ms that flashgate adds.
	if ct := a.header.Get("Content-Type"); ct != enforce.ProblemContentType {
		t.Errorf("Content-Type %q, want %s", ct, enforce.ProblemContentType)
	}
	var problem struct {
		Type     string   `json:"type"`
		Status   int      `json:"status"`
		Violated []string `json:"violated-policies"`
	}
	if err := json.Unmarshal([]byte(a.body), &problem); err != nil {
		t.Fatalf("problem body %q: %v", a.body, err)
	}
	if problem.Type != enforce.ProblemType || problem.Status != http.StatusTooManyRequests || !slices.Contains(problem.Violated, rule) {
		t.Errorf("problem body %q: want %s, status 429, violated-policies with %q", a.body, enforce.ProblemType, rule)
	}
}

// rateLimitFields reads RateLimit and RateLimit-Policy with enforcetest's
// strict RFC 8941 reader (every RateLimit item names its policy, r ≤ q) and
// fails unless both are there.
func rateLimitFields(t *testing.T, a proxyAnswer) enforcetest.Got {
	t.Helper()
	got := enforcetest.ReadHeaders(t, a.header)
	if len(got.Policies) == 0 || len(got.States) == 0 {
		t.Fatalf("%v: want RateLimit-Policy and RateLimit", a)
	}
	return got
}

// proxyAnswer is one response as a client of the proxy saw it.
type proxyAnswer struct {
	status int
	header http.Header
	body   string
}

func (a proxyAnswer) fromUpstream() bool { return a.header.Get(proxytest.UpstreamHeader) == "1" }

func (a proxyAnswer) String() string { return fmt.Sprintf("%d %v %q", a.status, a.header, a.body) }

// viaProxy sends GET target (its escaping kept) to the proxy, from the
// loopback address from ("" for any), with headers (name, value pairs),
// on a connection of its own.
func viaProxy(t *testing.T, p *proxytest.Proxy, from, target string, headers ...string) proxyAnswer {
	t.Helper()
	d := &net.Dialer{Timeout: 5 * time.Second}
	if from != "" {
		d.LocalAddr = &net.TCPAddr{IP: net.ParseIP(from)}
	}
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DialContext: d.DialContext, DisableKeepAlives: true}}
	req, err := http.NewRequest(http.MethodGet, p.URL()+target, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := req.URL.RequestURI(); got != target {
		t.Fatalf("the client would send %q for %q", got, target)
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Add(headers[i], headers[i+1])
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("GET %s via %s: %v", target, p.Name(), err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s via %s: %v", target, p.Name(), err)
	}
	return proxyAnswer{status: resp.StatusCode, header: resp.Header, body: string(body)}
}
