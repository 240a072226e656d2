package main

import (
	"context"
	"net/netip"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashgate/flashgate/window/redistest"
)

// TestBenchCostAgainstRedis: flashgate-bench with --shape envoy against a
// flashgate serve process on a real Redis reports the server's CPU, Redis's
// CPU and the script calls that decided the checks.
func TestBenchCostAgainstRedis(t *testing.T) {
	r := redistest.Start(t)
	addr, pid := startServe(t, "--backend", "redis", "--redis-addr", r.Addr(), "--key-prefix", "tcost", "--redis-timeout", "1s")
	res := benchJSON(t, "--addr", addr, "--duration", "1s", "--concurrency", "2", "--users", "5000",
		"--shape", "envoy", "--server-pid", strconv.Itoa(pid), "--redis-addr", r.Addr(), "--quiet")
	checkBenchInvariants(t, res)
	if res.Shape != "envoy" {
		t.Errorf("shape %q, want envoy", res.Shape)
	}
	if res.Requests == 0 || res.Allowed == 0 {
		t.Fatalf("no admitted requests: %+v", res)
	}
	if res.ServerCPUS <= 0 || res.ServerCPUPerCheck <= 0 {
		t.Errorf("server CPU %gs (%g µs per check): want > 0 (the server process answered every check)", res.ServerCPUS, res.ServerCPUPerCheck)
	}
	// 5,000 users: a user repeats rarely and never reaches a limit, so the
	// local cache refuses nothing and every check reaches Redis, alone or
	// in a batch with the other worker's (at most 2 per script call with 2
	// workers); the fleet heartbeat adds one call a second (the warm-up
	// health checks none).
	if beats := int64(res.DurationS) + 2; 2*res.ScriptCalls < int64(res.Allowed) || res.ScriptCalls > int64(res.Requests)+beats {
		t.Errorf("%d script calls for %d checks (%d allowed): want one per check or per batch of two, plus at most %d heartbeats", res.ScriptCalls, res.Requests, res.Allowed, beats)
	}
	// Every script call is a command and runs some (TIME, ZCARD, ZADD,
	// PEXPIRE for a fresh key), all counted by total_commands_processed.
	if res.RedisCommands <= res.ScriptCalls || res.RedisCommandsPerCheck > 20 {
		t.Errorf("%d Redis commands (%.2f per check) for %d script calls: want more than the calls, at most 20 per check",
			res.RedisCommands, res.RedisCommandsPerCheck, res.ScriptCalls)
	}
	if res.RedisCPUS < 0 {
		t.Errorf("Redis CPU %gs", res.RedisCPUS)
	}
}

// TestEnvoyShapedRequest: --shape envoy's request is what Envoy sends:
// about twenty headers with the pseudo-headers, a 1 KB cookie, the client
// IP in x-forwarded-for, context_extensions; the rules' headers survive.
func TestEnvoyShapedRequest(t *testing.T) {
	u, err := newUserRequests(benchOptions{shape: "envoy", method: "POST", path: "/api/coupon/1", users: 10})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := u.encode(4); err != nil {
		t.Fatal(err)
	}
	a := u.tmpl.GetAttributes()
	h := a.GetRequest().GetHttp().GetHeaders()
	if n := len(h); n < 20 {
		t.Errorf("%d headers, want about 20", n)
	}
	for _, k := range []string{":authority", ":method", ":path", "x-request-id", "x-uid", "x-device-fp", "user-agent", "x-forwarded-proto"} {
		if h[k] == "" {
			t.Errorf("header %s missing", k)
		}
	}
	if len(h["cookie"]) < 1000 {
		t.Errorf("cookie of %d bytes, want about 1 KB", len(h["cookie"]))
	}
	ip := a.GetSource().GetAddress().GetSocketAddress().GetAddress()
	if _, err := netip.ParseAddr(ip); err != nil || h["x-forwarded-for"] != ip {
		t.Errorf("x-forwarded-for %q, source %q: want the user's IP in both", h["x-forwarded-for"], ip)
	}
	if a.GetContextExtensions()["route"] == "" {
		t.Errorf("context_extensions %v", a.GetContextExtensions())
	}
	if _, err := newUserRequests(benchOptions{shape: "huge"}); err != nil {
		t.Fatal(err) // the shape is checked by validate, not here
	}
	if err := (benchOptions{shape: "huge", duration: time.Second, concurrency: 1, connections: 1, users: 1}).validate(); err == nil {
		t.Error("--shape huge accepted")
	}
}

// TestBenchFleet: with a fleet (--addr and --server-pid each a
// comma-separated list) the workers spread over every server, each serve
// writing under its own key prefix in the one Redis, and the server CPU is
// the fleet's.
func TestBenchFleet(t *testing.T) {
	r := redistest.Start(t)
	a1, p1 := startServe(t, "--backend", "redis", "--redis-addr", r.Addr(), "--key-prefix", "fleeta", "--redis-timeout", "1s")
	a2, p2 := startServe(t, "--backend", "redis", "--redis-addr", r.Addr(), "--key-prefix", "fleetb", "--redis-timeout", "1s")
	res := benchJSON(t, "--addr", a1+","+a2, "--duration", "1s", "--concurrency", "2", "--users", "5000",
		"--server-pid", strconv.Itoa(p1)+","+strconv.Itoa(p2), "--redis-addr", r.Addr(), "--rate", "200", "--quiet")
	checkBenchInvariants(t, res)
	if res.ServerCPUS <= 0 {
		t.Errorf("server CPU %gs: want > 0", res.ServerCPUS)
	}
	rdb := redis.NewClient(&redis.Options{Addr: r.Addr(), Protocol: 2})
	defer rdb.Close()
	for _, prefix := range []string{"fleeta", "fleetb"} {
		keys, _, err := rdb.Scan(context.Background(), 0, prefix+"*", 100000).Result()
		if err != nil {
			t.Fatal(err)
		}
		if len(keys) == 0 {
			t.Errorf("no key under %s: its serve got no check", prefix)
		}
	}
}
