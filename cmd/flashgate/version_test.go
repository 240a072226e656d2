package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

func TestVersionCommand(t *testing.T) {
	out, _, err := runCmd(t, context.Background(), "version")
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`^flashgate \S+ commit \S+.* go\S+ \w+/\w+\n$`).MatchString(out) {
		t.Errorf("version = %q", out)
	}
}

// TestVersionStampedByDockerfile builds the binary with the -ldflags of the
// Dockerfile's go build, its build arguments given, and runs its version:
// the image prints the version and commit it was built from, though its
// build context has no .git.
func TestVersionStampedByDockerfile(t *testing.T) {
	data, err := os.ReadFile("../../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`go build [^\n]*-ldflags="([^"]*)"[^\n]* \./cmd/flashgate`).FindSubmatch(data)
	if m == nil {
		t.Fatalf("Dockerfile: no go build -ldflags=\"...\" ./cmd/flashgate")
	}
	args := map[string]string{"VERSION": "v9.8.7-test", "COMMIT": "0badc0ffee"}
	for name := range args {
		if !regexp.MustCompile(`(?m)^ARG .*\b` + name + `\b`).Match(data) {
			t.Errorf("Dockerfile: no ARG %s", name)
		}
	}
	ldflags := os.Expand(string(m[1]), func(name string) string {
		v, ok := args[name]
		if !ok {
			t.Errorf("Dockerfile -ldflags: unexpected $%s", name)
		}
		return v
	})
	bin := filepath.Join(t.TempDir(), "flashgate")
	if out, err := exec.Command("go", "build", "-trimpath", "-buildvcs=false", "-ldflags="+ldflags, "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build -ldflags=%q: %v\n%s", ldflags, err, out)
	}
	out, err := exec.Command(bin, "version").Output()
	if err != nil {
		t.Fatalf("flashgate version: %v", err)
	}
	if want := "flashgate v9.8.7-test commit 0badc0ffee "; !strings.HasPrefix(string(out), want) {
		t.Errorf("version = %q, want prefix %q", out, want)
	}
}

// TestVersionStampedByMake: `make build` passes the Dockerfile's two
// stamps, from VERSION and COMMIT.
func TestVersionStampedByMake(t *testing.T) {
	out, err := exec.Command("make", "-s", "-n", "-C", "../..", "build", "image", "VERSION=v9.8.7-test", "COMMIT=0badc0ffee").CombinedOutput()
	if err != nil {
		t.Fatalf("make -n build image: %v\n%s", err, out)
	}
	var build, image bool
	for _, line := range strings.Split(string(out), "\n") {
		switch {
		case strings.Contains(line, "go build") && strings.HasSuffix(line, "./cmd/flashgate"):
			build = strings.Contains(line, "-X main.stampedVersion=v9.8.7-test") && strings.Contains(line, "-X main.stampedCommit=0badc0ffee")
		case strings.HasPrefix(line, "docker build"):
			image = strings.Contains(line, "--build-arg VERSION=v9.8.7-test") && strings.Contains(line, "--build-arg COMMIT=0badc0ffee")
		}
	}
	if !build || !image {
		t.Errorf("make build stamps: %v, make image passes the build args: %v\n%s", build, image, out)
	}
}
