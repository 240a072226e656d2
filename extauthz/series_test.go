package extauthz

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/flashgate/flashgate/descriptors"
	"github.com/flashgate/flashgate/enforce"
	"github.com/flashgate/flashgate/enforce/enforcetest"
	"github.com/flashgate/flashgate/window"
)

// rulesYAML is a descriptors file of domain with one path rule per name.
func rulesYAML(domain string, names ...string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "domain: %s\ndescriptors:\n", domain)
	for _, n := range names {
		fmt.Fprintf(&b, "  - key: path\n    value: /%s\n    name: %s\n    rate_limit: {requests: 5, window: 1s}\n", n, n)
	}
	return b.String()
}

// checkSeries returns the "domain/rule" pairs of the flashgate_checks_total
// series reg exports (see enforcetest.RuleSeries).
func checkSeries(t *testing.T, reg prometheus.Gatherer) ([]string, int) {
	t.Helper()
	return enforcetest.RuleSeries(t, reg, "flashgate_checks_total")
}

// TestReloadDropsRuleSeries: a reload from 2000 rules to one leaves the
// series of that one rule (and of "no rule") only, with its counts kept;
// renaming the rules and the domain drops the old names' series too.
func TestReloadDropsRuleSeries(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rules.yaml")
	write := func(content string) {
		t.Helper()
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	names := make([]string, 2000)
	for i := range names {
		names[i] = fmt.Sprintf("r%d", i)
	}
	write(rulesYAML("d", names...))
	cfg, err := descriptors.LoadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, cfg, nil)
	for _, p := range []string{"/r0", "/r1999", "/nothing"} {
		if !e.check(req{path: p}).allowed {
			t.Fatalf("%s denied", p)
		}
	}
	if _, n := checkSeries(t, e.reg); n < 4*2000 {
		t.Fatalf("%d flashgate_checks_total series with 2000 rules, want at least %d", n, 4*2000)
	}

	write(rulesYAML("d", "r0"))
	if err := e.srv.Reloader(path).Reload(); err != nil {
		t.Fatal(err)
	}
	pairs, n := checkSeries(t, e.reg)
	if want := []string{"d/", "d/r0"}; !slices.Equal(pairs, want) || n != 8 {
		t.Fatalf("after the reload to one rule: %d series of %q, want 8 of %q", n, pairs, want)
	}
	if got := e.counter("checks", "d", "r0", enforce.DecisionAllowed); got != 1 {
		t.Errorf("the kept rule's count is %v after the reload, want 1", got)
	}

	write(rulesYAML("e", "s0"))
	if err := e.srv.Reloader(path).Reload(); err != nil {
		t.Fatal(err)
	}
	if pairs, n := checkSeries(t, e.reg); !slices.Equal(pairs, []string{"e/", "e/s0"}) || n != 8 {
		t.Fatalf("after renaming the domain and rule: %d series of %q, want 8 of e/ and e/s0", n, pairs)
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

// TestStaleCheckKeepsSeriesDropped: a check that started under the old
// rules and counts after the reload removed its rule does not bring the
// rule's series back.
func TestStaleCheckKeepsSeriesDropped(t *testing.T) {
	g := &gate{entered: make(chan struct{}), release: make(chan struct{})}
	e := newEnv(t, parse(t, rulesYAML("d", "old", "kept")), func(o *enforce.Options) { o.Limiter = g })
	done := make(chan answer, 1)
	go func() {
		resp, err := e.srv.Check(context.Background(), req{path: "/old"}.proto())
		if err != nil {
			t.Error(err)
		}
		done <- answer{allowed: resp.GetStatus().GetCode() == 0}
	}()
	<-g.entered
	if err := e.srv.SetConfig(parse(t, rulesYAML("d", "kept"))); err != nil {
		t.Fatal(err)
	}
	close(g.release)
	if a := <-done; !a.allowed {
		t.Fatal("the check in flight was denied")
	}
	if pairs, _ := checkSeries(t, e.reg); !slices.Equal(pairs, []string{"d/", "d/kept"}) {
		t.Fatalf("series of %q after a check under the old rules, want d/ and d/kept", pairs)
	}
}
