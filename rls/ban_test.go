package rls

import (
	"context"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/flashgate/flashgate/enforce/enforcetest"
	"github.com/flashgate/flashgate/window"
	"github.com/flashgate/flashgate/window/guard"
)

// TestPenaltyBoxOnlyWhenAsked: with serve's penalty box (5 denials in 10s
// → 5m), a client bursting on a rule that does not ask for a ban, as no
// ratelimit config does, is admitted again once the window reopens, never
// refused by a ban; on a rule with "ban: {}" the same burst bans it.
func TestPenaltyBoxOnlyWhenAsked(t *testing.T) {
	_, red := startRedis(t, 2*time.Second)
	cfg, err := ParseFiles([]File{{Name: "b.yaml", Data: []byte(`domain: b
descriptors:
  - key: plain
    rate_limit: {unit: second, requests_per_unit: 3}
  - key: boxed
    ban: {}
    rate_limit: {unit: second, requests_per_unit: 3}
`)}})
	if err != nil {
		t.Fatal(err)
	}
	g, err := guard.NewGuard(red, guard.GuardOptions{Ban: window.DefaultBan})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(g.Close)
	keys, err := window.NewKeys("penalty")
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	s := newServer(t, cfg, testOptions{Options: Options{Keys: keys}, coreOptions: coreOptions{Limiter: g, Registerer: reg}})
	call := func(key string) *rlsv3.RateLimitResponse {
		t.Helper()
		resp, err := s.ShouldRateLimit(context.Background(), request("b", desc(key, "1.2.3.4")))
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	burst := func(key string) {
		t.Helper()
		for range 20 {
			call(key)
		}
	}
	// readmitted waits for key's window to reopen, as a client retrying
	// every 50ms would; it reports whether it did within the deadline.
	readmitted := func(key string, within time.Duration) bool {
		t.Helper()
		for end := time.Now().Add(within); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
			if call(key).GetOverallCode() == ok {
				return true
			}
		}
		return false
	}

	burst("plain")
	if !readmitted("plain", 30*time.Second) {
		t.Fatal("a rule without ban: still refused 30s after a burst")
	}
	if n := enforcetest.Counter(t, reg, "flashgate_rls_local_denials_total", "banned"); n != 0 {
		t.Fatalf("a rule without ban: %v local ban refusals, want 0", n)
	}

	burst("boxed")
	if n := enforcetest.Counter(t, reg, "flashgate_rls_local_denials_total", "banned"); n < 1 {
		t.Fatalf("a rule with ban: {}: %v local ban refusals after 20 denials, want some", n)
	}
	// Past its 1s window the key is still refused, by the ban.
	time.Sleep(1500 * time.Millisecond)
	resp := call("boxed")
	if resp.GetOverallCode() != over || untilResetOf(t, resp, 0) < 200 {
		t.Fatalf("a banned key past its window: %s, reset %ds; want OVER_LIMIT, reset about 300s", resp.GetOverallCode(), untilResetOf(t, resp, 0))
	}
}
