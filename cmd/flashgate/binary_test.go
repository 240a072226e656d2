package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/flashgate/flashgate/internal/testing/logtest"
)

// buildBinary builds flashgate into a temporary directory.
func buildBinary(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "flashgate")
	cmd := exec.Command("go", "build", "-o", bin, ".")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// logField returns the field of the first JSON log line whose msg is msg.
func logField(logs, msg, field string) (string, bool) {
	for _, line := range strings.Split(logs, "\n") {
		var rec map[string]any
		if json.Unmarshal([]byte(line), &rec) != nil || rec["msg"] != msg {
			continue
		}
		v, ok := rec[field].(string)
		return v, ok
	}
	return "", false
}

// startProcess starts cmd with its output in logs, and kills it at the
// end of the test. The channel gets Wait's error once (a test that reads it
// must put it back for the cleanup).
func startProcess(t *testing.T, cmd *exec.Cmd, logs *logtest.Buffer) chan error {
	t.Helper()
	cmd.Stdout, cmd.Stderr = logs, logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
	})
	return exited
}

// TestBinary builds flashgate once and runs it as a process.
func TestBinary(t *testing.T) {
	bin := buildBinary(t)
	t.Run("serve signals", func(t *testing.T) { testBinaryServeSignals(t, bin) })
	t.Run("exit codes", func(t *testing.T) { testBinaryExitCodes(t, bin) })
	t.Run("SIGHUP on an xDS-only RLS", func(t *testing.T) { testBinaryXDSOnlySIGHUP(t, bin) })
}

// testBinaryXDSOnlySIGHUP: a serve whose only config comes from xDS has no
// file to reload, and a SIGHUP must not end it (Go's default for an
// unhandled SIGHUP is to exit).
func testBinaryXDSOnlySIGHUP(t *testing.T, bin string) {
	logs := &logtest.Buffer{}
	cmd := exec.Command(bin, "serve", "--rls-xds-server", "127.0.0.1:1", "--rls-xds-force-start",
		"--grpc-addr", "127.0.0.1:0", "--http-addr", "", "--log-format", "json")
	exited := startProcess(t, cmd, logs)
	var addr string
	waitFor(t, eventually, "serve to listen", func() bool {
		a, ok := logField(logs.String(), "flashgate listening", "grpc_addr")
		addr = a
		return ok
	})
	waitFor(t, eventually, "SERVING", func() bool { return grpcHealth(t, addr) == healthpb.HealthCheckResponse_SERVING })
	for range 2 {
		if err := cmd.Process.Signal(syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
		time.Sleep(200 * time.Millisecond)
		select {
		case err := <-exited:
			exited <- err
			t.Fatalf("serve exited on SIGHUP: %v\n%s", err, logs)
		default:
		}
		if st := grpcHealth(t, addr); st != healthpb.HealthCheckResponse_SERVING {
			t.Fatalf("after SIGHUP: health %v\n%s", st, logs)
		}
	}
}

func testBinaryServeSignals(t *testing.T, bin string) {
	file := filepath.Join(t.TempDir(), "rules.yaml")
	writeRules(t, file, 3)

	logs := &logtest.Buffer{}
	cmd := exec.Command(bin, "serve", "--config", file, "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0",
		"--log-format", "json", "--drain-timeout", "5s")
	cmd.Env = append(os.Environ(), "FLASHGATE_LOG_LEVEL=debug")
	exited := startProcess(t, cmd, logs)

	var addr string
	waitFor(t, eventually, "serve to listen and serve", func() bool {
		a, ok := logField(logs.String(), "flashgate listening", "grpc_addr")
		addr = a
		return ok && strings.Contains(logs.String(), "memory backend ready; serving")
	})
	if n := allowedOf(t, addr, "u1", 5); n != 3 {
		t.Fatalf("allowed %d of 5, want 3\n%s", n, logs)
	}

	// SIGHUP after rewriting the file: the new rule applies.
	writeRules(t, file, 1)
	if err := cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	waitFor(t, eventually, "the SIGHUP reload", func() bool {
		return strings.Contains(logs.String(), "SIGHUP: rules reloaded")
	})
	if n := allowedOf(t, addr, "u2", 5); n != 1 {
		t.Fatalf("after SIGHUP: allowed %d of 5, want 1\n%s", n, logs)
	}

	// SIGTERM: exit 0 within the drain deadline.
	start := time.Now()
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		exited <- err // for the cleanup
		if err != nil {
			t.Fatalf("serve exited with %v\n%s", err, logs)
		}
	case <-time.After(7 * time.Second):
		t.Fatalf("serve still running 7s after SIGTERM\n%s", logs)
	}
	for _, want := range []string{"shutting down", `"msg":"stopped"`} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("logs lack %q:\n%s", want, logs)
		}
	}
	t.Logf("stopped %s after SIGTERM", time.Since(start))
}

func testBinaryExitCodes(t *testing.T, bin string) {
	tests := map[string]struct {
		args       []string
		code       int
		wantStderr string
	}{
		"version":       {[]string{"version"}, 0, ""},
		"validate good": {[]string{"validate", "--config", "testdata/good.yaml"}, 0, ""},
		"validate bad":  {[]string{"validate", "--config", "testdata/bad_unknown_key.yaml"}, 1, "testdata/bad_unknown_key.yaml:7:5: unknown key"},
		"unknown flag":  {[]string{"check", "--nope"}, 1, "flashgate: unknown flag: --nope"},
		"check refused": {[]string{"check", "--addr", "127.0.0.1:1", "--path", "/", "--timeout", "300ms"}, 1, "flashgate: 1 of 1 checks failed: "},
		// go-redis's own log lines of a failed dial are not printed
		"inspect, Redis down": {[]string{"inspect", "--rule", "coupon_per_uid", "--value", "a", "--redis-addr", "127.0.0.1:1"}, 1, "flashgate: "},
		"bans, Redis down":    {[]string{"bans", "list", "--redis-addr", "127.0.0.1:1"}, 1, "flashgate: "},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			cmd := exec.Command(bin, tc.args...)
			var stderr strings.Builder
			cmd.Stderr = &stderr
			err := cmd.Run()
			code := 0
			if ee, ok := err.(*exec.ExitError); ok {
				code = ee.ExitCode()
			} else if err != nil {
				t.Fatal(err)
			}
			if code != tc.code || !strings.HasPrefix(stderr.String(), tc.wantStderr) {
				t.Fatalf("exit %d, stderr %q; want exit %d, stderr starting %q", code, stderr.String(), tc.code, tc.wantStderr)
			}
			if tc.code != 0 && strings.Count(stderr.String(), "\n") != 1 {
				t.Errorf("want the error printed once, on one line: %q", stderr.String())
			}
		})
	}
}
