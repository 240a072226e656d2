package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/flashgate/flashgate/internal/checkreq"
)

// eventually bounds the wait for what must come to pass (a build, serve
// SERVING): far beyond what it takes, so that a busy machine under -race is
// not taken for a hang.
const eventually = 60 * time.Second

// startServe builds cmd/flashgate and runs `flashgate serve` with args,
// its gRPC on a unix socket and no HTTP listener, until the test ends. It
// returns the gRPC address once serve's health is SERVING, and the
// process's PID.
func startServe(t *testing.T, args ...string) (addr string, pid int) {
	t.Helper()
	// A short directory: a unix socket's path has ~100 bytes at most.
	dir, err := os.MkdirTemp("", "fgb")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	bin := filepath.Join(dir, "flashgate")
	build := exec.Command("go", "build", "-o", bin, "github.com/flashgate/flashgate/cmd/flashgate")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	addr = "unix://" + filepath.Join(dir, "grpc.sock")
	logs, err := os.Create(filepath.Join(dir, "serve.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer logs.Close()
	cmd := exec.Command(bin, append([]string{"serve", "--grpc-addr", addr, "--http-addr", "",
		"--log-format", "text", "--drain-timeout", "3s"}, args...)...)
	cmd.Stdout, cmd.Stderr = logs, logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
	})

	conn, err := checkreq.Dial(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	health := healthpb.NewHealthClient(conn)
	for deadline := time.Now().Add(eventually); ; time.Sleep(50 * time.Millisecond) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		resp, err := health.Check(ctx, &healthpb.HealthCheckRequest{})
		cancel()
		if err == nil && resp.GetStatus() == healthpb.HealthCheckResponse_SERVING {
			return addr, cmd.Process.Pid
		}
		select {
		case <-exited:
			b, _ := os.ReadFile(logs.Name())
			t.Fatalf("serve exited before SERVING:\n%s", b)
		default:
		}
		if time.Now().After(deadline) {
			b, _ := os.ReadFile(logs.Name())
			t.Fatalf("serve not SERVING after %s (last: %v, %v):\n%s", eventually, resp.GetStatus(), err, b)
		}
	}
}
