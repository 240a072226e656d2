package proxytest

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
)

// installMu serializes the installs of one test process.
var installMu sync.Mutex

// binary returns the path of the program name, from PATH or Debian's
// /usr/sbin and /usr/bin. When it is missing and the test runs as root
// where apt-get exists, it installs Debian's package pkg first (services
// are never started by the harness, whatever the package does); otherwise
// it fails the test with a hint.
func binary(t testing.TB, name, pkg string) string {
	t.Helper()
	if p, err := find(name); err == nil {
		return p
	}
	installMu.Lock()
	defer installMu.Unlock()
	if p, err := find(name); err == nil {
		return p
	}
	if err := install(pkg); err != nil {
		t.Fatalf("proxytest: %s is not installed and %v: install Debian's %s package (apt-get install %s) or put %s on PATH; .ci/run installs it",
			name, err, pkg, pkg, name)
	}
	p, err := find(name)
	if err != nil {
		t.Fatalf("proxytest: installed Debian's %s but %s is still not found: %v", pkg, name, err)
	}
	return p
}

func find(name string) (string, error) {
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	for _, dir := range []string{"/usr/sbin", "/usr/bin"} {
		p := filepath.Join(dir, name)
		if fi, err := os.Stat(p); err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s not on PATH, /usr/sbin or /usr/bin", name)
}

// install runs apt-get install pkg as root, waiting for another install's
// dpkg lock rather than failing on it.
func install(pkg string) error {
	if os.Geteuid() != 0 {
		return errors.New("the tests do not run as root")
	}
	apt, err := exec.LookPath("apt-get")
	if err != nil {
		return errors.New("apt-get is not available")
	}
	lock := "-oDPkg::Lock::Timeout=300"
	for _, args := range [][]string{
		{lock, "update", "-qq"},
		{lock, "install", "-y", "-qq", "--no-install-recommends", pkg},
	} {
		cmd := exec.Command(apt, args...)
		cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("apt-get %v failed: %w: %s", args[1:], err, tail(string(out), 600))
		}
	}
	return nil
}
