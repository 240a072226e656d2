package proxy

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/flashgate/flashgate/internal/testing/proxytest"
)

// limit is what the stand-in authorizer admits per x-uid.
const limit = 5

// pathCase is how a proxy hands one spelling of a path to the front-end.
type pathCase struct {
	want    string // the URI the front-end sees
	refused bool   // answered 400 without a check
}

// proxies are the configurations run here, with what differs between them.
var proxies = []struct {
	name       string
	config     string
	start      starter
	denyStatus string               // the X-Flashgate-Deny-Status the front-end sees
	paths      map[string]pathCase  // spellings of paths and what the front-end sees
	severe     func(log string) int // log lines at warn level and above
}{
	{
		name: "nginx", config: nginxConf, start: proxytest.StartNginx, denyStatus: "403", severe: nginxSevere,
		// $uri: decoded, dot segments resolved, slashes merged.
		paths: map[string]pathCase{
			"/api/coupon/x?q=%0a":     {want: "/api/coupon/x?q=%0a"},
			"/api/%63oupon/x":         {want: "/api/coupon/x"},
			"//api//coupon/x":         {want: "/api/coupon/x"},
			"/a/../api/coupon/./x":    {want: "/api/coupon/x"},
			"/api/%2e%2e/api/coupon/": {want: "/api/coupon/"},
			"/api/coupon/a%0d%0ab":    {refused: true},
			"/api/coupon/a%09b":       {refused: true},
		},
	},
	{
		name: "caddy", config: caddyfile, start: proxytest.StartCaddy, denyStatus: "", severe: caddySevere,
		// The decoded path; paths not in normal form are refused.
		paths: map[string]pathCase{
			"/api/coupon/x?q=%0a":     {want: "/api/coupon/x?q=%0a"},
			"/api/%63oupon/x":         {want: "/api/coupon/x?"},
			"//api//coupon/x":         {refused: true},
			"/a/../api/coupon/x":      {refused: true},
			"/api/coupon/./x":         {refused: true},
			"/api/%2e%2e/api/coupon/": {refused: true},
			"/api/x%2F%2Fcoupon/":     {refused: true},
		},
	},
}

// TestProxies runs each shipped configuration in its proxy between the
// stand-in front-end and the upstream.
func TestProxies(t *testing.T) {
	for _, px := range proxies {
		t.Run(px.name, func(t *testing.T) {
			t.Run("limits", func(t *testing.T) { checkLimits(t, newRig(t, px.start, px.config)) })
			t.Run("spoofed headers", func(t *testing.T) { checkSpoofing(t, newRig(t, px.start, px.config), px.denyStatus) })
			t.Run("paths", func(t *testing.T) { checkPaths(t, newRig(t, px.start, px.config), px.paths) })
			t.Run("fail closed", func(t *testing.T) { checkFailClosed(t, newRig(t, px.start, px.config)) })
		})
	}
}

// TestDenialFloodLogsNothing: a flood of denials writes no log line at
// warn level or above, and far fewer lines than denials at any level
// (nginx: a denial is a 403 on the wire, which auth_request handles
// silently; Caddy passes flashgate's 429 on).
func TestDenialFloodLogsNothing(t *testing.T) {
	const n = 400
	for _, px := range proxies {
		t.Run(px.name, func(t *testing.T) {
			r := newRig(t, px.start, px.config)
			counts := flood(t, r.proxy.Addr(), "mallory", n, 4)
			if counts[http.StatusOK] != limit || counts[http.StatusTooManyRequests] != n-limit {
				t.Fatalf("flood answers %v, want %d × 200 and %d × 429", counts, limit, n-limit)
			}
			log := r.proxy.ErrorLog()
			if bad := px.severe(log); bad > 0 {
				t.Errorf("%d log lines at warn or above after %d denials:\n%s", bad, n-limit, log)
			}
			if lines := strings.Count(log, "\n"); lines > n/10 {
				t.Errorf("%d log lines after %d denials, want far fewer than one each:\n%s", lines, n-limit, log)
			}
		})
	}
}

// rig is one proxy between a client, the stand-in authorizer and the app.
type rig struct {
	proxy    *proxytest.Proxy
	authz    *proxytest.Authorizer
	upstream *proxytest.Upstream
}

type starter func(testing.TB, proxytest.Options) *proxytest.Proxy

func newRig(t *testing.T, start starter, config string) *rig {
	t.Helper()
	a := proxytest.StartAuthorizer(t, limit)
	u := proxytest.StartUpstream(t)
	p := start(t, proxytest.Options{Config: config, Authz: a.Addr(), Upstream: u.Addr()})
	return &rig{proxy: p, authz: a, upstream: u}
}

// answer is one response as the client saw it.
type answer struct {
	status int
	header http.Header
	body   string
}

// get sends GET target (sent as is: no cleaning or escaping) with the
// headers given as "Name: value", over a fresh connection.
func get(t *testing.T, addr, target string, headers ...string) answer {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	var b strings.Builder
	fmt.Fprintf(&b, "GET %s HTTP/1.1\r\nHost: shop.example\r\nConnection: close\r\n", target)
	for _, h := range headers {
		b.WriteString(h + "\r\n")
	}
	b.WriteString("\r\n")
	if _, err := io.WriteString(c, b.String()); err != nil {
		t.Fatalf("write: %v", err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("GET %q: %v", target, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %q: read body: %v", target, err)
	}
	return answer{status: resp.StatusCode, header: resp.Header, body: string(body)}
}

// fromUpstream reports whether the app answered (rather than the proxy).
func (a answer) fromUpstream() bool { return a.header.Get(proxytest.UpstreamHeader) == "1" }

func (a answer) String() string { return fmt.Sprintf("%d %v %q", a.status, a.header, a.body) }

// checkLimits: one x-uid gets limit admissions from the app, each carrying
// the authorizer's fields, then 429s with Retry-After, the fields and a
// problem body that never reach the app; another x-uid is unaffected; a
// request no rule limits gets no (empty) fields.
func checkLimits(t *testing.T, r *rig) {
	t.Helper()
	for i := 1; i <= limit; i++ {
		a := get(t, r.proxy.Addr(), "/api/coupon/claim", "x-uid: alice")
		if a.status != http.StatusOK || !a.fromUpstream() {
			t.Fatalf("request %d: %v, want 200 from the app", i, a)
		}
		want := map[string]string{
			"RateLimit":             fmt.Sprintf(`"%s";r=%d;t=%d`, proxytest.AuthzPolicy, limit-i, proxytest.AuthzWindow),
			"RateLimit-Policy":      fmt.Sprintf(`"%s";q=%d;w=%d`, proxytest.AuthzPolicy, limit, proxytest.AuthzWindow),
			"X-RateLimit-Limit":     strconv.Itoa(limit),
			"X-RateLimit-Remaining": strconv.Itoa(limit - i),
		}
		for k, v := range want {
			if got := a.header.Values(k); len(got) != 1 || got[0] != v {
				t.Errorf("request %d: %s = %q, want [%q]", i, k, got, v)
			}
		}
		if got := a.header.Values("Retry-After"); len(got) > 0 {
			t.Errorf("request %d: admitted with Retry-After %q", i, got)
		}
	}
	for i := 0; i < 2; i++ {
		a := get(t, r.proxy.Addr(), "/api/coupon/claim", "x-uid: alice")
		checkDenial(t, a)
	}
	if n := r.upstream.Count("alice"); n != limit {
		t.Errorf("the app saw %d of alice's requests, want %d", n, limit)
	}
	if a := get(t, r.proxy.Addr(), "/api/coupon/claim", "x-uid: bob"); a.status != http.StatusOK || !a.fromUpstream() {
		t.Errorf("bob: %v, want 200 from the app", a)
	}
	a := get(t, r.proxy.Addr(), "/api/coupon/claim")
	if a.status != http.StatusOK || !a.fromUpstream() {
		t.Errorf("no x-uid: %v, want 200 from the app", a)
	}
	for _, k := range []string{"RateLimit", "RateLimit-Policy", "X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset"} {
		if _, ok := a.header[http.CanonicalHeaderKey(k)]; ok {
			t.Errorf("no x-uid: the answer has %s %q though flashgate sent none", k, a.header.Values(k))
		}
	}
}

// checkDenial asserts a denial as the client must see it: 429, the
// authorizer's fields once each, and an RFC 9457 problem body naming the
// policy.
func checkDenial(t *testing.T, a answer) {
	t.Helper()
	if a.status != http.StatusTooManyRequests || a.fromUpstream() {
		t.Fatalf("denial: %v, want 429 from the proxy", a)
	}
	want := map[string]string{
		"Retry-After":           strconv.Itoa(proxytest.AuthzRetryAfter),
		"RateLimit":             fmt.Sprintf(`"%s";r=0;t=%d`, proxytest.AuthzPolicy, proxytest.AuthzRetryAfter),
		"RateLimit-Policy":      fmt.Sprintf(`"%s";q=%d;w=%d`, proxytest.AuthzPolicy, limit, proxytest.AuthzWindow),
		"X-RateLimit-Limit":     strconv.Itoa(limit),
		"X-RateLimit-Remaining": "0",
		"X-RateLimit-Reset":     strconv.Itoa(proxytest.AuthzRetryAfter),
		"Content-Type":          "application/problem+json",
	}
	for k, v := range want {
		if got := a.header.Values(k); len(got) != 1 || got[0] != v {
			t.Errorf("denial: %s = %q, want [%q]", k, got, v)
		}
	}
	var problem struct {
		Type     string   `json:"type"`
		Title    string   `json:"title"`
		Status   int      `json:"status"`
		Violated []string `json:"violated-policies"`
	}
	if err := json.Unmarshal([]byte(a.body), &problem); err != nil {
		t.Fatalf("denial body %q: %v", a.body, err)
	}
	if problem.Type != "https://iana.org/assignments/http-problem-types#quota-exceeded" || problem.Status != http.StatusTooManyRequests ||
		problem.Title == "" || len(problem.Violated) != 1 || problem.Violated[0] != proxytest.AuthzPolicy {
		t.Errorf("denial body %q: want the quota-exceeded problem, status 429, violated-policies [%q]", a.body, proxytest.AuthzPolicy)
	}
}

// checkSpoofing: a client's copies of the headers the front-end reads the
// original request from never reach it; the check describes the request
// the proxy received.
func checkSpoofing(t *testing.T, r *rig, wantDenyStatus string) {
	t.Helper()
	a := get(t, r.proxy.Addr(), "/api/coupon/claim?x=1", "x-uid: carol",
		"X-Original-URI: /spoofed", "X-Original-Method: DELETE", "X-Flashgate-Deny-Status: 401",
		"X-Forwarded-Uri: /spoofed-too", "X-Forwarded-Method: PUT", "X-Forwarded-Host: evil.example",
		"X-Forwarded-For: 203.0.113.9")
	if a.status != http.StatusOK {
		t.Fatalf("%v, want 200", a)
	}
	c := lastCheck(t, r.authz)
	if c.Method != http.MethodGet || c.URI != "/api/coupon/claim?x=1" {
		t.Errorf("the front-end saw %s %s, want GET /api/coupon/claim?x=1", c.Method, c.URI)
	}
	if got := c.Header.Values("X-Flashgate-Deny-Status"); strings.Join(got, ",") != wantDenyStatus {
		t.Errorf("X-Flashgate-Deny-Status %q reached the front-end, want %q", got, wantDenyStatus)
	}
	if got := c.Header.Values("X-Forwarded-Host"); len(got) != 1 || got[0] != "shop.example" {
		t.Errorf("X-Forwarded-Host %q reached the front-end, want [shop.example]", got)
	}
	// The client's X-Forwarded-For may stay to the left; the proxy's peer
	// is last, where trusted_hops: 1 reads it.
	xff := strings.Split(strings.Join(c.Header.Values("X-Forwarded-For"), ","), ",")
	if last := strings.TrimSpace(xff[len(xff)-1]); last != "127.0.0.1" {
		t.Errorf("X-Forwarded-For %q ends with %q, want the proxy's peer 127.0.0.1", c.Header.Values("X-Forwarded-For"), last)
	}
}

// checkPaths: spellings of a path reach the front-end in normal form, or
// are refused before a check (refused: true); none reaches the app unchecked.
func checkPaths(t *testing.T, r *rig, cases map[string]pathCase) {
	t.Helper()
	for target, tc := range cases {
		before, beforeApp := len(r.authz.Checks()), len(r.upstream.Requests())
		a := get(t, r.proxy.Addr(), target, "x-uid: dave-"+strconv.Itoa(before))
		checks := r.authz.Checks()[before:]
		if tc.refused {
			if a.status != http.StatusBadRequest || len(checks) != 0 || len(r.upstream.Requests()) != beforeApp {
				t.Errorf("%q: %v after %d checks, want 400 before any check or app request", target, a, len(checks))
			}
			continue
		}
		if len(checks) != 1 || checks[0].URI != tc.want {
			t.Errorf("%q: the front-end saw %v, want one check of %q", target, checks, tc.want)
		}
	}
}

// checkFailClosed: with the front-end gone, requests get 503 with
// Retry-After: 1 and a problem body, and never reach the app.
func checkFailClosed(t *testing.T, r *rig) {
	t.Helper()
	r.authz.Close()
	before := len(r.upstream.Requests())
	for i := 0; i < 3; i++ {
		a := get(t, r.proxy.Addr(), "/api/coupon/claim", "x-uid: erin")
		if a.status != http.StatusServiceUnavailable || a.header.Get("Retry-After") != "1" ||
			a.header.Get("Content-Type") != "application/problem+json" || !strings.Contains(a.body, `"status":503`) {
			t.Errorf("front-end down: %v, want 503 with Retry-After: 1 and a problem body", a)
		}
	}
	if n := len(r.upstream.Requests()) - before; n != 0 {
		t.Errorf("front-end down: %d requests reached the app", n)
	}
}

// flood sends n requests for uid over keep-alive connections from
// workers goroutines and returns how many answers had each status.
func flood(t *testing.T, addr, uid string, n, workers int) map[int]int {
	t.Helper()
	type result struct {
		status int
		err    error
	}
	results := make(chan result, n)
	jobs := make(chan struct{}, n)
	for i := 0; i < n; i++ {
		jobs <- struct{}{}
	}
	close(jobs)
	for w := 0; w < workers; w++ {
		go func() {
			client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 1}}
			defer client.CloseIdleConnections()
			for range jobs {
				req, _ := http.NewRequest(http.MethodGet, "http://"+addr+"/api/coupon/claim", nil)
				req.Header.Set("x-uid", uid)
				resp, err := client.Do(req)
				if err != nil {
					results <- result{err: err}
					continue
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				results <- result{status: resp.StatusCode}
			}
		}()
	}
	counts := map[int]int{}
	for i := 0; i < n; i++ {
		r := <-results
		if r.err != nil {
			t.Fatalf("flood: %v", r.err)
		}
		counts[r.status]++
	}
	return counts
}

func lastCheck(t *testing.T, a *proxytest.Authorizer) proxytest.Request {
	t.Helper()
	cs := a.Checks()
	if len(cs) == 0 {
		t.Fatalf("the front-end saw no check")
	}
	return cs[len(cs)-1]
}
