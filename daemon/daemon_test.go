package daemon

import (
	"context"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/flashgate/flashgate/enforce"
	"github.com/flashgate/flashgate/internal/testing/logtest"
	"github.com/flashgate/flashgate/window"
)

// eventually bounds the wait for what must come to pass, far beyond what
// it takes, so that a busy machine under -race is not taken for a hang.
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

// memoryOptions are a memory daemon's options on free loopback ports,
// logging text to logs.
func memoryOptions(t *testing.T, logs *logtest.Buffer) Options {
	t.Helper()
	keys, err := window.NewKeys("fg")
	if err != nil {
		t.Fatal(err)
	}
	return Options{
		GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", DrainTimeout: 3 * time.Second,
		Backend: BackendMemory, Keys: keys, FailureMode: enforce.FailureLocal, Headers: enforce.FamiliesBoth,
		Ban: window.DefaultBan, LocalCacheSize: 1 << 20, LogHandler: slog.NewTextHandler(logs, nil),
	}
}

// TestDaemonLifecycle: New listens without serving; Serve turns SERVING,
// Reload reloads the rules file, and the end of Serve's context drains and
// stops it, releasing its listeners.
func TestDaemonLifecycle(t *testing.T) {
	file := filepath.Join(t.TempDir(), "rules.yaml")
	example, err := os.ReadFile(filepath.Join("..", "descriptors", "flashsale.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(file, example, 0o600); err != nil {
		t.Fatal(err)
	}
	logs := &logtest.Buffer{}
	o := memoryOptions(t, logs)
	o.Config = file
	d, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	if d.Serving() || d.GRPCAddr() == "" || d.HTTPAddr() == "" || d.HTTPAuthzAddr() != "" || d.ExtAuthz() == nil {
		t.Fatalf("after New: serving %v, grpc %q, http %q, http authz %q", d.Serving(), d.GRPCAddr(), d.HTTPAddr(), d.HTTPAuthzAddr())
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Serve(ctx) }()
	waitFor(t, eventually, "SERVING", d.Serving)
	d.Reload()
	waitFor(t, eventually, "the reload's line", func() bool { return strings.Contains(logs.String(), "SIGHUP: rules reloaded") })
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Serve: %v", err)
		}
	case <-time.After(eventually):
		t.Fatal("Serve did not return")
	}
	if !strings.Contains(logs.String(), "msg=stopped") {
		t.Errorf("no stopped line:\n%s", logs)
	}
	if err := d.Serve(context.Background()); err == nil {
		t.Error("a second Serve: no error")
	}
	d.Close() // idempotent after Serve
}

// TestDaemonCloseUnserved: a daemon that is never served releases its
// listeners on Close, so that its address can be listened on again.
func TestDaemonCloseUnserved(t *testing.T) {
	o := memoryOptions(t, &logtest.Buffer{})
	d, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	addr := d.GRPCAddr()
	d.Close()
	o.GRPCAddr, o.HTTPAddr = addr, ""
	again, err := New(o)
	if err != nil {
		t.Fatalf("listen again on %s after Close: %v", addr, err)
	}
	again.Close()
}

// TestNewFailsClean: options New cannot build are refused, and a listener
// that cannot open fails New without leaving the others open.
func TestNewFailsClean(t *testing.T) {
	o := memoryOptions(t, &logtest.Buffer{})
	o.Backend = "disk"
	if _, err := New(o); err == nil || !strings.Contains(err.Error(), `backend "disk"`) {
		t.Errorf("backend disk: %v", err)
	}
	free, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	grpcAddr := free.Addr().String()
	free.Close()
	o = memoryOptions(t, &logtest.Buffer{})
	o.GRPCAddr, o.HTTPAddr = grpcAddr, "256.0.0.1:1"
	if _, err := New(o); err == nil || !strings.Contains(err.Error(), "--http-addr") {
		t.Errorf("bad --http-addr: %v", err)
	}
	l, err := net.Listen("tcp", grpcAddr)
	if err != nil {
		t.Fatalf("the gRPC listener of a failed New is still open: %v", err)
	}
	l.Close()
}
