package rls

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/flashgate/flashgate/enforce"
	"github.com/flashgate/flashgate/enforce/enforcetest"
	"github.com/flashgate/flashgate/window"
)

// domainYAML is a ratelimit config file of domain with one rule per value
// of key k, named as the value.
func domainYAML(domain string, values ...string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "domain: %s\ndescriptors:\n", domain)
	for _, v := range values {
		fmt.Fprintf(&b, "  - key: k\n    value: %s\n    rate_limit: {name: %s, unit: second, requests_per_unit: 5}\n", v, v)
	}
	return b.String()
}

// requestSeries returns the "domain/rule" pairs of the flashgate_rls_requests_total
// series reg exports (see enforcetest.RuleSeries).
func requestSeries(t *testing.T, reg prometheus.Gatherer) ([]string, int) {
	t.Helper()
	return enforcetest.RuleSeries(t, reg, "flashgate_rls_requests_total")
}

// TestReloadDropsRuleSeries: a reload from 2000 counted rules to one
// leaves the series of that one rule (and of its domain's "no rule" and
// "override"), with its count kept; removing the domain drops the rest.
func TestReloadDropsRuleSeries(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	values := make([]string, 2000)
	for i := range values {
		values[i] = fmt.Sprintf("v%d", i)
	}
	write("d.yaml", domainYAML("d", values...))
	write("e.yaml", domainYAML("e", "w0"))
	cfg, err := LoadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	s, reg := newMemoryServer(t, cfg, nil)
	ctx := context.Background()
	reqs := []*rlsv3.RateLimitRequest{
		request("d", desc("k", "unknown")),
		request("d", withLimit(desc("k", "x"), 5, typev3.RateLimitUnit_SECOND)),
		request("e", desc("k", "w0")),
		request("nowhere", desc("k", "v0")),
	}
	for _, v := range values {
		reqs = append(reqs, request("d", desc("k", v)))
	}
	for _, r := range reqs {
		if _, err := s.ShouldRateLimit(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	if _, n := requestSeries(t, reg); n < 2000 {
		t.Fatalf("%d flashgate_rls_requests_total series after calls under 2000 rules, want at least 2000", n)
	}

	write("d.yaml", domainYAML("d", "v0"))
	if err := s.Reloader(dir).Reload(); err != nil {
		t.Fatal(err)
	}
	pairs, _ := requestSeries(t, reg)
	if want := []string{"/", "d/", "d/override", "d/v0", "e/w0"}; !slices.Equal(pairs, want) {
		t.Fatalf("after the reload to one rule: series of %q, want %q", pairs, want)
	}
	if got := counterValue(t, s.metrics.requests.WithLabelValues("d", "v0", enforce.DecisionAllowed)); got != 1 {
		t.Errorf("the kept rule's count is %v after the reload, want 1", got)
	}

	if err := os.Remove(filepath.Join(dir, "d.yaml")); err != nil {
		t.Fatal(err)
	}
	if err := s.Reloader(dir).Reload(); err != nil {
		t.Fatal(err)
	}
	if pairs, _ := requestSeries(t, reg); !slices.Equal(pairs, []string{"/", "e/w0"}) {
		t.Fatalf("after removing domain d: series of %q, want / and e/w0", pairs)
	}
}

// gate is a Limiter that holds each Decide until released.
type gate struct {
	entered chan struct{}
	release chan struct{}
}

func (g *gate) Decide(ctx context.Context, hits []window.Hit) (window.Decision, error) {
	g.entered <- struct{}{}
	<-g.release
	return window.Decision{Allowed: true, Index: 0, Remaining: 4, Source: window.SourceBackend}, nil
}

// TestStaleCallKeepsSeriesDropped: a call that started under the old
// config and counts after the reload removed its rule does not leave the
// rule's series behind.
func TestStaleCallKeepsSeriesDropped(t *testing.T) {
	parse := func(content string) *Config {
		t.Helper()
		cfg, err := ParseFiles([]File{{Name: "d.yaml", Data: []byte(content)}})
		if err != nil {
			t.Fatal(err)
		}
		return cfg
	}
	g := &gate{entered: make(chan struct{}), release: make(chan struct{})}
	s, reg := newMemoryServer(t, parse(domainYAML("d", "old", "kept")), func(o *testOptions) { o.Limiter = g })
	done := make(chan error, 1)
	go func() {
		_, err := s.ShouldRateLimit(context.Background(), request("d", desc("k", "old")))
		done <- err
	}()
	<-g.entered
	if err := s.SetConfig(parse(domainYAML("d", "kept"))); err != nil {
		t.Fatal(err)
	}
	close(g.release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if pairs, _ := requestSeries(t, reg); slices.Contains(pairs, "d/old") {
		t.Fatalf("series of %q after a call under the old config, want no d/old", pairs)
	}
}
