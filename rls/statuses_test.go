package rls

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/flashgate/flashgate/enforce"
	"github.com/flashgate/flashgate/enforce/enforcetest"
	"github.com/flashgate/flashgate/window"
	"github.com/flashgate/flashgate/window/guard"
	"github.com/flashgate/flashgate/window/memory"
	"github.com/flashgate/flashgate/window/testclock"
)

// resetConfig has a limit of a second and one of a minute.
const resetConfig = `domain: reset
descriptors:
  - key: per_second
    rate_limit: {unit: second, requests_per_unit: 2}
  - key: per_minute
    rate_limit: {unit: minute, requests_per_unit: 3}
`

// untilResetOf returns status i's duration_until_reset in whole seconds,
// failing when it carries sub-second nanos.
func untilResetOf(t *testing.T, resp *rlsv3.RateLimitResponse, i int) int64 {
	t.Helper()
	d := resp.GetStatuses()[i].GetDurationUntilReset()
	if d.GetNanos() != 0 {
		t.Fatalf("status %d: duration_until_reset %v has nanos; want whole seconds", i, d.AsDuration())
	}
	return d.GetSeconds()
}

// TestDurationUntilReset: duration_until_reset is whole seconds rounded
// up, never 0 while time is left; an admission's is when the window's
// oldest admission leaves it, ticking down as time passes.
func TestDurationUntilReset(t *testing.T) {
	clk := testclock.New()
	mem, err := memory.New(memory.Options{Now: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := ParseFiles([]File{{Name: "reset.yaml", Data: []byte(resetConfig)}})
	if err != nil {
		t.Fatal(err)
	}
	s := newServer(t, cfg, testOptions{coreOptions: coreOptions{Limiter: mem, Registerer: prometheus.NewRegistry(), Now: clk.Now}})
	call := func(key string, code rlsv3.RateLimitResponse_Code, remaining uint32, reset int64) {
		t.Helper()
		resp, err := s.ShouldRateLimit(context.Background(), request("reset", desc(key, "v")))
		if err != nil {
			t.Fatal(err)
		}
		st := resp.GetStatuses()[0]
		got := untilResetOf(t, resp, 0)
		if st.GetCode() != code || st.GetLimitRemaining() != remaining || got != reset {
			t.Fatalf("%s at %s: {%s remaining %d reset %ds}, want {%s remaining %d reset %ds}", key, clk.Now().Format("05.000"),
				st.GetCode(), st.GetLimitRemaining(), got, code, remaining, reset)
		}
	}
	// The minute: the first admission's reset is the window; it ticks
	// down with the oldest admission's age.
	call("per_minute", ok, 2, 60)
	clk.Advance(20400 * time.Millisecond)
	call("per_minute", ok, 1, 40) // 39.6 s left: rounded up
	clk.Advance(39 * time.Second)
	call("per_minute", ok, 0, 1) // 0.6 s left
	clk.Advance(500 * time.Millisecond)
	call("per_minute", over, 0, 1) // 0.1 s left: still 1, never 0
	clk.Advance(100 * time.Millisecond)
	call("per_minute", ok, 0, 21) // the oldest left; the next leaves at 20.4 s

	// The second: never 0 while time is left.
	call("per_second", ok, 1, 1)
	clk.Advance(300 * time.Millisecond)
	call("per_second", ok, 0, 1)
	call("per_second", over, 0, 1)
}

// envoyBinding returns the status Envoy's ratelimit filter takes its
// x-ratelimit-limit, -remaining and -reset from: among the statuses with a
// current_limit, the one with the fewest remaining, the first among equals
// (XRateLimitHeaderUtils); -1 for none.
func envoyBinding(sts []*rlsv3.RateLimitResponse_DescriptorStatus) int {
	best := -1
	for i, st := range sts {
		if st.GetCurrentLimit() == nil {
			continue
		}
		if best < 0 || st.GetLimitRemaining() < sts[best].GetLimitRemaining() {
			best = i
		}
	}
	return best
}

// TestLocalRefusalNamesRefusingLimit: when the local over-limit cache
// refuses a request on one descriptor's full window, the descriptors it
// did not count carry no limit, so that Envoy's x-ratelimit headers name
// the refusing limit and its reset, whatever the descriptors' order.
func TestLocalRefusalNamesRefusingLimit(t *testing.T) {
	_, red := startRedis(t, 2*time.Second)
	for n, order := range []string{"refusing last", "refusing first"} {
		t.Run(order, func(t *testing.T) {
			g, err := guard.NewGuard(red, guard.GuardOptions{})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(g.Close)
			keys, err := window.NewKeys(fmt.Sprintf("refusal%d", n))
			if err != nil {
				t.Fatal(err)
			}
			reg := prometheus.NewRegistry()
			s := newServer(t, loadGood(t), testOptions{Options: Options{Keys: keys}, coreOptions: coreOptions{Limiter: g, Registerer: reg}})
			// remote_address: 3 a minute; the marketing number: 2 a minute.
			ip, msg := desc("remote_address", "1.1.1.1"), desc("message_type", "marketing", "to_number", "1")
			req, refusing := request("basic", ip, msg), 1
			if n == 1 {
				req, refusing = request("basic", msg, ip), 0
			}
			var resp *rlsv3.RateLimitResponse
			for i := range 4 {
				if resp, err = s.ShouldRateLimit(context.Background(), req); err != nil {
					t.Fatal(err)
				}
				if want := i < 2; (resp.GetOverallCode() == ok) != want {
					t.Fatalf("call %d: %s", i+1, resp.GetOverallCode())
				}
			}
			if local := enforcetest.Counter(t, reg, "flashgate_rls_local_denials_total", "full"); local < 1 {
				t.Fatalf("the last refusal was not the local cache's (%v local denials)", local)
			}
			sts := resp.GetStatuses()
			b := envoyBinding(sts)
			if b != refusing {
				t.Fatalf("Envoy would take its headers from status %d (%v), want %d, the refusing one; statuses %v", b, sts[max(b, 0)], refusing, sts)
			}
			if st := sts[b]; st.GetCode() != over || st.GetCurrentLimit().GetRequestsPerUnit() != 2 || st.GetLimitRemaining() != 0 ||
				untilResetOf(t, resp, b) < 1 || untilResetOf(t, resp, b) > 60 {
				t.Fatalf("refusing status %v, want OVER_LIMIT, limit 2, remaining 0, reset 1..60 s", st)
			}
			if other := sts[1-refusing]; other.GetCode() != ok || other.GetCurrentLimit() != nil {
				t.Fatalf("uncounted status %v, want OK without a limit", other)
			}
		})
	}
}

// TestFailureDenyNamesRefusingLimit: when the backend fails and one
// descriptor's failure mode refuses, the others carry no limit either.
func TestFailureDenyNamesRefusingLimit(t *testing.T) {
	cfg, err := ParseFiles([]File{{Name: "f.yaml", Data: []byte(`domain: f
descriptors:
  - key: open
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: closed
    failure_mode: deny
    rate_limit: {unit: minute, requests_per_unit: 5}
`)}})
	if err != nil {
		t.Fatal(err)
	}
	s, _ := newMemoryServer(t, cfg, func(o *testOptions) { o.Limiter = failing{}; o.FailureMode = enforce.FailureAllow })
	resp, err := s.ShouldRateLimit(context.Background(), request("f", desc("open", "x"), desc("closed", "y")))
	if err != nil {
		t.Fatal(err)
	}
	if resp.GetOverallCode() != over {
		t.Fatalf("overall %s, want OVER_LIMIT", resp.GetOverallCode())
	}
	if b := envoyBinding(resp.GetStatuses()); b != 1 {
		t.Fatalf("Envoy would take its headers from status %d, want 1; statuses %v", b, resp.GetStatuses())
	}
}

// TestReloadNotified: a config directory's change is installed on a
// file-system notification, with a poll far too slow to matter: a file
// added to the config subdirectory (ratelimit's runtime layout).
func TestReloadNotified(t *testing.T) {
	dir := t.TempDir()
	sub := dir + "/config"
	if err := os.Mkdir(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(sub+"/a.yaml", []byte(domainYAML("a", "x")), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := LoadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	s, _ := newMemoryServer(t, cfg, nil)
	// A change made before Watch starts is installed by its first read;
	// once it is in, that read is done, and only a notification (or the
	// hour's poll) can install the next.
	if err := os.WriteFile(sub+"/a.yaml", []byte(domainYAML("a0", "x")), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- s.Reloader(dir).Watch(ctx, time.Hour) }()
	defer func() { cancel(); <-done }()
	waitUntil(t, "domain a0, by Watch's first read", func() bool { return s.Config().domains["a0"] != nil })
	if err := os.WriteFile(sub+"/b.yaml", []byte(domainYAML("b", "y")), 0o644); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "domain b, told by a notification", func() bool { return s.Config().domains["b"] != nil })
}

// TestAdmitResetTicksOnRedis: on Redis (its TIME), an admitted
// descriptor's duration_until_reset is when the oldest admission leaves
// the window, so a later admission's is shorter than the window.
func TestAdmitResetTicksOnRedis(t *testing.T) {
	_, red := startRedis(t, 2*time.Second)
	keys, err := window.NewKeys("ticks")
	if err != nil {
		t.Fatal(err)
	}
	s := newServer(t, loadGood(t), testOptions{Options: Options{Keys: keys}, coreOptions: coreOptions{Limiter: red, Registerer: prometheus.NewRegistry()}})
	req := request("basic", desc("remote_address", "192.0.2.1")) // 3 a minute
	first, err := s.ShouldRateLimit(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	if got := untilResetOf(t, first, 0); got != 60 {
		t.Fatalf("first admission: reset %ds, want the window, 60s", got)
	}
	time.Sleep(1100 * time.Millisecond)
	second, err := s.ShouldRateLimit(context.Background(), req)
	if err != nil {
		t.Fatal(err)
	}
	if got := untilResetOf(t, second, 0); got < 1 || got > 59 {
		t.Fatalf("admission over a second later: reset %ds, want when the first leaves, 1..59s", got)
	}
}
