package main

import (
	"context"
	"encoding/json"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/flashgate/flashgate/daemon/keyadmin"
	"github.com/flashgate/flashgate/internal/checkreq"
	"github.com/flashgate/flashgate/window"
	"github.com/flashgate/flashgate/window/redisstore"
	"github.com/flashgate/flashgate/window/redistest"
)

// fleet is a serve on a real redis-server (the example rules, windows
// stretched to a minute) and the flags that point an operator command at
// the same Redis, key prefix and rules.
type fleet struct {
	*runningServe
	ops []string
}

func startFleet(t *testing.T, prefix string, extra ...string) *fleet {
	t.Helper()
	r := redistest.Start(t)
	cfg := everyRuleBans(t, exampleStretched(t))
	ops := append([]string{"--redis-addr", r.Addr(), "--key-prefix", prefix, "--config", cfg}, extra...)
	// A generous budget: a timeout would fall back to the local failure
	// mode and miss Redis's count.
	s := startServe(t, append([]string{"--backend", "redis", "--redis-timeout", "1s", "--fleet-size", "1"}, ops...)...)
	waitFor(t, eventually, "SERVING", func() bool { return s.Serving() })
	return &fleet{runningServe: s, ops: ops}
}

// everyRuleBans rewrites descriptors file file so that every rule asks
// for serve's penalty box (ban: {}), as a hand ban needs, and returns it.
func everyRuleBans(t *testing.T, file string) string {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, l := range strings.Split(string(data), "\n") {
		if strings.TrimSpace(l) == "" || strings.HasPrefix(strings.TrimSpace(l), "ban:") {
			continue
		}
		out = append(out, l)
		if i := strings.Index(l, "rate_limit:"); i >= 0 {
			out = append(out, l[:i]+"ban: {}")
		}
	}
	if err := os.WriteFile(file, []byte(strings.Join(out, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return file
}

// run runs an operator command (args, then the fleet's flags) and returns
// its output; it fails the test on an error.
func (f *fleet) run(t *testing.T, args ...string) string {
	t.Helper()
	out, errOut, err := runCmd(t, context.Background(), append(args, f.ops...)...)
	if err != nil {
		t.Fatalf("flashgate %s: %v\n%s%s", strings.Join(args, " "), err, out, errOut)
	}
	return out
}

// runJSON runs an operator command with --json and decodes its output
// into v, strictly.
func (f *fleet) runJSON(t *testing.T, v any, args ...string) {
	t.Helper()
	out := f.run(t, append(args, "--json")...)
	dec := json.NewDecoder(strings.NewReader(out))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		t.Fatalf("flashgate %s --json: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// inspect returns what inspect --json says of rule and value.
func (f *fleet) inspect(t *testing.T, rule, value string) keyadmin.Inspection {
	t.Helper()
	var r keyadmin.Inspection
	f.runJSON(t, &r, "inspect", "--rule", rule, "--value", value)
	return r
}

// check sends one check of uid and returns flashgate check's answer.
func (f *fleet) check(t *testing.T, uid string) checkreq.Result {
	t.Helper()
	out, _, err := runCmd(t, context.Background(), "check", "--addr", f.grpcAddr, "--path", "/api/coupon/7",
		"-H", "x-uid: "+uid, "--ip", "192.0.2.7", "--json")
	if err != nil {
		t.Fatalf("check: %v\n%s", err, out)
	}
	var r checkreq.Result
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("check --json: %v\n%s", err, out)
	}
	return r
}

// TestInspectMidBurst: inspect on a user in the middle of a burst reports
// the count that the next check confirms (its x-ratelimit-remaining is
// limit - count - 1), then a full window that admits again within it.
func TestInspectMidBurst(t *testing.T) {
	f := startFleet(t, "insp")
	if r := f.inspect(t, "coupon_per_uid", "bob"); r.Count != 0 || r.Full || !r.Oldest.IsZero() || r.Banned {
		t.Fatalf("before any check: %+v", r)
	}
	for i := range 3 {
		if a := f.check(t, "bob"); !a.Allowed {
			t.Fatalf("check %d denied: %+v", i+1, a)
		}
	}
	r := f.inspect(t, "coupon_per_uid", "bob")
	if r.Count != 3 || r.Limit != 5 || r.WindowMS != 60000 || r.Full || r.Banned || r.Rule != "coupon_per_uid" {
		t.Fatalf("after 3 checks: %+v", r)
	}
	if r.Oldest.IsZero() || r.Newest.Before(r.Oldest) || r.Newest.After(r.Now) || !r.AdmitsAt.Equal(r.Now) {
		t.Errorf("oldest %s, newest %s, admits at %s, now %s", r.Oldest, r.Newest, r.AdmitsAt, r.Now)
	}
	a := f.check(t, "bob")
	if want := strconv.Itoa(r.Limit - r.Count - 1); !a.Allowed || a.Headers["x-ratelimit-remaining"] != want {
		t.Errorf("the next check: %+v, want allowed with %s remaining", a, want)
	}
	// The client IP's rule counted every check too.
	if ip := f.inspect(t, "per_ip", "192.0.2.7"); ip.Count != 4 || ip.Limit != 100 {
		t.Errorf("per_ip: %+v, want 4 of 100", ip)
	}

	f.check(t, "bob")
	if a := f.check(t, "bob"); a.Allowed {
		t.Fatalf("the 6th check allowed: %+v", a)
	}
	r = f.inspect(t, "coupon_per_uid", "bob")
	if r.Count != 5 || !r.Full || !r.AdmitsAt.After(r.Now) || r.AdmitsAt.Sub(r.Oldest) != time.Minute {
		t.Errorf("full window: %+v, want 5, admitting a minute after the oldest", r)
	}
	// The table says the same.
	table := f.run(t, "inspect", "--rule", "coupon_per_uid", "--value", "bob")
	for _, want := range []string{"coupon_per_uid", r.Key, "5 of 5 per 1m0s", "banned       no"} {
		if !strings.Contains(table, want) {
			t.Errorf("table lacks %q:\n%s", want, table)
		}
	}
}

// TestInspectRLS: the ratelimit service's key of a domain and descriptor
// entries counts its calls.
func TestInspectRLS(t *testing.T) {
	f := startFleet(t, "inrls", "--rls-config", rlsDir(t))
	conn, err := grpc.NewClient(f.grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	req := &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{{
		Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "remote_address", Value: "203.0.113.9"}},
	}}}
	ctx, cancel := context.WithTimeout(context.Background(), eventually)
	defer cancel()
	if resp, err := rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, req); err != nil || resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
		t.Fatalf("ShouldRateLimit: %v, %v", resp, err)
	}
	var r keyadmin.Inspection
	f.runJSON(t, &r, "inspect", "--domain", "edge", "--entry", "remote_address=203.0.113.9")
	if r.Count != 1 || r.Limit != 2 || r.WindowMS != 60000 || r.Domain != "edge" || r.Rule != "remote_address" {
		t.Errorf("inspect: %+v, want 1 of 2 per minute, domain edge", r)
	}
	_, _, err = runCmd(t, context.Background(), append([]string{"inspect", "--domain", "edge", "--entry", "nope=1"}, f.ops...)...)
	if err == nil || !strings.Contains(err.Error(), "no rule of domain edge limits the descriptor") {
		t.Errorf("unmatched descriptor: %v", err)
	}
}

// TestOpsErrors: an unknown rule, a value the rule never sees, the memory
// backend and missing flags are errors that say so, before any Redis
// call (the address is closed).
func TestOpsErrors(t *testing.T) {
	redis := []string{"--redis-addr", "127.0.0.1:1"}
	tests := map[string]struct {
		args []string
		want string
		// noRedis: without --redis-addr.
		noRedis bool
	}{
		"unknown rule":          {args: []string{"inspect", "--rule", "nope", "--value", "x"}, want: `unknown rule "nope"`},
		"not an IP":             {args: []string{"inspect", "--rule", "per_ip", "--value", "alice"}, want: `"alice" is not an IP address`},
		"header with a comma":   {args: []string{"bans", "add", "--rule", "coupon_per_uid", "--value", "a,b", "--for", "1m"}, want: "comma"},
		"two values for one":    {args: []string{"bans", "lift", "--rule", "coupon_per_uid", "--value", "a", "--value", "b"}, want: "keys 1 request value(s)"},
		"no rule":               {args: []string{"inspect", "--value", "x"}, want: "--rule is missing"},
		"list unknown rule":     {args: []string{"bans", "list", "--rule", "nope"}, want: `unknown rule "nope"`},
		"add without for":       {args: []string{"bans", "add", "--rule", "per_ip", "--value", "10.0.0.1"}, want: `"for" not set`},
		"add for nothing":       {args: []string{"bans", "add", "--rule", "per_ip", "--value", "10.0.0.1", "--for", "0s"}, want: "--for 0s: must be positive"},
		"penalty box off":       {args: []string{"bans", "add", "--rule", "coupon_per_device", "--value", "d1", "--for", "1m", "--ban-duration", "0"}, want: "penalty box off"},
		"rule asks no ban":      {args: []string{"bans", "add", "--rule", "per_ip", "--value", "10.0.0.1", "--for", "1m"}, want: "it asks for no ban"},
		"add for too long":      {args: []string{"bans", "add", "--rule", "coupon_per_device", "--value", "d1", "--for", "2562047h"}, want: "--for 2562047h0m0s: longer than the maximum of 8760h0m0s (one year)"},
		"inspect no value":      {args: []string{"inspect", "--rule", "coupon_per_uid"}, want: "--value is missing: rule coupon_per_uid keys 1 request value(s)"},
		"domain without config": {args: []string{"inspect", "--domain", "edge", "--entry", "a=b"}, want: "need --rls-config"},
		"rule and domain":       {args: []string{"inspect", "--rule", "per_ip", "--domain", "edge"}, want: "give one pair"},
		"bad entry":             {args: []string{"inspect", "--rls-config", "DIR", "--domain", "edge", "--entry", "novalue"}, want: "want key=value"},
		"unknown domain":        {args: []string{"bans", "list", "--rls-config", "DIR", "--domain", "nope"}, want: `unknown domain "nope"`},
		"memory backend":        {args: []string{"bans", "list", "--backend", "memory"}, want: "inspect and bans work on the redis backend"},
		"no redis":              {args: []string{"inspect", "--rule", "per_ip", "--value", "10.0.0.1"}, want: "--redis-addr is missing", noRedis: true},
	}
	dir := rlsDir(t)
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			args := append([]string{}, tc.args...)
			if !tc.noRedis {
				args = append(args, redis...)
			}
			for i, a := range args {
				if a == "DIR" {
					args[i] = dir
				}
			}
			_, _, err := runCmd(t, context.Background(), args...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want one containing %q", err, tc.want)
			}
		})
	}
	// serve's environment points the commands at the memory backend: said so.
	var out strings.Builder
	err := runEnv(context.Background(), []string{"bans", "list"}, env{stdout: &out, stderr: &out, lookupEnv: func(k string) (string, bool) {
		return map[string]string{"FLASHGATE_BACKEND": "memory"}[k], k == "FLASHGATE_BACKEND"
	}})
	if err == nil || !strings.Contains(err.Error(), "--backend memory") {
		t.Errorf("FLASHGATE_BACKEND=memory: %v", err)
	}
}

// TestInspectHeldSlots: inspect lists the slots sidecars hold in a key's
// window by running leases, per sidecar, with the leases' ends.
func TestInspectHeldSlots(t *testing.T) {
	f := startFleet(t, "insl")
	key := f.inspect(t, "coupon_per_uid", "dora").Key
	c, err := redisstore.NewClient(redisstore.ClientConfig{Addrs: []string{f.ops[1]}, Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s, err := redisstore.New(c, redisstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	lim := window.Limit{Requests: 5, Window: time.Minute}
	for _, want := range []int{2, 1} {
		// Leases long enough to be running when inspect reads them.
		c := redisstore.LeaseCall{Key: key, Limit: lim, For: 30 * time.Second, ID: s.LeaseID(), Want: want}
		if g, err := s.Lease(context.Background(), c); err != nil || g.Slots != want {
			t.Fatalf("lease of %d: %+v, %v", want, g, err)
		}
	}
	r := f.inspect(t, "coupon_per_uid", "dora")
	if r.Count != 3 || len(r.Held) != 1 || r.Held[0].Sidecar != s.ID() || r.Held[0].Slots != 3 || len(r.Held[0].Ends) != 2 {
		t.Fatalf("inspect of 3 leased slots: %+v, held %+v; want 3 held by %s in 2 leases", r, r.Held, s.ID())
	}
	table := f.run(t, "inspect", "--rule", "coupon_per_uid", "--value", "dora")
	if want := "3 slots by sidecar " + s.ID(); !strings.Contains(table, want) {
		t.Errorf("table lacks %q:\n%s", want, table)
	}
}
