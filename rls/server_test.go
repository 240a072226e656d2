package rls

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/flashgate/flashgate/extauthz"
	"github.com/flashgate/flashgate/window"
	"github.com/flashgate/flashgate/window/redistest"
)

func loadGood(t *testing.T) *Config {
	t.Helper()
	cfg, err := LoadDir("testdata/good")
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

func newMemoryServer(t *testing.T, cfg *Config, mod func(*Options)) (*Server, *prometheus.Registry) {
	t.Helper()
	mem, err := window.NewMemory(window.MemoryOptions{})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	o := Options{Limiter: mem, Registerer: reg}
	if mod != nil {
		mod(&o)
	}
	s, err := NewServer(cfg, o)
	if err != nil {
		t.Fatal(err)
	}
	return s, reg
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
// fewest remaining gives x-ratelimit-limit, -remaining and -reset, as
// ratelimit's LIMIT_RESPONSE_HEADERS_ENABLED; without, none.
func TestResponseHeaders(t *testing.T) {
	cfg := loadGood(t)
	s, _ := newMemoryServer(t, cfg, func(o *Options) { o.ResponseHeaders = true })
	ctx := context.Background()
	req := request("basic", desc("remote_address", "10.0.0.1"), desc("message_type", "marketing", "to_number", "1"))
	want := [][3]string{{"2", "1", "60"}, {"2", "0", "60"}}
	for i, w := range want {
		resp, err := s.ShouldRateLimit(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]string{}
		for _, h := range resp.GetResponseHeadersToAdd() {
			got[h.GetKey()] = h.GetValue()
		}
		if got["x-ratelimit-limit"] != w[0] || got["x-ratelimit-remaining"] != w[1] || got["x-ratelimit-reset"] != w[2] {
			t.Fatalf("call %d: headers %v, want limit %s remaining %s reset %s", i, got, w[0], w[1], w[2])
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
		if h.GetKey() == "x-ratelimit-reset" && (h.GetValue() == "0" || h.GetValue() > "60") {
			t.Fatalf("denied: x-ratelimit-reset %s, want 1..60", h.GetValue())
		}
	}

	plain, _ := newMemoryServer(t, cfg, nil)
	resp, err = plain.ShouldRateLimit(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.GetResponseHeadersToAdd()) != 0 {
		t.Fatalf("headers %v without ResponseHeaders", resp.GetResponseHeadersToAdd())
	}
}

// TestGlobalShadow: Options.Shadow (--shadow) admits everything, counts it
// as shadow_denied.
func TestGlobalShadow(t *testing.T) {
	s, reg := newMemoryServer(t, loadGood(t), func(o *Options) { o.Shadow = true })
	req := request("basic", desc("remote_address", "50.0.0.5"), desc("remote_address", "1.1.1.1"))
	for range 5 {
		resp, err := s.ShouldRateLimit(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		if resp.GetOverallCode() != ok {
			t.Fatalf("overall %s under --shadow", resp.GetOverallCode())
		}
	}
	if n := counterValue(t, s.metrics.requests.WithLabelValues("basic", "remote_address_50.0.0.5", decisionShadowDenied)); n < 1 {
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
	rs := redistest.Start(t)
	client, err := window.NewClient(window.ClientConfig{Addrs: []string{rs.Addr()}, Timeout: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Close() })
	red, err := window.NewRedis(client, window.RedisOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(red.Close)
	cfg := loadGood(t)
	servers := map[extauthz.FailureMode]*Server{}
	for _, mode := range []extauthz.FailureMode{extauthz.FailureDeny, extauthz.FailureAllow, extauthz.FailureLocal} {
		fb, err := window.NewFallback(window.FallbackOptions{})
		if err != nil {
			t.Fatal(err)
		}
		s, err := NewServer(cfg, Options{Limiter: red, Fallback: fb, FailureMode: mode, Registerer: prometheus.NewRegistry()})
		if err != nil {
			t.Fatal(err)
		}
		servers[mode] = s
	}
	ctx := context.Background()
	req := request("basic", desc("remote_address", "9.9.9.9"))
	if resp, err := servers[extauthz.FailureDeny].ShouldRateLimit(ctx, req); err != nil || resp.GetOverallCode() != ok {
		t.Fatalf("redis up: %v %v", resp, err)
	}
	rs.Stop()

	resp, err := servers[extauthz.FailureDeny].ShouldRateLimit(ctx, req)
	if err != nil || resp.GetOverallCode() != over {
		t.Fatalf("deny: %v %v, want OVER_LIMIT", resp, err)
	}
	for range 5 {
		resp, err = servers[extauthz.FailureAllow].ShouldRateLimit(ctx, req)
		if err != nil || resp.GetOverallCode() != ok {
			t.Fatalf("allow: %v %v, want OK", resp, err)
		}
	}
	var codes []string
	for range 4 { // the local share of 3 a minute in a fleet of one
		resp, err = servers[extauthz.FailureLocal].ShouldRateLimit(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		codes = append(codes, resp.GetOverallCode().String())
	}
	if strings.Join(codes, ",") != "OK,OK,OK,OVER_LIMIT" {
		t.Fatalf("local: %v, want 3 OK then OVER_LIMIT", codes)
	}
	for mode, s := range servers {
		if n := counterValue(t, s.metrics.failureModes.WithLabelValues(mode.String())); n < 1 {
			t.Errorf("%s: flashgate_rls_failure_mode_decisions_total{mode=%q} = %v", mode, mode, n)
		}
	}
}

// TestReload: a changed directory is picked up by WatchDir; a bad one
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
	go func() { done <- s.WatchDir(ctx, dir, 10*time.Millisecond) }()
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
	errs := s.metrics.reloads.WithLabelValues("error")
	waitFor("a reload error", func() bool { return counterValue(t, errs) >= 1 })
	if s.Config().domains["two"] == nil {
		t.Fatal("a bad directory replaced the config")
	}
	if err := s.Reload(); err == nil || !strings.Contains(err.Error(), `unknown field "bogus"`) {
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
