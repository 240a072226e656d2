package rls

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/flashgate/flashgate/enforce"
	"github.com/flashgate/flashgate/enforce/enforcetest"
	"github.com/flashgate/flashgate/window"
	"github.com/flashgate/flashgate/window/fallback"
	"github.com/flashgate/flashgate/window/guard"
	"github.com/flashgate/flashgate/window/memory"
)

func loadGood(t *testing.T) *Config {
	t.Helper()
	cfg, err := LoadDir("testdata/good")
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// coreOptions are enforce.Options, named for embedding in testOptions.
type coreOptions = enforce.Options

// testOptions are a test Server's options and its core's.
type testOptions struct {
	Options
	coreOptions
}

// newServer builds a Server on cfg with o's options and a core of its own.
func newServer(t *testing.T, cfg *Config, o testOptions) *Server {
	t.Helper()
	core, err := enforce.New(o.coreOptions)
	if err != nil {
		t.Fatal(err)
	}
	o.Core = core
	s, err := NewServer(cfg, o.Options)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func newMemoryServer(t *testing.T, cfg *Config, mod func(*testOptions)) (*Server, *prometheus.Registry) {
	t.Helper()
	mem, err := memory.New(memory.Options{})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	o := testOptions{coreOptions: coreOptions{Limiter: mem, Registerer: reg}}
	if mod != nil {
		mod(&o)
	}
	return newServer(t, cfg, o), reg
}

// TestInvalidRequests: as ratelimit, an empty domain or descriptor list is
// an error (InvalidArgument), not a decision.
func TestInvalidRequests(t *testing.T) {
	s, _ := newMemoryServer(t, loadGood(t), nil)
	for name, req := range map[string]*rlsv3.RateLimitRequest{
		"empty domain":   request("", desc("a", "b")),
		"no descriptors": request("basic"),
	} {
		t.Run(name, func(t *testing.T) {
			_, err := s.ShouldRateLimit(context.Background(), req)
			if status.Code(err) != codes.InvalidArgument {
				t.Fatalf("error %v, want InvalidArgument", err)
			}
		})
	}
}

// TestResponseHeaders: with ResponseHeaders, the descriptor with the
// fewest remaining gives the limit, remaining and reset headers, named as
// ratelimit names them by default (RateLimit-Limit, RateLimit-Remaining,
// RateLimit-Reset) or as HeaderNames says; without, none.
func TestResponseHeaders(t *testing.T) {
	cfg := loadGood(t)
	custom := HeaderNames{Limit: "X-RateLimit-Limit", Remaining: "X-RateLimit-Remaining", Reset: "X-RateLimit-Reset"}
	for name, names := range map[string]*HeaderNames{"ratelimit's": nil, "custom": &custom} {
		t.Run(name, func(t *testing.T) {
			s, _ := newMemoryServer(t, cfg, func(o *testOptions) {
				o.ResponseHeaders = true
				if names != nil {
					o.HeaderNames = *names
				}
			})
			want := DefaultHeaderNames()
			if names != nil {
				want = *names
			}
			ctx := context.Background()
			req := request("basic", desc("remote_address", "10.0.0.1"), desc("message_type", "marketing", "to_number", "1"))
			for i, w := range [][3]string{{"2", "1", "60"}, {"2", "0", "60"}} {
				resp, err := s.ShouldRateLimit(ctx, req)
				if err != nil {
					t.Fatal(err)
				}
				got := map[string]string{}
				for _, h := range resp.GetResponseHeadersToAdd() {
					if strings.EqualFold(h.GetKey(), want.Limit) || strings.EqualFold(h.GetKey(), want.Remaining) || strings.EqualFold(h.GetKey(), want.Reset) {
						if _, dup := got[h.GetKey()]; dup || h.GetKey() != strings.ToLower(h.GetKey()) && got[strings.ToLower(h.GetKey())] != "" {
							t.Errorf("call %d: %s twice", i, h.GetKey())
						}
						got[h.GetKey()] = h.GetValue()
					}
				}
				if len(got) != 3 || got[want.Limit] != w[0] || got[want.Remaining] != w[1] || got[want.Reset] != w[2] {
					t.Fatalf("call %d: headers %v, want %s %s, %s %s, %s %s", i, got, want.Limit, w[0], want.Remaining, w[1], want.Reset, w[2])
				}
			}
			resp, err := s.ShouldRateLimit(ctx, req)
			if err != nil {
				t.Fatal(err)
			}
			if resp.GetOverallCode() != over {
				t.Fatalf("third call: %s, want OVER_LIMIT", resp.GetOverallCode())
			}
			for _, h := range resp.GetResponseHeadersToAdd() {
				if h.GetKey() == want.Reset && (h.GetValue() == "0" || len(h.GetValue()) > 2) {
					t.Fatalf("denied: %s %s, want 1..60", want.Reset, h.GetValue())
				}
			}
		})
	}

	plain, _ := newMemoryServer(t, cfg, nil)
	resp, err := plain.ShouldRateLimit(context.Background(), request("basic", desc("remote_address", "10.0.0.1")))
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range resp.GetResponseHeadersToAdd() {
		if k := h.GetKey(); strings.HasPrefix(k, "RateLimit-") {
			t.Errorf("header %s without ResponseHeaders", k)
		}
	}
}

// recorder is a Limiter that remembers the hits it was asked about and
// admits them.
type recorder struct {
	mu   sync.Mutex
	hits [][]window.Hit
}

func (r *recorder) Decide(_ context.Context, hits []window.Hit) (window.Decision, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.hits = append(r.hits, slices.Clone(hits))
	return window.Decision{Allowed: true, Index: 0, Remaining: 1, ShadowIndex: -1}, nil
}

// TestHostileRequests: a request's size is bounded (descriptors, entries),
// and what Envoy passes on from clients (long values, invalid UTF-8, odd
// bytes) reaches no Redis key unbounded, no log line and no metric label.
func TestHostileRequests(t *testing.T) {
	var logs strings.Builder
	rec := &recorder{}
	s, reg := newMemoryServer(t, loadGood(t), func(o *testOptions) {
		o.Limiter = rec
		o.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	})
	ctx := context.Background()
	secret := "hostile{tag}\xff\x00" + strings.Repeat("v", 100_000)
	many := request("basic")
	for range MaxDescriptors + 1 {
		many.Descriptors = append(many.Descriptors, desc("remote_address", secret))
	}
	deep := desc()
	for range MaxEntries + 1 {
		deep.Entries = append(deep.Entries, desc("k", secret).Entries...)
	}
	for name, req := range map[string]*rlsv3.RateLimitRequest{
		"too many descriptors": many,
		"too many entries":     request("basic", deep),
	} {
		_, err := s.ShouldRateLimit(ctx, req)
		if status.Code(err) != codes.InvalidArgument {
			t.Fatalf("%s: error %v, want InvalidArgument", name, err)
		}
		if strings.Contains(err.Error(), "hostile") {
			t.Fatalf("%s: the error quotes a request value: %.80s", name, err)
		}
	}
	if len(rec.hits) != 0 {
		t.Fatalf("refused requests reached the limiter: %d calls", len(rec.hits))
	}

	ok := request("basic")
	for range MaxDescriptors {
		ok.Descriptors = append(ok.Descriptors, desc("remote_address", secret))
	}
	ok.Descriptors = append(ok.Descriptors[:MaxDescriptors-3],
		withLimit(desc("k", secret, "k2", "\xff\xfe"), 5, typev3.RateLimitUnit_MINUTE),
		desc("message_type", "marketing", "to_number", secret),
		desc("remote_address", ""))
	if _, err := s.ShouldRateLimit(ctx, ok); err != nil {
		t.Fatalf("a request at the limits: %v", err)
	}
	if len(rec.hits) != 1 {
		t.Fatalf("%d limiter calls, want 1", len(rec.hits))
	}
	for _, h := range rec.hits[0] {
		if len(h.Key) > window.MaxKeyLen || strings.Count(h.Key, "{") != 1 || strings.Count(h.Key, "}") != 1 ||
			strings.IndexFunc(h.Key, func(r rune) bool { return r < 0x21 || r > 0x7e }) >= 0 {
			t.Fatalf("key %.120q: unbounded, or a hash tag or byte from the request", h.Key)
		}
		if strings.Contains(h.Key, "hostile") {
			t.Fatalf("key %.120q carries the value verbatim", h.Key)
		}
	}
	if strings.Contains(logs.String(), "hostile") {
		t.Fatal("a log line carries a request value")
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if strings.Contains(l.GetValue(), "hostile") {
					t.Fatalf("%s{%s} carries a request value", mf.GetName(), l.GetName())
				}
			}
		}
	}
}

// TestGlobalShadow: the core's Shadow (--shadow) admits everything, counts it
// as shadow_denied; as under ratelimit's global SHADOW_MODE, a descriptor
// over its limit still says OVER_LIMIT in its status.
func TestGlobalShadow(t *testing.T) {
	s, reg := newMemoryServer(t, loadGood(t), func(o *testOptions) { o.Shadow = true })
	req := request("basic", desc("remote_address", "50.0.0.5"), desc("remote_address", "1.1.1.1"))
	for i := range 5 {
		resp, err := s.ShouldRateLimit(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		if resp.GetOverallCode() != ok {
			t.Fatalf("overall %s under --shadow", resp.GetOverallCode())
		}
		// 50.0.0.5 is blocked (limit 0); 1.1.1.1 has 3 a minute
		want := []rlsv3.RateLimitResponse_Code{over, ok}
		if i >= 3 {
			want[1] = over
		}
		for k, st := range resp.GetStatuses() {
			if st.GetCode() != want[k] {
				t.Fatalf("call %d: status %d %s, want %s", i, k, st.GetCode(), want[k])
			}
		}
	}
	if n := counterValue(t, s.metrics.requests.WithLabelValues("basic", "remote_address_50.0.0.5", enforce.DecisionShadowDenied)); n < 1 {
		t.Fatalf("shadow_denied %v, want ≥ 1", n)
	}
	_ = reg
}

// TestMetricLabels: labels carry domains and rule names of the config,
// never request values.
func TestMetricLabels(t *testing.T) {
	s, reg := newMemoryServer(t, loadGood(t), nil)
	ctx := context.Background()
	secret := "attacker-controlled-value"
	for _, req := range []*rlsv3.RateLimitRequest{
		request("basic", desc("remote_address", secret)),
		request("units", desc("per", "five_minutes")),
		request(secret, desc("remote_address", secret)),
		request("basic", withLimit(desc("remote_address", secret), 5, typev3.RateLimitUnit_MINUTE)),
	} {
		if _, err := s.ShouldRateLimit(ctx, req); err != nil {
			t.Fatal(err)
		}
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if strings.Contains(l.GetValue(), secret) {
					t.Errorf("%s has a request value in label %s", mf.GetName(), l.GetName())
				}
				if mf.GetName() == "flashgate_rls_requests_total" && l.GetName() == "rule" {
					seen[l.GetValue()] = true
				}
			}
		}
	}
	for _, want := range []string{"remote_address", "five_minutes", "override", ""} {
		if !seen[want] {
			t.Errorf("no flashgate_rls_requests_total{rule=%q}; have %v", want, seen)
		}
	}
}

// TestFailureModes stops a real redis-server and checks each failure mode:
// deny answers OVER_LIMIT, allow OK, local decides in process (and
// enforces there).
func TestFailureModes(t *testing.T) {
	rs, red := startRedis(t, 500*time.Millisecond)
	cfg := loadGood(t)
	servers := map[enforce.FailureMode]*Server{}
	regs := map[enforce.FailureMode]*prometheus.Registry{}
	for _, mode := range []enforce.FailureMode{enforce.FailureDeny, enforce.FailureAllow, enforce.FailureLocal} {
		fb, err := fallback.New(fallback.Options{})
		if err != nil {
			t.Fatal(err)
		}
		reg := prometheus.NewRegistry()
		servers[mode] = newServer(t, cfg, testOptions{coreOptions: coreOptions{Limiter: red, Fallback: fb, FailureMode: mode, Registerer: reg}})
		regs[mode] = reg
	}
	ctx := context.Background()
	req := request("basic", desc("remote_address", "9.9.9.9"))
	if resp, err := servers[enforce.FailureDeny].ShouldRateLimit(ctx, req); err != nil || resp.GetOverallCode() != ok {
		t.Fatalf("redis up: %v %v", resp, err)
	}
	rs.Stop()

	resp, err := servers[enforce.FailureDeny].ShouldRateLimit(ctx, req)
	if err != nil || resp.GetOverallCode() != over {
		t.Fatalf("deny: %v %v, want OVER_LIMIT", resp, err)
	}
	for range 5 {
		resp, err = servers[enforce.FailureAllow].ShouldRateLimit(ctx, req)
		if err != nil || resp.GetOverallCode() != ok {
			t.Fatalf("allow: %v %v, want OK", resp, err)
		}
	}
	var codes []string
	for range 4 { // the local share of 3 a minute in a fleet of one
		resp, err = servers[enforce.FailureLocal].ShouldRateLimit(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		codes = append(codes, resp.GetOverallCode().String())
	}
	if strings.Join(codes, ",") != "OK,OK,OK,OVER_LIMIT" {
		t.Fatalf("local: %v, want 3 OK then OVER_LIMIT", codes)
	}
	for mode, reg := range regs {
		if n := enforcetest.Counter(t, reg, "flashgate_rls_failure_mode_decisions_total", mode.String()); n < 1 {
			t.Errorf("%s: flashgate_rls_failure_mode_decisions_total{mode=%q} = %v", mode, mode, n)
		}
	}
}

// TestReload: a changed directory is picked up by the Reloader's watch; a bad one
// keeps the old config and counts an error; Reload forces a read.
func TestReload(t *testing.T) {
	dir := t.TempDir()
	write := func(content string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, "d.yaml"), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("domain: one\ndescriptors:\n  - key: k\n")
	cfg, err := LoadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	s, _ := newMemoryServer(t, cfg, nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	r := s.Reloader(dir)
	go func() { done <- r.Watch(ctx, 10*time.Millisecond) }()
	defer func() {
		cancel()
		<-done
	}()
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s", what)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	write("domain: two\ndescriptors:\n  - key: k\n")
	waitFor("domain two", func() bool { return s.Config().domains["two"] != nil })

	write("domain: three\ndescriptors:\n  - key: k\n    bogus: 1\n")
	errs := s.core.Metrics().Reloads.WithLabelValues("error")
	waitFor("a reload error", func() bool { return counterValue(t, errs) >= 1 })
	if s.Config().domains["two"] == nil {
		t.Fatal("a bad directory replaced the config")
	}
	if err := r.Reload(); err == nil || !strings.Contains(err.Error(), `unknown field "bogus"`) {
		t.Fatalf("Reload: %v, want the file's error", err)
	}
}

// counterValue reads a counter.
func counterValue(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

// TestReloadUnreadableOnce: a directory that cannot be read (a ConfigMap
// being swapped, a typo) is logged and counted once, not at every poll,
// and the config stays.
func TestReloadUnreadableOnce(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "d.yaml")
	if err := os.WriteFile(file, []byte("domain: one\ndescriptors:\n  - key: k\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := LoadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	s, _ := newMemoryServer(t, cfg, nil)
	if err := os.Remove(file); err != nil {
		t.Fatal(err)
	}
	r := s.Reloader(dir)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Watch(ctx, 10*time.Millisecond) }()
	errs := s.core.Metrics().Reloads.WithLabelValues("error")
	waitUntil(t, "the error", func() bool { return counterValue(t, errs) >= 1 })
	time.Sleep(50 * time.Millisecond) // a few polls more
	cancel()
	<-done
	if n := counterValue(t, errs); n != 1 {
		t.Fatalf("%v reload errors counted, want 1", n)
	}
	if s.Config().domains["one"] == nil {
		t.Fatal("an unreadable directory replaced the config")
	}
	if err := r.Reload(); err == nil {
		t.Fatal("Reload (SIGHUP) of an unreadable directory: no error")
	}
}

// failing is a Limiter whose backend is down.
type failing struct{}

func (failing) Decide(context.Context, []window.Hit) (window.Decision, error) {
	return window.Decision{}, errors.New("redis: connection refused")
}

// TestRuleFailureModes: a rule's own failure_mode wins over the server's,
// as in flashgate's descriptors file: deny refuses, allow admits, local
// decides in process (only the local rules).
func TestRuleFailureModes(t *testing.T) {
	fb, err := fallback.New(fallback.Options{})
	if err != nil {
		t.Fatal(err)
	}
	s, _ := newMemoryServer(t, loadGood(t), func(o *testOptions) {
		o.Limiter, o.Fallback, o.FailureMode = failing{}, fb, enforce.FailureLocal
	})
	ctx := context.Background()
	call := func(req *rlsv3.RateLimitRequest) *rlsv3.RateLimitResponse {
		t.Helper()
		resp, err := s.ShouldRateLimit(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	// tenant.user: failure_mode deny (inherited from tenant)
	if resp := call(request("flashgate", desc("tenant", "t", "user", "u"), desc("quiet", "q"))); resp.GetOverallCode() != over ||
		resp.GetStatuses()[0].GetCode() != over || resp.GetStatuses()[1].GetCode() != ok {
		t.Fatalf("deny rule: %v, want OVER_LIMIT by the first descriptor", resp)
	}
	// quiet: failure_mode allow, never limited while the backend is down
	for range 5 {
		if resp := call(request("flashgate", desc("quiet", "q"))); resp.GetOverallCode() != ok {
			t.Fatalf("allow rule: %v, want OK", resp)
		}
	}
	// api_key: the server's mode, local: 2 per 90s in a fleet of one; the
	// allow rule beside it is left out of the fallback's decision
	var codes []string
	for range 3 {
		resp := call(request("flashgate", desc("quiet", "q"), desc("api_key", "k")))
		codes = append(codes, resp.GetOverallCode().String()+"/"+resp.GetStatuses()[0].GetCode().String()+"/"+resp.GetStatuses()[1].GetCode().String())
	}
	if got := strings.Join(codes, ","); got != "OK/OK/OK,OK/OK/OK,OVER_LIMIT/OK/OVER_LIMIT" {
		t.Fatalf("local rule beside an allow rule: %s", got)
	}
}

// A hit's tag names its rule's penalty box to the Guard and its local share
// to the Fallback.
var (
	_ guard.RuleBan      = (*enforce.HitTag)(nil)
	_ fallback.RuleShare = (*enforce.HitTag)(nil)
)

// TestHitSettings: ban and local_share reach the window stack's hits; a
// rule without them leaves the server's.
func TestHitSettings(t *testing.T) {
	rec := &recorder{}
	s, _ := newMemoryServer(t, loadGood(t), func(o *testOptions) { o.Limiter = rec })
	req := request("flashgate", desc("tenant", "t", "user", "u"), desc("quiet", "q"), desc("api_key", "k"))
	if _, err := s.ShouldRateLimit(context.Background(), req); err != nil {
		t.Fatal(err)
	}
	hs := rec.hits[0]
	if len(hs) != 3 {
		t.Fatalf("%d hits, want 3", len(hs))
	}
	banOf := func(h window.Hit) *window.Ban {
		r, ok := h.Tag.(guard.RuleBan)
		if !ok {
			t.Fatalf("hit %s: tag %T names no penalty box", h.Rule, h.Tag)
		}
		return r.PenaltyBox()
	}
	shareOf := func(h window.Hit) int {
		r, ok := h.Tag.(fallback.RuleShare)
		if !ok {
			t.Fatalf("hit %s: tag %T names no local share", h.Rule, h.Tag)
		}
		return r.FallbackShare()
	}
	if b := banOf(hs[0]); b == nil || *b != (window.Ban{Threshold: 3, Window: 10 * time.Second, Duration: time.Minute}) || shareOf(hs[0]) != 1 {
		t.Errorf("tenant.user: ban %v local share %d", b, shareOf(hs[0]))
	}
	if b := banOf(hs[1]); b != nil {
		t.Errorf("quiet: ban %v, want none (duration 0 turns it off)", b)
	}
	if b := banOf(hs[2]); b != nil || shareOf(hs[2]) != 0 {
		t.Errorf("api_key: ban %v local share %d, want none and the fleet's share", b, shareOf(hs[2]))
	}
}

// TestHitBuckets: a rule's bucket count, written or chosen by size, is its
// hits' window.Limit.Buckets.
func TestHitBuckets(t *testing.T) {
	rec := &recorder{}
	s, _ := newMemoryServer(t, loadGood(t), func(o *testOptions) { o.Limiter = rec })
	req := request("buckets", desc("small", "s"), desc("large", "l"), desc("chosen", "c"), desc("exact", "e"))
	if _, err := s.ShouldRateLimit(context.Background(), req); err != nil {
		t.Fatal(err)
	}
	hs := rec.hits[0]
	want := []int{0, window.DefaultBuckets, 96, 0}
	if len(hs) != len(want) {
		t.Fatalf("%d hits, want %d", len(hs), len(want))
	}
	for i, h := range hs {
		if h.Limit.Buckets != want[i] {
			t.Errorf("hit %d (%s): %d buckets, want %d", i, h.Rule, h.Limit.Buckets, want[i])
		}
	}
	// A request's limit override is sized as a rule without algorithm: a
	// 100,000 a day override must not keep an exact log (10 MB a key).
	large := withLimit(desc("small", "s2"), 100000, typev3.RateLimitUnit_DAY)
	small := withLimit(desc("small", "s3"), 10000, typev3.RateLimitUnit_DAY)
	if _, err := s.ShouldRateLimit(context.Background(), request("buckets", large, small)); err != nil {
		t.Fatal(err)
	}
	if hs := rec.hits[1]; len(hs) != 2 || hs[0].Limit.Buckets != window.DefaultBuckets || hs[1].Limit.Buckets != 0 {
		t.Errorf("overrides of 100,000 and 10,000 a day: %+v, want %d and 0 buckets", hs, window.DefaultBuckets)
	}
}
