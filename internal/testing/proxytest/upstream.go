package proxytest

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

// UpstreamHeader marks every answer of an Upstream, so that a test can tell
// the app's answers from the proxy's own.
const UpstreamHeader = "X-Upstream"

// Request is what reached an Upstream or an Authorizer.
type Request struct {
	Method string
	URI    string // the request target as received
	Header http.Header
}

// Upstream is the app behind a proxy: an HTTP server on a loopback port
// that records every request and answers it with Status (200 unless set),
// UpstreamHeader: 1 and the body "upstream\n". It is safe for concurrent
// use.
type Upstream struct {
	srv    *httptest.Server
	status atomic.Int64

	mu   sync.Mutex // guards reqs
	reqs []Request
}

// StartUpstream starts an Upstream, closed in t.Cleanup.
func StartUpstream(t testing.TB) *Upstream {
	t.Helper()
	u := &Upstream{}
	u.status.Store(http.StatusOK)
	u.srv = httptest.NewServer(http.HandlerFunc(u.serve))
	t.Cleanup(u.srv.Close)
	return u
}

func (u *Upstream) serve(w http.ResponseWriter, r *http.Request) {
	u.mu.Lock()
	u.reqs = append(u.reqs, Request{Method: r.Method, URI: r.RequestURI, Header: r.Header.Clone()})
	u.mu.Unlock()
	w.Header().Set(UpstreamHeader, "1")
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(int(u.status.Load()))
	_, _ = w.Write([]byte("upstream\n"))
}

// Addr is the upstream's address, 127.0.0.1:PORT.
func (u *Upstream) Addr() string { return strings.TrimPrefix(u.srv.URL, "http://") }

// Close stops the upstream: later connections are refused.
func (u *Upstream) Close() { u.srv.Close() }

// SetStatus makes every later answer carry status.
func (u *Upstream) SetStatus(status int) { u.status.Store(int64(status)) }

// Requests returns every request received so far, oldest first.
func (u *Upstream) Requests() []Request {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]Request(nil), u.reqs...)
}

// Count returns how many requests with header x-uid: uid arrived.
func (u *Upstream) Count(uid string) int {
	n := 0
	for _, r := range u.Requests() {
		if r.Header.Get("X-Uid") == uid {
			n++
		}
	}
	return n
}
