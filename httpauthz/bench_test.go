package httpauthz_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/flashgate/flashgate/descriptors"
	"github.com/flashgate/flashgate/enforce"
	"github.com/flashgate/flashgate/extauthz"
	"github.com/flashgate/flashgate/httpauthz"
	"github.com/flashgate/flashgate/window"
	"github.com/flashgate/flashgate/window/memory"
)

// discardWriter is a ResponseWriter that keeps nothing but the header map,
// reset per request as the HTTP server's is.
type discardWriter struct{ h http.Header }

func (w *discardWriter) Header() http.Header         { return w.h }
func (w *discardWriter) Write(b []byte) (int, error) { return len(b), nil }
func (w *discardWriter) WriteHeader(int)             {}

// benchHandler returns the front-end on an ext_authz server of the one-rule
// file (5 per second per x-uid) on the memory limiter, and the checker
// alone.
func benchHandler(b *testing.B) (http.Handler, *extauthz.Server) {
	b.Helper()
	mem, err := memory.New(memory.Options{})
	if err != nil {
		b.Fatal(err)
	}
	core, err := enforce.New(enforce.Options{Limiter: mem})
	if err != nil {
		b.Fatal(err)
	}
	cfg, err := descriptors.ParseConfig("one.yaml", []byte(`domain: flashsale
sources:
  uid: {request_headers: {header_name: x-uid}}
descriptors:
  - key: uid
    name: coupon_per_uid
    rate_limit: {requests: 5, window: 1s}
`))
	if err != nil {
		b.Fatal(err)
	}
	srv, err := extauthz.NewServer(cfg, extauthz.Options{Core: core})
	if err != nil {
		b.Fatal(err)
	}
	h, err := httpauthz.New(httpauthz.Options{Decider: srv})
	if err != nil {
		b.Fatal(err)
	}
	return h, srv
}

// BenchmarkServeHTTP: one check of flashgate-bench's minimal request
// (x-uid, x-device-fp, user-agent, x-forwarded-for) through the handler,
// 100,000 users round robin, allowed; the HTTP server's own work is not
// included.
func BenchmarkServeHTTP(b *testing.B) {
	h, _ := benchHandler(b)
	const users = 100_000
	reqs := make([]*http.Request, 1024)
	for i := range reqs {
		r := httptest.NewRequest("POST", "/api/coupon/1", nil)
		r.RemoteAddr = "127.0.0.1:40000"
		r.Header.Set("User-Agent", "flashgate-bench")
		r.Header.Set("X-Forwarded-For", "10.0.0."+strconv.Itoa(i%250))
		reqs[i] = r
	}
	w := &discardWriter{}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		r := reqs[i%len(reqs)]
		r.Header["X-Uid"] = []string{"u" + strconv.Itoa(i%users)}
		r.Header["X-Device-Fp"] = []string{"fp" + strconv.Itoa(i%users)}
		w.h = http.Header{}
		h.ServeHTTP(w, r)
	}
}

// answerDecider answers every check with one admission under one rule, its
// storage reused, as the ext_authz server copies the core's answer.
type answerDecider struct{ a enforce.Answer }

func (d *answerDecider) Decide(_ context.Context, _ descriptors.Request, a *enforce.Answer) error {
	ps, ss := a.Policies[:0], a.States[:0]
	*a = d.a
	a.Policies, a.States = append(ps, d.a.Policies...), append(ss, d.a.States...)
	return nil
}

func (*answerDecider) Headers() enforce.Families { return enforce.FamiliesBoth }

// BenchmarkCodec: the front-end's own work on one check of
// BenchmarkServeHTTP's request, the decision left out: the request read,
// the answer's fields written into the server's header map.
func BenchmarkCodec(b *testing.B) {
	p := enforce.NewPolicy("coupon_per_uid", window.Limit{Requests: 5, Window: time.Second})
	d := &answerDecider{enforce.Answer{Policies: []*enforce.Policy{p}, States: []enforce.State{{Policy: p, Remaining: 4, T: 1}}}}
	h, err := httpauthz.New(httpauthz.Options{Decider: d})
	if err != nil {
		b.Fatal(err)
	}
	r := httptest.NewRequest("POST", "/api/coupon/1", nil)
	r.RemoteAddr = "127.0.0.1:40000"
	r.Header.Set("User-Agent", "flashgate-bench")
	r.Header.Set("X-Forwarded-For", "10.0.0.1")
	r.Header.Set("X-Uid", "u1")
	r.Header.Set("X-Device-Fp", "fp1")
	w := &discardWriter{}
	b.ReportAllocs()
	for b.Loop() {
		w.h = http.Header{}
		h.ServeHTTP(w, r)
	}
}
