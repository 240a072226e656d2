package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/flashgate/flashgate/daemon"
	"github.com/flashgate/flashgate/descriptors"
	"github.com/flashgate/flashgate/internal/testing/logtest"
	"github.com/flashgate/flashgate/window/redistest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// runningServe is an in-process `flashgate serve`.
type runningServe struct {
	*daemon.Daemon
	grpcAddr, httpAddr, httpAuthzAddr string
	logs                              *logtest.Buffer
	stop                              func() error // cancels serve's context and returns its error
}

// startServe runs serve in-process on free loopback ports: its flags parsed
// and its daemon built and served as the command does; the test's cleanup
// stops it.
func startServe(t *testing.T, args ...string) *runningServe {
	t.Helper()
	logs := &logtest.Buffer{}
	all := append([]string{"--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--log-format", "text", "--drain-timeout", "3s"}, args...)
	o, fs, err := parseServe(t, all, nil)
	if err != nil {
		t.Fatal(err)
	}
	c, err := o.parse(fs.Changed)
	if err != nil {
		t.Fatal(err)
	}
	d, err := newDaemon(env{stdout: io.Discard, stderr: logs}, c)
	if err != nil {
		t.Fatalf("serve: %v\n%s", err, logs)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- serveDaemon(ctx, d) }()
	var once sync.Once
	var stopErr error
	stop := func() error {
		once.Do(func() {
			cancel()
			select {
			case stopErr = <-done:
			case <-time.After(eventually):
				stopErr = fmt.Errorf("serve did not stop within %s", eventually)
			}
		})
		return stopErr
	}
	t.Cleanup(func() { _ = stop() })
	return &runningServe{Daemon: d, grpcAddr: d.GRPCAddr(), httpAddr: d.HTTPAddr(), httpAuthzAddr: d.HTTPAuthzAddr(), logs: logs, stop: stop}
}

// eventually bounds the wait for what must come to pass (SERVING, a
// reload, a log line) but has no deadline of its own: far beyond what it
// takes, so that a busy machine under -race is not taken for a hang.
const eventually = 30 * time.Second

// waitFor polls cond every 20ms until it holds or timeout passes.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func httpGet(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func grpcHealth(t *testing.T, addr string) healthpb.HealthCheckResponse_ServingStatus {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatalf("health check: %v", err)
	}
	return resp.GetStatus()
}

// checkLines runs `flashgate check` n times for uid against addr and returns
// its output lines.
func checkLines(t *testing.T, addr, uid string, n int) []string {
	t.Helper()
	out, _, err := runCmd(t, context.Background(), "check", "--addr", addr, "--path", "/api/coupon/7",
		"-H", "x-uid: "+uid, "-n", fmt.Sprint(n))
	if err != nil {
		t.Fatalf("check: %v\n%s", err, out)
	}
	return strings.Split(strings.TrimSpace(out), "\n")
}

// exampleStretched writes the built-in example rules with every window
// stretched from 1s to a minute and returns the file. Six checks one after
// the other always fit in a minute; in the example's second they need not,
// under -race on a busy machine.
func exampleStretched(t *testing.T) string {
	t.Helper()
	from, to := []byte("window: 1s}"), []byte("window: 1m}")
	y := descriptors.ExampleYAML()
	if n := bytes.Count(y, from); n == 0 || n != bytes.Count(y, []byte("window:")) {
		t.Fatalf("the built-in example has %d windows of 1s among %d: update exampleStretched", n, bytes.Count(y, []byte("window:")))
	}
	file := filepath.Join(t.TempDir(), "flashsale.yaml")
	if err := os.WriteFile(file, bytes.ReplaceAll(y, from, to), 0o644); err != nil {
		t.Fatal(err)
	}
	return file
}

var retryAfter = regexp.MustCompile(`retry-after: (\d+)`)

// assertSixthDenied sends 6 checks of one uid on the example rules, their
// windows stretched to a minute (exampleStretched): 5 pass, the 6th is a 429
// of coupon_per_uid with retry-after in whole seconds, 1 to 60.
func assertSixthDenied(t *testing.T, addr, uid string) {
	t.Helper()
	lines := checkLines(t, addr, uid, 6)
	for i, l := range lines[:5] {
		if !strings.Contains(l, " allowed 200 ") {
			t.Errorf("request %d: %q, want allowed", i+1, l)
		}
	}
	l := lines[5]
	if !strings.Contains(l, " denied 429 ") || !strings.Contains(l, "coupon_per_uid") {
		t.Errorf("request 6: %q, want a 429 of coupon_per_uid", l)
	} else if m := retryAfter.FindStringSubmatch(l); m == nil {
		t.Errorf("request 6: %q, want a retry-after", l)
	} else if n, _ := strconv.Atoi(m[1]); n < 1 || n > 60 {
		t.Errorf("request 6: retry-after %d, want 1 to 60 (seconds of a one-minute window)", n)
	}
}

func TestServeMemory(t *testing.T) {
	// Without --config the built-in example is in force, and said so.
	def := startServe(t)
	waitFor(t, eventually, "SERVING", func() bool { return def.Serving() })
	if err := def.stop(); err != nil {
		t.Fatalf("serve: %v", err)
	}
	if !strings.Contains(def.logs.String(), "built-in example") {
		t.Errorf("logs without --config lack %q:\n%s", "built-in example", def.logs)
	}

	s := startServe(t, "--config", exampleStretched(t))
	waitFor(t, eventually, "SERVING", func() bool { return s.Serving() })
	if st := grpcHealth(t, s.grpcAddr); st != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("gRPC health = %s", st)
	}
	if code, body := httpGet(t, "http://"+s.httpAddr+"/readyz"); code != 200 {
		t.Errorf("/readyz = %d %q", code, body)
	}
	assertSixthDenied(t, s.grpcAddr, "alice")
	// Another user is not affected.
	if l := checkLines(t, s.grpcAddr, "bob", 1); !strings.Contains(l[0], " allowed 200 ") {
		t.Errorf("bob: %q", l[0])
	}
	_, metrics := httpGet(t, "http://"+s.httpAddr+"/metrics")
	for _, want := range []string{
		`flashgate_checks_total{decision="denied",domain="flashsale",rule="coupon_per_uid"} 1`,
		"go_goroutines", "process_resident_memory_bytes",
		"flashgate_memory_evictions_total 0",
	} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	// alice's and bob's uid windows and their client IP's window at least.
	m := regexp.MustCompile(`(?m)^flashgate_memory_keys (\d+)$`).FindStringSubmatch(metrics)
	if m == nil {
		t.Error("/metrics lacks flashgate_memory_keys")
	} else if n, _ := strconv.Atoi(m[1]); n < 2 {
		t.Errorf("flashgate_memory_keys = %d, want at least 2", n)
	}
	if code, _ := httpGet(t, "http://"+s.httpAddr+"/debug/pprof/"); code != http.StatusNotFound {
		t.Errorf("/debug/pprof/ without --pprof = %d, want 404", code)
	}
	if err := s.stop(); err != nil {
		t.Fatalf("serve: %v", err)
	}
	logs := s.logs.String()
	for _, want := range []string{"flashgate listening", "memory backend ready; serving", "shutting down", "stopped"} {
		if !strings.Contains(logs, want) {
			t.Errorf("logs lack %q:\n%s", want, logs)
		}
	}
	if s.Serving() {
		t.Error("still SERVING after shutdown")
	}
}

func TestServeReloadsChangedFile(t *testing.T) {
	file := filepath.Join(t.TempDir(), "rules.yaml")
	writeRules(t, file, 3)
	s := startServe(t, "--config", file, "--pprof")
	waitFor(t, eventually, "SERVING", func() bool { return s.Serving() })
	if n := allowedOf(t, s.grpcAddr, "u1", 5); n != 3 {
		t.Fatalf("allowed %d of 5, want 3", n)
	}
	writeRules(t, file, 1)
	waitFor(t, eventually, "the new rule", func() bool { return s.ExtAuthz().Config().Rules[0].Limit.Requests == 1 })
	if n := allowedOf(t, s.grpcAddr, "u2", 5); n != 1 {
		t.Fatalf("after the change: allowed %d of 5, want 1", n)
	}
	// A bad file keeps the rules in force.
	if err := os.WriteFile(file, []byte("domain: shop\ndescriptors: [\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	waitFor(t, eventually, "the reload error", func() bool { return strings.Contains(s.logs.String(), "reload failed") })
	if n := allowedOf(t, s.grpcAddr, "u3", 5); n != 1 || !s.Serving() {
		t.Fatalf("after a bad file: allowed %d of 5 (want 1), serving %v", n, s.Serving())
	}
	if code, _ := httpGet(t, "http://"+s.httpAddr+"/debug/pprof/"); code != 200 {
		t.Errorf("/debug/pprof/ with --pprof = %d", code)
	}
}

// writeRules writes a descriptors file limiting each x-uid to limit per
// second (rule per_uid).
func writeRules(t *testing.T, file string, limit int) {
	t.Helper()
	yaml := fmt.Sprintf(`domain: shop
sources:
  uid: {request_headers: {header_name: x-uid}}
descriptors:
  - key: uid
    name: per_uid
    rate_limit: {requests: %d, window: 10s}
`, limit)
	// Write then rename, as a deployment would, so no reader sees half a file.
	tmp := file + ".tmp"
	if err := os.WriteFile(tmp, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, file); err != nil {
		t.Fatal(err)
	}
}

// allowedOf sends n checks of uid and counts the allowed ones.
func allowedOf(t *testing.T, addr, uid string, n int) int {
	t.Helper()
	allowed := 0
	for _, l := range checkLines(t, addr, uid, n) {
		if strings.Contains(l, " allowed 200 ") {
			allowed++
		}
	}
	return allowed
}

func TestServeStartErrors(t *testing.T) {
	tests := map[string]struct {
		args []string
		want string
	}{
		"bad config":       {[]string{"--config", "testdata/bad_unknown_key.yaml"}, "testdata/bad_unknown_key.yaml:7:5: "},
		"missing config":   {[]string{"--config", "testdata/none.yaml"}, "no such file"},
		"redis no addr":    {[]string{"--backend", "redis"}, "needs --redis-addr"},
		"sentinel no name": {[]string{"--backend", "redis", "--redis-addr", "a:1", "--redis-mode", "sentinel"}, "master name"},
		"bad log level":    {[]string{"--log-level", "loud"}, "--log-level"},
		"bad log format":   {[]string{"--log-format", "xml"}, "--log-format"},
		"bad http address": {[]string{"--grpc-addr", "127.0.0.1:0", "--http-addr", "256.0.0.1:1"}, "--http-addr"},
		"bad env":          {[]string{"--env", "FLASHGATE_REDIS_DB=x"}, "FLASHGATE_REDIS_DB"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			args, environ := tc.args, map[string]string{}
			if len(args) == 2 && args[0] == "--env" {
				k, v, _ := strings.Cut(args[1], "=")
				environ[k], args = v, nil
			}
			var stderr logtest.Buffer
			err := runEnv(context.Background(), append([]string{"serve", "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"}, args...),
				env{stdout: io.Discard, stderr: &stderr, lookupEnv: func(k string) (string, bool) { v, ok := environ[k]; return v, ok }})
			if err == nil || !strings.Contains(errorLine(err), tc.want) {
				t.Fatalf("err = %v, want %q in it", err, tc.want)
			}
		})
	}
}

func TestServeRedis(t *testing.T) {
	r := redistest.Start(t)
	// A generous budget: these tests check decisions, not latency, on a
	// machine other tests load too; a timeout would fall back to the local
	// failure mode and miss Redis's count.
	s := startServe(t, "--backend", "redis", "--redis-addr", r.Addr(), "--key-prefix", "t1", "--redis-timeout", "1s", "--config", exampleStretched(t))
	waitFor(t, eventually, "SERVING", func() bool { return s.Serving() })
	assertSixthDenied(t, s.grpcAddr, "alice")
}

// TestServeRedisAutoPipeline: auto-pipelining is the default, and
// --redis-autopipeline=false turns it off; the limits hold either way.
func TestServeRedisAutoPipeline(t *testing.T) {
	r := redistest.Start(t)
	for i, tc := range []struct {
		args []string
		want bool
	}{
		{nil, true},
		{[]string{"--redis-autopipeline=false"}, false},
	} {
		args := append([]string{"--backend", "redis", "--redis-addr", r.Addr(), "--key-prefix", fmt.Sprintf("t2-%d", i), "--redis-timeout", "1s",
			"--config", exampleStretched(t)}, tc.args...)
		s := startServe(t, args...)
		waitFor(t, eventually, "SERVING", func() bool { return s.Serving() })
		assertSixthDenied(t, s.grpcAddr, "alice")
		if got := strings.Contains(s.logs.String(), "auto-pipelined"); got != tc.want {
			t.Errorf("%v: the start-up log says auto-pipelined: %t, want %t:\n%s", tc.args, got, tc.want, s.logs.String())
		}
	}
}

func TestServeWaitsForRedis(t *testing.T) {
	r := redistest.Start(t)
	r.Kill()
	s := startServe(t, "--backend", "redis", "--redis-addr", r.Addr(), "--redis-timeout", "1s", "--config", exampleStretched(t),
		"--warmup-timeout", "0", "--log-format", "json")
	// Not serving, and saying why.
	waitFor(t, eventually, "a failed warm-up", func() bool {
		return strings.Contains(s.logs.String(), "redis is not ready")
	})
	if s.Serving() {
		t.Fatal("SERVING without Redis")
	}
	if st := grpcHealth(t, s.grpcAddr); st != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Errorf("gRPC health = %s, want NOT_SERVING", st)
	}
	if code, _ := httpGet(t, "http://"+s.httpAddr+"/readyz"); code != http.StatusServiceUnavailable {
		t.Errorf("/readyz = %d, want 503", code)
	}
	// While NOT_SERVING no line claims serving; durations are strings.
	logs := s.logs.String()
	for _, msg := range logMessages(t, logs) {
		if strings.Contains(msg, "serving") && !strings.Contains(msg, "not serving") {
			t.Errorf("logged %q while NOT_SERVING", msg)
		}
	}
	if _, ok := logField(logs, "flashgate listening", "grpc_addr"); !ok {
		t.Errorf("no \"flashgate listening\" line with grpc_addr:\n%s", logs)
	}
	if v, ok := logField(logs, "redis is not ready; not serving, will retry", "retry_in"); !ok {
		t.Errorf("retry_in is not logged as a string:\n%s", logs)
	} else if _, err := time.ParseDuration(v); err != nil {
		t.Errorf("retry_in %q: %v", v, err)
	}
	r.Restart()
	waitFor(t, eventually, "SERVING after Redis is back", func() bool { return s.Serving() })
	assertSixthDenied(t, s.grpcAddr, "carol")
	if err := s.stop(); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(s.logs.String(), "; serving") {
		t.Errorf("turning SERVING was not logged:\n%s", s.logs)
	}
}

// logMessages returns the msg of every JSON log line in logs.
func logMessages(t *testing.T, logs string) []string {
	t.Helper()
	var out []string
	for _, rec := range logtest.JSONLines(t, logs) {
		if m, ok := rec["msg"].(string); ok {
			out = append(out, m)
		}
	}
	return out
}

// logKindOf is the kind of a log message, as serve's limit tells kinds
// apart (flashgate_log_suppressed_total's help): up to its first ':' or ';'.
func logKindOf(msg string) string {
	if i := strings.IndexAny(msg, ":;"); i >= 0 {
		msg = msg[:i]
	}
	return strings.TrimSpace(msg)
}

// TestServeOutageLogsRateLimited: while Redis is down and checks keep
// coming, each kind of warning or error is written once per 10s at most;
// the rest are counted.
func TestServeOutageLogsRateLimited(t *testing.T) {
	r := redistest.Start(t)
	s := startServe(t, "--backend", "redis", "--redis-addr", r.Addr(), "--redis-timeout", "1s", "--config", exampleStretched(t),
		"--log-format", "json", "--fleet-ttl", "300ms")
	waitFor(t, eventually, "SERVING", func() bool { return s.Serving() })
	before := len(logtest.JSONLines(t, s.logs.String()))
	r.Kill()
	down := time.Now()
	for i := 0; time.Since(down) < 4*time.Second; i++ {
		checkLines(t, s.grpcAddr, fmt.Sprintf("outage-%d", i), 5)
	}
	elapsed := time.Since(down)
	perKind := map[string]int{}
	for _, rec := range logtest.JSONLines(t, s.logs.String())[before:] {
		if lv := rec["level"]; lv == "WARN" || lv == "ERROR" {
			perKind[logKindOf(rec["msg"].(string))]++
		}
	}
	// One line at once, one held line per interval ended, one more at most
	// across an interval's edge.
	allowed := 2 + int(elapsed/(10*time.Second))
	for kind, n := range perKind {
		if n > allowed {
			t.Errorf("%d lines of kind %q in the %s of the outage, want at most %d", n, kind, elapsed.Round(time.Millisecond), allowed)
		}
	}
	if len(perKind) == 0 {
		t.Errorf("the outage logged no warning:\n%s", s.logs)
	}
	_, metrics := httpGet(t, "http://"+s.httpAddr+"/metrics")
	m := regexp.MustCompile(`(?m)^flashgate_log_suppressed_total\{kind="[^"]*"\} (\d+)$`).FindAllStringSubmatch(metrics, -1)
	total := 0
	for _, sm := range m {
		n, _ := strconv.Atoi(sm[1])
		total += n
	}
	if total == 0 {
		t.Errorf("flashgate_log_suppressed_total counted nothing during the outage; lines per kind %v", perKind)
	}
	t.Logf("lines per kind in %s: %v; %d suppressed", elapsed.Round(time.Millisecond), perKind, total)
}

func TestServeStopsWhileWaitingForRedis(t *testing.T) {
	r := redistest.Start(t)
	r.Kill()
	s := startServe(t, "--backend", "redis", "--redis-addr", r.Addr())
	waitFor(t, eventually, "a failed PING", func() bool {
		return strings.Contains(s.logs.String(), "redis is not ready")
	})
	start := time.Now()
	if err := s.stop(); err != nil {
		t.Fatalf("serve: %v", err)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("took %s to stop", d)
	}
}

func TestServeRedisCluster(t *testing.T) {
	c := redistest.StartCluster(t, 3)
	s := startServe(t, "--backend", "redis", "--redis-mode", "cluster", "--redis-addr", strings.Join(c.Addrs(), ","), "--redis-timeout", "1s",
		"--config", exampleStretched(t))
	waitFor(t, eventually, "SERVING", func() bool { return s.Serving() })
	assertSixthDenied(t, s.grpcAddr, "dave")
	if !strings.Contains(s.logs.String(), "(cluster)") {
		t.Errorf("logs do not name the cluster mode:\n%s", s.logs)
	}
}

// TestServeRateLimitHeaders: --ratelimit-headers chooses the families of
// rate-limit headers the answers carry.
func TestServeRateLimitHeaders(t *testing.T) {
	for flag, want := range map[string]struct{ has, lacks []string }{
		"both": {has: []string{`ratelimit-policy: "coupon_per_uid";q=5;w=60`, `ratelimit: "coupon_per_uid";r=4;t=`, "x-ratelimit-limit: 5"}},
		"ietf": {has: []string{`ratelimit-policy: "coupon_per_uid";q=5;w=60`}, lacks: []string{"x-ratelimit-"}},
		"x":    {has: []string{"x-ratelimit-limit: 5", "x-ratelimit-reset: "}, lacks: []string{"ratelimit-policy", " ratelimit: "}},
		"none": {lacks: []string{"ratelimit"}},
	} {
		t.Run(flag, func(t *testing.T) {
			s := startServe(t, "--config", exampleStretched(t), "--ratelimit-headers", flag)
			waitFor(t, eventually, "SERVING", func() bool { return s.Serving() })
			l := checkLines(t, s.grpcAddr, "alice", 1)[0]
			for _, h := range want.has {
				if !strings.Contains(l, h) {
					t.Errorf("%q lacks %q", l, h)
				}
			}
			for _, h := range want.lacks {
				if strings.Contains(l, h) {
					t.Errorf("%q has %q", l, h)
				}
			}
		})
	}
}
