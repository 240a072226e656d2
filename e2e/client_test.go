package e2e

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/codes"

	"github.com/flashgate/flashgate/descriptors"
	"github.com/flashgate/flashgate/enforce"
	"github.com/flashgate/flashgate/enforce/enforcetest"
)

// req describes the HTTP request an Envoy ext_authz filter asks about.
type req struct {
	Method  string            // default GET
	Path    string            // with the query string, as Envoy sends it
	Host    string            // default shop.example
	Headers map[string]string // lower-case names
	IP      string            // source.address; "" leaves source unset
	ID      string            // request id; default random
}

// newID returns a random 128-bit request id in hex.
func newID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// coupon is a request for /api/coupon/x from ip carrying x-uid: uid (none
// when uid is "").
func coupon(uid, ip string) req {
	r := req{Path: "/api/coupon/x", IP: ip}
	if uid != "" {
		r.Headers = map[string]string{"x-uid": uid}
	}
	return r
}

// CheckRequest builds the CheckRequest Envoy would send for r, pseudo
// headers included.
func (r req) CheckRequest() *authv3.CheckRequest {
	method := r.Method
	if method == "" {
		method = "GET"
	}
	host := r.Host
	if host == "" {
		host = "shop.example"
	}
	id := r.ID
	if id == "" {
		id = newID()
	}
	headers := make(map[string]string, len(r.Headers)+4)
	headers[":authority"] = host
	headers[":method"] = method
	headers[":path"] = r.Path
	headers["x-request-id"] = id
	for k, v := range r.Headers {
		headers[k] = v
	}
	a := &authv3.AttributeContext{
		Destination: &authv3.AttributeContext_Peer{Address: sockAddr("127.0.0.1", 8080)},
		Request: &authv3.AttributeContext_Request{Http: &authv3.AttributeContext_HttpRequest{
			Id: id, Method: method, Path: r.Path, Host: host, Scheme: "http",
			Protocol: "HTTP/1.1", Headers: headers,
		}},
	}
	if r.IP != "" {
		a.Source = &authv3.AttributeContext_Peer{Address: sockAddr(r.IP, 40000)}
	}
	return &authv3.CheckRequest{Attributes: a}
}

func sockAddr(ip string, port uint32) *corev3.Address {
	return &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
		Protocol: corev3.SocketAddress_TCP, Address: ip,
		PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: port},
	}}}
}

// verdict is an answer classified.
type verdict int

const (
	vError   verdict = iota // a gRPC error, or a response outside the contract
	vAllowed                // status OK
	vDenied                 // RESOURCE_EXHAUSTED
)

func (v verdict) String() string {
	return [...]string{"error", "allowed", "denied"}[v]
}

// answer is one Check call's outcome. The server decided it somewhere
// between Sent and Sent+Latency.
type answer struct {
	Resp    *authv3.CheckResponse
	Err     error
	Sent    time.Time // just before the call
	Latency time.Duration
	Proc    int // the sidecar that answered, where a fleet test records it
}

// Replied is when the answer was back: the decision was made before it.
func (a answer) Replied() time.Time { return a.Sent.Add(a.Latency) }

// Verdict classifies a.
func (a answer) Verdict() verdict {
	if a.Err != nil || a.Resp == nil {
		return vError
	}
	switch codes.Code(a.Resp.GetStatus().GetCode()) {
	case codes.OK:
		return vAllowed
	case codes.ResourceExhausted:
		return vDenied
	}
	return vError
}

// Headers returns the response headers Envoy would add to the client's
// response (allowed: response_headers_to_add; denied: the denied headers).
func (a answer) Headers() map[string]string {
	h := map[string]string{}
	if a.Resp == nil {
		return h
	}
	var list []*corev3.HeaderValueOption
	if ok := a.Resp.GetOkResponse(); ok != nil {
		list = ok.GetResponseHeadersToAdd()
	} else if d := a.Resp.GetDeniedResponse(); d != nil {
		list = d.GetHeaders()
	}
	for _, hv := range list {
		v := hv.GetHeader().GetValue()
		if v == "" && len(hv.GetHeader().GetRawValue()) > 0 {
			v = string(hv.GetHeader().GetRawValue())
		}
		h[strings.ToLower(hv.GetHeader().GetKey())] = v
	}
	return h
}

func (a answer) String() string {
	if a.Err != nil {
		return fmt.Sprintf("gRPC error %v after %s", a.Err, a.Latency)
	}
	return fmt.Sprintf("%s %v headers %v after %s", a.Verdict(), a.Resp.GetStatus(), a.Headers(), a.Latency)
}

// Check sends one Check with a 10 s deadline.
func (p *proc) Check(r req) answer {
	return p.CheckRaw(r.CheckRequest())
}

// CheckRaw sends one prepared CheckRequest with a 10 s deadline.
func (p *proc) CheckRaw(cr *authv3.CheckRequest) answer {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	start := time.Now()
	resp, err := p.Auth.Check(ctx, cr)
	return answer{Resp: resp, Err: err, Sent: start, Latency: time.Since(start)}
}

// mustAllowed fails unless a admits, with x-ratelimit-limit wantLimit
// (unless 0) and a sane x-ratelimit-remaining.
func mustAllowed(t testing.TB, a answer, wantLimit int, what string) {
	t.Helper()
	if a.Verdict() != vAllowed {
		t.Errorf("%s: want allowed, got %s", what, a)
		return
	}
	if wantLimit == 0 {
		return
	}
	h := a.Headers()
	if h["x-ratelimit-limit"] != strconv.Itoa(wantLimit) {
		t.Errorf("%s: allowed with x-ratelimit-limit %q, want %d (headers %v)", what, h["x-ratelimit-limit"], wantLimit, h)
	}
	if rem, err := strconv.Atoi(h["x-ratelimit-remaining"]); err != nil || rem < 0 || rem >= wantLimit {
		t.Errorf("%s: allowed with x-ratelimit-remaining %q, want 0..%d", what, h["x-ratelimit-remaining"], wantLimit-1)
	}
	// The IETF fields as the draft spells them, the x family one of their
	// items.
	if got := enforcetest.ReadHeaders(t, enforcetest.GRPCHeaders(t, a.Resp.GetOkResponse().GetResponseHeadersToAdd())); len(got.States) == 0 {
		t.Errorf("%s: allowed without a RateLimit field (headers %v)", what, h)
	}
}

// mustDenied fails unless a is a denial as docs/configuration.md spells it:
// RESOURCE_EXHAUSTED, HTTP 429, retry-after ≥ 1 whole seconds,
// x-ratelimit-limit (wantLimit unless 0), x-ratelimit-remaining 0,
// x-ratelimit-reset, RateLimit-Policy and RateLimit with the refusing rule
// at r=0, content-type application/problem+json and the problem body.
func mustDenied(t testing.TB, a answer, wantLimit int, what string) {
	t.Helper()
	if a.Verdict() != vDenied {
		t.Errorf("%s: want denied, got %s", what, a)
		return
	}
	if err := checkDeniedShape(a, wantLimit); err != nil {
		t.Errorf("%s: %v", what, err)
		return
	}
	h := enforcetest.GRPCHeaders(t, a.Resp.GetDeniedResponse().GetHeaders())
	enforcetest.ReadHeaders(t, h)
	enforcetest.CheckProblem(t, h, a.Resp.GetDeniedResponse().GetBody(), 429, a.denier())
}

// denier returns the rule a denial's body names.
func (a answer) denier() string {
	var body struct {
		Rule string `json:"rule"`
	}
	_ = json.Unmarshal([]byte(a.Resp.GetDeniedResponse().GetBody()), &body)
	return body.Rule
}

// checkDeniedShape checks a denial's HTTP response against the documented contract (docs/configuration.md).
func checkDeniedShape(a answer, wantLimit int) error {
	d := a.Resp.GetDeniedResponse()
	if d == nil {
		return fmt.Errorf("denied without DeniedHttpResponse: %s", a)
	}
	if d.GetStatus().GetCode() != typev3.StatusCode_TooManyRequests {
		return fmt.Errorf("denied with HTTP status %v, want 429", d.GetStatus().GetCode())
	}
	h := a.Headers()
	var problems []string
	if n, err := strconv.Atoi(h["retry-after"]); err != nil || n < 1 {
		problems = append(problems, fmt.Sprintf("retry-after %q is not whole seconds ≥ 1", h["retry-after"]))
	}
	if wantLimit != 0 && h["x-ratelimit-limit"] != strconv.Itoa(wantLimit) {
		problems = append(problems, fmt.Sprintf("x-ratelimit-limit %q, want %d", h["x-ratelimit-limit"], wantLimit))
	}
	if h["x-ratelimit-remaining"] != "0" {
		problems = append(problems, fmt.Sprintf("x-ratelimit-remaining %q, want 0", h["x-ratelimit-remaining"]))
	}
	if n, err := strconv.Atoi(h["x-ratelimit-reset"]); err != nil || n < 0 {
		problems = append(problems, fmt.Sprintf("x-ratelimit-reset %q is not whole seconds", h["x-ratelimit-reset"]))
	}
	if h["content-type"] != enforce.ProblemContentType {
		problems = append(problems, fmt.Sprintf("content-type %q, want %s", h["content-type"], enforce.ProblemContentType))
	}
	var body struct {
		Type             string   `json:"type"`
		Status           int      `json:"status"`
		ViolatedPolicies []string `json:"violated-policies"`
		Error            string   `json:"error"`
		Rule             string   `json:"rule"`
		RetryAfterMS     *int64   `json:"retry_after_ms"`
	}
	if err := json.Unmarshal([]byte(d.GetBody()), &body); err != nil {
		problems = append(problems, fmt.Sprintf("body %q is not JSON: %v", d.GetBody(), err))
	} else if body.Type != enforce.ProblemType || body.Status != 429 || len(body.ViolatedPolicies) != 1 || body.ViolatedPolicies[0] != body.Rule ||
		body.Error != "too_many_requests" || body.Rule == "" || body.RetryAfterMS == nil || *body.RetryAfterMS < 0 {
		problems = append(problems, fmt.Sprintf("body %q, want the quota-exceeded problem with status 429, violated-policies [rule] and \"error\":\"too_many_requests\",\"rule\":…,\"retry_after_ms\":N", d.GetBody()))
	}
	if _, err := enforcetest.ParseList(h[enforce.HeaderRateLimitPolicy]); err != nil || h[enforce.HeaderRateLimitPolicy] == "" {
		problems = append(problems, fmt.Sprintf("ratelimit-policy %q is not a structured-field list (%v)", h[enforce.HeaderRateLimitPolicy], err))
	}
	if items, err := enforcetest.ParseList(h[enforce.HeaderRateLimit]); err != nil || !slices.ContainsFunc(items, func(it enforcetest.Item) bool {
		r, _ := it.Param("r")
		return it.Value.Str == body.Rule && r.Kind == enforcetest.KindInteger && r.Int == 0
	}) {
		problems = append(problems, fmt.Sprintf("ratelimit %q names no %q at r=0 (%v)", h[enforce.HeaderRateLimit], body.Rule, err))
	}
	if problems != nil {
		return fmt.Errorf("denial outside the contract: %s (headers %v)", strings.Join(problems, "; "), h)
	}
	return nil
}

// tally counts answers of a load, safe for concurrent use.
type tally struct {
	allowed, denied, errors atomic.Int64
	maxLatency              atomic.Int64 // ns

	mu        sync.Mutex // guards firstErrs
	firstErrs []string
}

func (t *tally) add(a answer) verdict {
	v := a.Verdict()
	switch v {
	case vAllowed:
		t.allowed.Add(1)
	case vDenied:
		t.denied.Add(1)
	default:
		t.errors.Add(1)
		t.mu.Lock()
		if len(t.firstErrs) < 5 {
			t.firstErrs = append(t.firstErrs, a.String())
		}
		t.mu.Unlock()
	}
	for {
		old := t.maxLatency.Load()
		if int64(a.Latency) <= old || t.maxLatency.CompareAndSwap(old, int64(a.Latency)) {
			break
		}
	}
	return v
}

func (t *tally) MaxLatency() time.Duration { return time.Duration(t.maxLatency.Load()) }

func (t *tally) String() string {
	return fmt.Sprintf("%d allowed, %d denied, %d errors, max latency %s",
		t.allowed.Load(), t.denied.Load(), t.errors.Load(), t.MaxLatency())
}

// Errs returns the first few errors.
func (t *tally) Errs() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return append([]string(nil), t.firstErrs...)
}

// load runs workers goroutines, each calling next(worker, i) for its i-th
// request and sending it, until stop is closed; each answer goes to tl and,
// when non-nil, to each(worker, request, answer).
func load(p *proc, workers int, stop <-chan struct{}, tl *tally, next func(w, i int) req, each func(w int, r req, a answer)) *sync.WaitGroup {
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				r := next(w, i)
				a := p.Check(r)
				tl.add(a)
				if each != nil {
					each(w, r, a)
				}
			}
		}()
	}
	return &wg
}

// exampleStretched writes the built-in example rules (per x-uid 5 and per
// x-device-fp 10 on /api/coupon/, per client IP 100) with every window
// stretched from 1s to w, and returns the file's path. A burst whose
// requests each take long under load (huge headers, -race, a busy machine)
// then still falls within one window, so "the 6th is denied" is a fact of
// the rules, not a bet on the machine's speed.
func exampleStretched(t testing.TB, w string) string {
	t.Helper()
	y := descriptors.ExampleYAML()
	from := []byte("window: 1s}")
	if n := bytes.Count(y, from); n == 0 || n != bytes.Count(y, []byte("window:")) {
		t.Fatalf("the built-in example has %d windows of 1s among %d: update exampleStretched\n%s", n, bytes.Count(y, []byte("window:")), y)
	}
	path := filepath.Join(t.TempDir(), "flashsale-"+w+".yaml")
	if err := os.WriteFile(path, bytes.ReplaceAll(y, from, []byte("window: "+w+"}")), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// clockSlack covers the drift between the test's monotonic clock and the
// wall clock that Redis stamps admissions with, over a test's seconds.
const clockSlack = time.Millisecond

// only returns the answers of as with verdict v.
func only(as []answer, v verdict) []answer {
	var out []answer
	for _, a := range as {
		if a.Verdict() == v {
			out = append(out, a)
		}
	}
	return out
}

// span returns the time from the earliest send to the latest reply of as.
func span(as []answer) time.Duration {
	if len(as) == 0 {
		return 0
	}
	first, last := as[0].Sent, as[0].Replied()
	for _, a := range as[1:] {
		if a.Sent.Before(first) {
			first = a.Sent
		}
		if a.Replied().After(last) {
			last = a.Replied()
		}
	}
	return last.Sub(first)
}

// provablyWithin returns the size of the largest subset of as that was
// certainly decided within one window w, whatever the load on the machine:
// the server decides an answer between its send and its reply, so answers
// whose latest reply is less than w after their earliest send lie in one
// window.
func provablyWithin(as []answer, w time.Duration) int {
	n, _ := worstSpan(as, w)
	return n
}

// worstSpan returns provablyWithin's count and the answers it counts,
// those of the first span of w that holds the most, by send time.
func worstSpan(as []answer, w time.Duration) (int, []answer) {
	sorted := append([]answer(nil), as...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].Sent.Before(sorted[j].Sent) })
	in := func(i int, a answer) bool { return a.Replied().Before(sorted[i].Sent.Add(w - clockSlack)) }
	best, at := 0, 0
	for i, first := range sorted {
		end := first.Sent.Add(w - clockSlack)
		n := 0
		for _, a := range sorted[i:] {
			if !a.Sent.Before(end) {
				break
			}
			if in(i, a) {
				n++
			}
		}
		if n > best {
			best, at = n, i
		}
	}
	var span []answer
	for _, a := range sorted[min(at, len(sorted)):] {
		if !a.Sent.Before(sorted[at].Sent.Add(w - clockSlack)) {
			break
		}
		if in(at, a) {
			span = append(span, a)
		}
	}
	return best, span
}

// unjustified returns the denials of as that cannot have been right: a
// denial needs limit admissions that may share its window (sent before its
// reply, replied less than w before its send). as must hold every request
// the key saw in those windows.
func unjustified(as []answer, limit int, w time.Duration) []answer {
	var out []answer
	for _, d := range only(as, vDenied) {
		n := 0
		for _, a := range only(as, vAllowed) {
			if a.Sent.Before(d.Replied().Add(clockSlack)) && a.Replied().After(d.Sent.Add(-w-clockSlack)) {
				n++
			}
		}
		if n < limit {
			out = append(out, d)
		}
	}
	return out
}

// checkLimit fails t unless as, every request one key saw since it was
// last idle for a window, obey a limit of limit per w as far as their send
// and reply instants prove, whatever the load on the machine: at most limit
// admissions provably within one window, at least k−limit denials among k
// answers provably within one window, and no denial without limit
// admissions that may share its window, but for excused ones (denials the
// failure mode made, which need none). When the whole burst fits in one
// window this is exactly "limit admitted, the rest denied".
func checkLimit(t testing.TB, what string, as []answer, limit int, w time.Duration, excused int) {
	t.Helper()
	decided := append(only(as, vAllowed), only(as, vDenied)...)
	allowed, denied := len(only(as, vAllowed)), len(only(as, vDenied))
	if n := provablyWithin(only(as, vAllowed), w); n > limit {
		t.Errorf("%s: %d admissions within one window of %s, over the limit of %d (%d allowed, %d denied in %s)", what, n, w, limit, allowed, denied, span(as))
	}
	if k := provablyWithin(decided, w); denied < k-limit {
		t.Errorf("%s: %d requests within one window of %s but only %d denied: at most %d may pass (%d allowed in %s)", what, k, w, denied, limit, allowed, span(as))
	}
	if bad := unjustified(decided, limit, w); len(bad) > excused {
		t.Errorf("%s: %d denials with fewer than %d admissions in their window, %d of them excused by the failure mode (%d allowed in %s), first: %s", what, len(bad), limit, excused, allowed, span(as), bad[0])
	}
}
