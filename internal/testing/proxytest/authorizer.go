package proxytest

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// The answers of an Authorizer, in the shape of flashgate's.
const (
	// AuthzPolicy is the one policy an Authorizer applies.
	AuthzPolicy = "per_uid"
	// AuthzWindow is its window, in seconds.
	AuthzWindow = 60
	// AuthzRetryAfter is the Retry-After (and t) of its denials, in seconds.
	AuthzRetryAfter = 42
)

// Authorizer stands in for flashgate's HTTP front-end in the tests of the
// proxy configurations. Each request is a check of the original request
// its headers describe (method: X-Original-Method, else X-Forwarded-Method,
// else its own; URI: X-Original-URI, else X-Forwarded-Uri, else its own). A
// check with an x-uid is admitted Limit times per x-uid, answered 200 with
// RateLimit, RateLimit-Policy, X-RateLimit-Limit and -Remaining, then denied
// with 429 (or the 401 or 403 X-Flashgate-Deny-Status asks for), those
// headers, Retry-After, X-RateLimit-Reset and an RFC 9457 problem body. A
// check without x-uid is admitted with no headers. It is safe for
// concurrent use.
type Authorizer struct {
	limit int
	srv   *httptest.Server

	mu     sync.Mutex // guards counts and checks
	counts map[string]int
	checks []Request // the original requests: Method and URI as described, the headers received
}

// StartAuthorizer starts an Authorizer admitting limit checks per x-uid,
// closed in t.Cleanup.
func StartAuthorizer(t testing.TB, limit int) *Authorizer {
	t.Helper()
	a := &Authorizer{limit: limit, counts: map[string]int{}}
	a.srv = httptest.NewServer(http.HandlerFunc(a.serve))
	t.Cleanup(a.srv.Close)
	return a
}

// Addr is the authorizer's address, 127.0.0.1:PORT.
func (a *Authorizer) Addr() string { return strings.TrimPrefix(a.srv.URL, "http://") }

// Close stops it: later connections are refused.
func (a *Authorizer) Close() { a.srv.Close() }

// Checks returns every check so far, oldest first.
func (a *Authorizer) Checks() []Request {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]Request(nil), a.checks...)
}

func (a *Authorizer) serve(w http.ResponseWriter, r *http.Request) {
	method := first(r.Header.Get("X-Original-Method"), r.Header.Get("X-Forwarded-Method"), r.Method)
	uri := first(r.Header.Get("X-Original-Uri"), r.Header.Get("X-Forwarded-Uri"), r.RequestURI)
	uid := r.Header.Get("X-Uid")
	a.mu.Lock()
	a.checks = append(a.checks, Request{Method: method, URI: uri, Header: r.Header.Clone()})
	n := 0
	if uid != "" {
		a.counts[uid]++
		n = a.counts[uid]
	}
	a.mu.Unlock()
	if uid == "" {
		w.WriteHeader(http.StatusOK)
		return
	}
	h := w.Header()
	h.Set("RateLimit-Policy", fmt.Sprintf("%q;q=%d;w=%d", AuthzPolicy, a.limit, AuthzWindow))
	h.Set("X-RateLimit-Limit", strconv.Itoa(a.limit))
	if n <= a.limit {
		h.Set("RateLimit", fmt.Sprintf("%q;r=%d;t=%d", AuthzPolicy, a.limit-n, AuthzWindow))
		h.Set("X-RateLimit-Remaining", strconv.Itoa(a.limit-n))
		w.WriteHeader(http.StatusOK)
		return
	}
	status := http.StatusTooManyRequests
	switch r.Header.Get("X-Flashgate-Deny-Status") {
	case "401":
		status = http.StatusUnauthorized
	case "403":
		status = http.StatusForbidden
	}
	h.Set("RateLimit", fmt.Sprintf("%q;r=0;t=%d", AuthzPolicy, AuthzRetryAfter))
	h.Set("X-RateLimit-Remaining", "0")
	h.Set("X-RateLimit-Reset", strconv.Itoa(AuthzRetryAfter))
	h.Set("Retry-After", strconv.Itoa(AuthzRetryAfter))
	h.Set("Content-Type", "application/problem+json")
	w.WriteHeader(status)
	fmt.Fprintf(w, `{"type":"https://iana.org/assignments/http-problem-types#quota-exceeded","title":"Too Many Requests","status":%d,"violated-policies":[%q]}`+"\n", status, AuthzPolicy)
}

func first(vs ...string) string {
	for _, v := range vs {
		if v != "" {
			return v
		}
	}
	return ""
}
