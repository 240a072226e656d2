package e2e

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/flashgate/flashgate/window/redistest"
)

// The override tests: sidecars sharing one Redis, with a rule of 1000
// requests a minute per x-uid that a test never fills, so that a fresh
// uid's third request in a row is denied only under an override of 2.
const limitsConfig = `domain: limits
sources:
  uid: {request_headers: {header_name: x-uid}}
descriptors:
  - key: uid
    name: uid
    rate_limit: {requests: 1000, window: 1m}
`

// limitsFleet is a Redis, its descriptors file and the CLI's flags for it.
type limitsFleet struct {
	redis  *redistest.Server
	config string
	prefix string
}

func newLimitsFleet(t *testing.T) *limitsFleet {
	t.Helper()
	f := &limitsFleet{redis: redistest.Start(t), prefix: "limits"}
	f.config = filepath.Join(t.TempDir(), "limits.yaml")
	if err := os.WriteFile(f.config, []byte(limitsConfig), 0o644); err != nil {
		t.Fatal(err)
	}
	return f
}

func (f *limitsFleet) start(t *testing.T, n int) []*proc {
	t.Helper()
	return startFleet(t, n, f.redis.Addr(), f.prefix, "--config", f.config)
}

// limits runs `flashgate limits args… --json` as its own process and
// returns its output; it fails the test unless it exits 0.
func (f *limitsFleet) limits(t *testing.T, args ...string) string {
	t.Helper()
	out, err := f.limitsErr(args...)
	if err != nil {
		t.Fatalf("flashgate limits %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

func (f *limitsFleet) limitsErr(args ...string) (string, error) {
	args = append(append([]string{"limits"}, args...), "--redis-addr", f.redis.Addr(), "--key-prefix", f.prefix, "--config", f.config, "--json")
	out, err := exec.Command(flashgateBin, args...).CombinedOutput()
	return string(out), err
}

// setUntil runs limits set and returns the override's end.
func (f *limitsFleet) setUntil(t *testing.T, args ...string) time.Time {
	t.Helper()
	out := f.limits(t, append([]string{"set", "--rule", "uid", "--by", "e2e"}, args...)...)
	var row struct {
		Until time.Time `json:"until"`
	}
	if err := json.Unmarshal([]byte(out), &row); err != nil || row.Until.IsZero() {
		t.Fatalf("limits set: output %q: %v", out, err)
	}
	return row.Until
}

// capped sends three requests of a fresh uid to p: it reports whether one
// was denied under the override of 2 (x-ratelimit-limit 2: the third by
// Redis, or an earlier one by failure mode local's share of 2 while Redis
// is held off). Any other denial fails the test.
func capped(t *testing.T, p *proc) bool {
	t.Helper()
	uid := freshUID("ov")
	for i := range 3 {
		a := p.Check(uidReq(uid))
		switch {
		case a.Verdict() == vDenied && a.Headers()["x-ratelimit-limit"] == "2":
			return true
		case a.Verdict() != vAllowed:
			t.Fatalf("request %d of a fresh uid: %s, want allowed or denied under the override", i+1, a)
		}
	}
	return false
}

// untilCapped polls every sidecar until capped says want (at most 10 s
// each, a loaded machine's margin) and logs how long each took from the
// call.
func untilCapped(t *testing.T, procs []*proc, want bool, what string) {
	t.Helper()
	start := time.Now()
	var took []string
	for i, p := range procs {
		if _, ok := waitFor(10*time.Second, func() bool { return capped(t, p) == want }); !ok {
			t.Fatalf("sidecar %d: %s: not within 10 s", i, what)
		}
		took = append(took, time.Since(start).Round(time.Millisecond).String())
	}
	t.Logf("%s: sidecars done after %s", what, strings.Join(took, ", "))
}

// TestLimitsOverrideFleet: an override set with flashgate limits reaches
// three sidecars (their time to enforce it is logged), is ended by limits
// clear, and one set for a few seconds ends by itself; a dry run denies
// nothing and counts would-be denials.
func TestLimitsOverrideFleet(t *testing.T) {
	f := newLimitsFleet(t)
	procs := f.start(t, 3)
	for i, p := range procs {
		if capped(t, p) {
			t.Fatalf("sidecar %d: capped before any override", i)
		}
	}

	f.setUntil(t, "--requests", "2", "--for", "5m", "--reason", "orders failing")
	untilCapped(t, procs, true, "override enforced")
	for i, p := range procs {
		if v := p.Metrics().Value("flashgate_overrides_in_force", "rule", "uid"); v != 1 {
			t.Errorf("sidecar %d: flashgate_overrides_in_force{rule=uid} = %v, want 1", i, v)
		}
	}
	if out := f.limits(t, "list"); !strings.Contains(out, `"reason": "orders failing"`) || !strings.Contains(out, `"by": "e2e"`) {
		t.Errorf("limits list: %s", out)
	}

	f.limits(t, "clear", "--rule", "uid", "--by", "e2e", "--reason", "orders back")
	untilCapped(t, procs, false, "override cleared")
	for i, p := range procs {
		if v := p.Metrics().Value("flashgate_override_clears_total", "rule", "uid"); v != 1 {
			t.Errorf("sidecar %d: flashgate_override_clears_total{rule=uid} = %v, want 1", i, v)
		}
	}

	// One that ends by itself: every sidecar learns it (its sets count
	// grows), and from its end on none enforces it, Redis untouched.
	until := f.setUntil(t, "--requests", "2", "--for", "10s")
	for i, p := range procs {
		if _, ok := waitFor(10*time.Second, func() bool { return p.Metrics().Value("flashgate_override_sets_total", "rule", "uid") >= 2 }); !ok {
			t.Fatalf("sidecar %d: did not learn the second override within 10 s", i)
		}
	}
	time.Sleep(time.Until(until) + 10*time.Millisecond)
	for i, p := range procs {
		if capped(t, p) {
			t.Fatalf("sidecar %d: capped after the override's end", i)
		}
	}
	if out := f.limits(t, "list"); !strings.Contains(out, `"overrides": []`) {
		t.Errorf("limits list after the end: %s", out)
	}

	// A dry run: 2 beside the rule, in shadow.
	f.setUntil(t, "--requests", "2", "--dry-run", "--for", "5m")
	for i, p := range procs {
		if _, ok := waitFor(10*time.Second, func() bool {
			if capped(t, p) { // fails the test on any denial
				t.Fatalf("sidecar %d: a dry run denied", i)
			}
			return p.Metrics().Value("flashgate_override_dry_run_total", "rule", "uid", "result", "would_deny") > 0
		}); !ok {
			t.Fatalf("sidecar %d: no would-be denial counted within 10 s", i)
		}
	}
	out := f.limits(t, "history")
	for _, want := range []string{`"op": "set"`, `"op": "clear"`, `"reason": "orders back"`, `"mode": "dry-run"`} {
		if !strings.Contains(out, want) {
			t.Errorf("limits history lacks %s:\n%s", want, out)
		}
	}
}

// TestLimitsOverrideSurvives: an override outlives a reload of the file
// and a restart of Redis (the sidecars write it back), and a sidecar
// started while it is in force enforces it from its first check.
func TestLimitsOverrideSurvives(t *testing.T) {
	f := newLimitsFleet(t)
	procs := f.start(t, 3)
	f.setUntil(t, "--requests", "2", "--for", "10m")
	untilCapped(t, procs, true, "override enforced")

	// A reload of the file (one more rule) keeps it.
	m0 := procs[0].Metrics().Value("flashgate_config_reloads_total", "result", "success")
	more := limitsConfig + `  - key: uid
    name: uid_burst
    rate_limit: {requests: 5000, window: 1s}
`
	if err := os.WriteFile(f.config, []byte(more), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, ok := waitFor(10*time.Second, func() bool {
		return procs[0].Metrics().Value("flashgate_config_reloads_total", "result", "success") > m0
	}); !ok {
		t.Fatal("the changed file was not reloaded within 10 s")
	}
	if !capped(t, procs[0]) {
		t.Fatal("the override lost at a reload of the file")
	}

	// Redis restarts empty: the sidecars write the override back.
	f.redis.Restart()
	if _, ok := waitFor(20*time.Second, func() bool {
		out, err := f.limitsErr("list")
		return err == nil && strings.Contains(out, `"rule": "uid"`)
	}); !ok {
		t.Fatal("the override not written back to the restarted Redis within 20 s")
	}
	untilCapped(t, procs, true, "override enforced after Redis restarted")

	// A fourth sidecar: its first checks already enforce it, on ext_authz
	// and on the HTTP front-end alike.
	late := startFleetWith(t, 1, f.redis.Addr(), f.prefix, launchOpts{httpAuthz: true}, "--config", f.config)[0]
	uid := freshUID("http")
	for i := range 3 {
		a := late.CheckHTTP("/x", "x-uid", uid)
		if want := vAllowed; i == 2 && a.Verdict() != vDenied || i < 2 && a.Verdict() != want {
			t.Fatalf("a sidecar started during the override: HTTP request %d of a fresh uid: %s", i+1, a)
		}
	}
	if !capped(t, late) {
		t.Fatal("a sidecar started during the override: its first checks do not enforce it")
	}
}

// TestLimitsRefused: an unknown rule, a raise without --allow-raise and a
// duration beyond the maximum are refused with errors that say so.
func TestLimitsRefused(t *testing.T) {
	f := newLimitsFleet(t)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"set", "--rule", "nope", "--requests", "2", "--for", "1m"}, `unknown rule "nope"`},
		{[]string{"set", "--rule", "uid", "--requests", "2000", "--for", "1m"}, "--allow-raise"},
		{[]string{"set", "--rule", "uid", "--shadow", "--for", "1m"}, "--allow-raise"},
		{[]string{"set", "--rule", "uid", "--requests", "2", "--for", "25h"}, "maximum of 24h"},
	} {
		out, err := f.limitsErr(tc.args...)
		if err == nil || !strings.Contains(out, tc.want) {
			t.Errorf("limits %s: err %v, output %q; want a refusal saying %q", strings.Join(tc.args, " "), err, out, tc.want)
		}
	}
	if out := f.limits(t, "list"); !strings.Contains(out, `"overrides": []`) {
		t.Errorf("refused overrides were set: %s", out)
	}
}

// TestLimitsOverrideRLS: an override of a ratelimit service's rule, named
// by its domain and descriptor path, is enforced on ShouldRateLimit.
func TestLimitsOverrideRLS(t *testing.T) {
	f := newLimitsFleet(t)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "edge.yaml"), []byte(`domain: edge
descriptors:
  - key: client
    rate_limit:
      unit: minute
      requests_per_unit: 1000
`), 0o644); err != nil {
		t.Fatal(err)
	}
	p := startFleet(t, 1, f.redis.Addr(), f.prefix, "--rls-config", dir)[0]
	client := rlsv3.NewRateLimitServiceClient(p.conn)
	// over sends three calls of a fresh client: whether the third is over.
	over := func() bool {
		c := freshUID("rls")
		var code rlsv3.RateLimitResponse_Code
		for range 3 {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			resp, err := client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{{
				Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "client", Value: c}}}}})
			cancel()
			if err != nil {
				t.Fatalf("ShouldRateLimit: %v", err)
			}
			code = resp.GetOverallCode()
		}
		return code == rlsv3.RateLimitResponse_OVER_LIMIT
	}
	if over() {
		t.Fatal("over the limit before any override")
	}
	rls := []string{"--redis-addr", f.redis.Addr(), "--key-prefix", f.prefix, "--rls-config", dir, "--json"}
	if out, err := exec.Command(flashgateBin, append([]string{"limits", "set", "--domain", "edge", "--rule", "nope", "--requests", "2", "--for", "5m"}, rls...)...).CombinedOutput(); err == nil || !strings.Contains(string(out), "unknown rule") {
		t.Fatalf("an unknown ratelimit rule: %v, %s", err, out)
	}
	if out, err := exec.Command(flashgateBin, append([]string{"limits", "set", "--domain", "edge", "--rule", "client", "--requests", "2", "--for", "5m"}, rls...)...).CombinedOutput(); err != nil {
		t.Fatalf("limits set: %v\n%s", err, out)
	}
	if _, ok := waitFor(10*time.Second, over); !ok {
		t.Fatal("the override of the ratelimit rule not enforced within 10 s")
	}
}
