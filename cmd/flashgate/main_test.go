package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

// runCmd runs the command line args in-process and returns its stdout,
// stderr and error.
func runCmd(t *testing.T, ctx context.Context, args ...string) (string, string, error) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	err := run(ctx, args, &stdout, &stderr)
	return stdout.String(), stderr.String(), err
}

func TestRootHelpAndUnknown(t *testing.T) {
	ctx := context.Background()
	out, _, err := runCmd(t, ctx)
	if err != nil {
		t.Fatalf("flashgate: %v", err)
	}
	for _, sub := range []string{"check", "validate", "version", "inspect", "bans"} {
		if !strings.Contains(out, sub) {
			t.Errorf("help does not list %s:\n%s", sub, out)
		}
	}
	// The load generator and its reference server are flashgate-bench's.
	for _, gone := range []string{"bench", "noop-server"} {
		if strings.Contains(out, gone) {
			t.Errorf("help lists %s:\n%s", gone, out)
		}
	}
	if _, _, err := runCmd(t, ctx, "bench"); err == nil || !strings.Contains(err.Error(), "unknown command") {
		t.Errorf("bench: err = %v, want unknown command", err)
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
