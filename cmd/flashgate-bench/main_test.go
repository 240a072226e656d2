package main

import (
	"bytes"
	"context"
	"net"
	"strings"
	"testing"
	"time"
)

// runArgs runs flashgate-bench with args in-process, to its end, and
// returns what it wrote to stdout and stderr, and its error.
func runArgs(args ...string) (stdout, stderr string, err error) {
	var out, errOut bytes.Buffer
	err = run(context.Background(), args, &out, &errOut)
	return out.String(), errOut.String(), err
}

// startNoop runs the noop-server command's server on a loopback port until
// the test ends.
func startNoop(t *testing.T) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	var log bytes.Buffer
	go func() { done <- runNoopServer(ctx, lis, &log) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("noop server: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Error("noop server did not stop")
		}
	})
	return lis.Addr().String()
}

func TestHelpAndUnknown(t *testing.T) {
	out, _, err := runArgs("--help")
	if err != nil {
		t.Fatalf("flashgate-bench --help: %v", err)
	}
	// The root is the load generator, with the reference server beside it.
	for _, want := range []string{"flashgate-bench --addr A", "--concurrency", "--api", "noop-server", "noop-http-server"} {
		if !strings.Contains(out, want) {
			t.Errorf("help lacks %s:\n%s", want, out)
		}
	}
	if _, _, err := runArgs("frobnicate"); err == nil || !strings.Contains(err.Error(), "unknown command") {
		t.Errorf("unknown command: err = %v", err)
	}
}

func TestFlagErrors(t *testing.T) {
	tests := map[string]struct {
		args []string
		want string
	}{
		"hot above one":     {[]string{"--hot", "1.5"}, "--hot"},
		"no workers":        {[]string{"--concurrency", "0"}, "--concurrency"},
		"no users":          {[]string{"--users", "0"}, "--users"},
		"zero duration":     {[]string{"--duration", "0s"}, "--duration"},
		"bad ip":            {[]string{"--ip", "nope", "--addr", "127.0.0.1:1"}, "--ip"},
		"unknown flag":      {[]string{"--nope"}, "unknown flag: --nope"},
		"noop-server extra": {[]string{"noop-server", "extra"}, "unknown command"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			_, _, err := runArgs(tc.args...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want one containing %q", err, tc.want)
			}
		})
	}
}
