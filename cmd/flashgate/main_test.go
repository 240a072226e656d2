package main

import (
	"bytes"
	"context"
	"net"
	"strings"
	"testing"
	"time"
)

// runCmd runs the command line args in-process and returns its stdout,
// stderr and error.
func runCmd(t *testing.T, ctx context.Context, args ...string) (string, string, error) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	err := run(ctx, args, &stdout, &stderr)
	return stdout.String(), stderr.String(), err
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

func TestRootHelpAndUnknown(t *testing.T) {
	ctx := context.Background()
	out, _, err := runCmd(t, ctx)
	if err != nil {
		t.Fatalf("flashgate: %v", err)
	}
	for _, sub := range []string{"check", "bench", "version"} {
		if !strings.Contains(out, sub) {
			t.Errorf("help does not list %s:\n%s", sub, out)
		}
	}
	if strings.Contains(out, "noop-server") {
		t.Errorf("help lists the hidden noop-server:\n%s", out)
	}
	if _, _, err := runCmd(t, ctx, "frobnicate"); err == nil || !strings.Contains(err.Error(), "unknown command") {
		t.Errorf("unknown command: err = %v", err)
	}
}

func TestFlagErrors(t *testing.T) {
	tests := map[string]struct {
		args []string
		want string
	}{
		"check without path":   {[]string{"check", "--addr", "127.0.0.1:1"}, `"path" not set`},
		"check unknown flag":   {[]string{"check", "--path", "/", "--nope"}, "unknown flag: --nope"},
		"check bad header":     {[]string{"check", "--path", "/", "-H", "x-uid alice"}, "want 'name: value'"},
		"check bad ip":         {[]string{"check", "--path", "/", "--ip", "300.1.1.1"}, "--ip"},
		"check zero count":     {[]string{"check", "--path", "/", "-n", "0"}, "-n 0"},
		"check relative path":  {[]string{"check", "--path", "api"}, "must start with /"},
		"check bad duration":   {[]string{"check", "--path", "/", "--timeout", "soon"}, "invalid argument"},
		"check extension":      {[]string{"check", "--path", "/", "--context-extension", "novalue"}, "key=value"},
		"check extra argument": {[]string{"check", "--path", "/", "extra"}, "unknown command"},
		"bench hot above one":  {[]string{"bench", "--hot", "1.5"}, "--hot"},
		"bench no workers":     {[]string{"bench", "--concurrency", "0"}, "--concurrency"},
		"bench no users":       {[]string{"bench", "--users", "0"}, "--users"},
		"bench zero duration":  {[]string{"bench", "--duration", "0s"}, "--duration"},
		"bench bad ip":         {[]string{"bench", "--ip", "nope", "--addr", "127.0.0.1:1"}, "--ip"},
		"version argument":     {[]string{"version", "x"}, "unknown command"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			_, _, err := runCmd(t, context.Background(), tc.args...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want one containing %q", err, tc.want)
			}
		})
	}
}
