package httpauthz_test

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/flashgate/flashgate/enforce"
	"github.com/flashgate/flashgate/enforce/enforcetest"
	"github.com/flashgate/flashgate/window"
	"github.com/flashgate/flashgate/window/fallback"
	"github.com/flashgate/flashgate/window/redisstore"
	"github.com/flashgate/flashgate/window/redistest"
)

// TestRedis: the front-end on the ext_authz server on a real redis-server:
// 5 admissions per x-uid then 429; with Redis killed, each failure mode
// answers through HTTP as over gRPC (local: the per-process share; allow:
// 200; deny: 429), never a 5xx, with well-formed headers; with Redis back,
// Redis decides again.
func TestRedis(t *testing.T) {
	rs := redistest.Start(t)
	// A round trip may take long on a loaded machine while Redis is up; once
	// it is down, the refused connection fails a check at once.
	client, err := redisstore.NewClient(redisstore.ClientConfig{Addrs: []string{rs.Addr()}, Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Close() })
	modes := []enforce.FailureMode{enforce.FailureLocal, enforce.FailureAllow, enforce.FailureDeny}
	envs := map[enforce.FailureMode]*env{}
	for _, mode := range modes {
		red, err := redisstore.New(client, redisstore.Options{})
		if err != nil {
			t.Fatal(err)
		}
		fb, err := fallback.New(fallback.Options{})
		if err != nil {
			t.Fatal(err)
		}
		keys, err := window.NewKeys("h" + mode.String())
		if err != nil {
			t.Fatal(err)
		}
		envs[mode] = serveOn(t, rulesYAML, "", enforce.Options{Limiter: red, Fallback: fb, FailureMode: mode}, keys)
	}
	// run sends n checks for uid through nginx's headers and returns how
	// many were admitted, failing on any other answer than 200 or 429.
	run := func(t *testing.T, e *env, uid string, n int) int {
		t.Helper()
		ok := 0
		for range n {
			r := e.do("GET", "/auth", "X-Original-URI", "/api/coupon/1", "X-Original-Method", "POST", "X-Uid", uid)
			checkGrammar(t, r)
			mirrors(t, r, e.rec.lastAnswer(), 0)
			switch r.status {
			case http.StatusOK:
				ok++
			case http.StatusTooManyRequests:
			default:
				t.Fatalf("%s, want 200 or 429", r)
			}
		}
		return ok
	}
	for _, mode := range modes {
		if got := run(t, envs[mode], "up", 7); got != 5 {
			t.Errorf("%s, Redis up: %d of 7 admitted, want 5", mode, got)
		}
	}

	rs.Kill()
	want := map[enforce.FailureMode]int{enforce.FailureLocal: 5, enforce.FailureAllow: 7, enforce.FailureDeny: 0}
	for _, mode := range modes {
		t.Run("down/"+mode.String(), func(t *testing.T) {
			if got := run(t, envs[mode], "down", 7); got != want[mode] {
				t.Errorf("%d of 7 admitted, want %d", got, want[mode])
			}
		})
	}

	rs.Restart()
	for _, mode := range modes {
		e := envs[mode]
		// Once the client reconnects, Redis decides again: a fresh user gets
		// 5 of 7 with no failure-mode decision.
		fm := func() float64 {
			return enforcetest.Counter(t, e.reg, "flashgate_failure_mode_decisions_total", mode.String())
		}
		deadline := time.Now().Add(10 * time.Second)
		for i := 0; ; i++ {
			before := fm()
			if got := run(t, e, fmt.Sprintf("back%d", i), 7); got == 5 && fm() == before {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: checks did not go back to Redis", mode)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
}
