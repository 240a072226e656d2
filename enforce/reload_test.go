package enforce_test

import (
	"context"
	"crypto/sha256"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/flashgate/flashgate/enforce"
	"github.com/flashgate/flashgate/enforce/enforcetest"
)

// textConfig is a front-end whose config is a file of one word; "bad" is
// refused.
type textConfig struct {
	mu      sync.Mutex
	inForce string
	sum     [32]byte
}

func (c *textConfig) get() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.inForce
}

func (c *textConfig) source() enforce.Source[[]byte] {
	return enforce.Source[[]byte]{
		What: "test config", PathKey: "file",
		Read: func(path string) ([]byte, [32]byte, error) {
			b, err := os.ReadFile(path)
			return b, sha256.Sum256(b), err
		},
		InForce: func() [32]byte {
			c.mu.Lock()
			defer c.mu.Unlock()
			return c.sum
		},
		Install: func(path string, b []byte) error {
			if strings.TrimSpace(string(b)) == "bad" {
				return errors.New(path + ":1:1: bad is refused")
			}
			c.mu.Lock()
			defer c.mu.Unlock()
			c.inForce, c.sum = strings.TrimSpace(string(b)), sha256.Sum256(b)
			return nil
		},
	}
}

// TestReloader: the watch installs changed content, keeps the last good
// config on a bad or unreadable one, and counts each bad content and each
// read error once; Reload reports and counts every time.
func TestReloader(t *testing.T) {
	f, reg := newFront(t, enforce.Options{Limiter: &limiter{}}, extAuthz)
	path := filepath.Join(t.TempDir(), "c.txt")
	write := func(s string) {
		t.Helper()
		// Whole at once, as a ConfigMap swaps it: a watch that read a file
		// half written would install its empty start.
		tmp := path + ".tmp"
		if err := os.WriteFile(tmp, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, path); err != nil {
			t.Fatal(err)
		}
	}
	count := func(result string) float64 {
		return enforcetest.Counter(t, reg, "flashgate_config_reloads_total", result)
	}
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s", what)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	cfg := &textConfig{}
	write("one")
	r := enforce.NewReloader(f, path, cfg.source())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Watch(ctx, 10*time.Millisecond) }()
	defer func() { cancel(); <-done }()

	waitFor("the first config", func() bool { return cfg.get() == "one" && count("success") == 1 })
	time.Sleep(50 * time.Millisecond)
	if n := count("success"); n != 1 {
		t.Fatalf("unchanged content installed again: %v successes", n)
	}
	write("bad")
	waitFor("the bad content's error", func() bool { return count("error") == 1 })
	time.Sleep(50 * time.Millisecond)
	if n := count("error"); n != 1 || cfg.get() != "one" {
		t.Fatalf("bad content: %v errors (want 1), config %q (want one)", n, cfg.get())
	}
	if err := r.Reload(); err == nil || !strings.Contains(err.Error(), ":1:1: bad is refused") {
		t.Fatalf("Reload of bad content: %v", err)
	}
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	waitFor("the read error", func() bool { return count("error") == 3 })
	time.Sleep(50 * time.Millisecond)
	if n := count("error"); n != 3 {
		t.Fatalf("a missing file counted %v times, want once", n-2)
	}
	write("two")
	waitFor("the next good config", func() bool { return cfg.get() == "two" && count("success") == 2 })

	if err := enforce.NewReloader(f, "", cfg.source()).Reload(); !errors.Is(err, enforce.ErrNoPath) {
		t.Errorf("Reload without a path: %v, want ErrNoPath", err)
	}
}

// TestReloaderNotified: with a poll far too slow to matter, a change is
// still installed, told by a file-system notification: a write in place, a
// file renamed over the config, and a ConfigMap's ..data symlink swap.
func TestReloaderNotified(t *testing.T) {
	f, _ := newFront(t, enforce.Options{Limiter: &limiter{}}, extAuthz)
	dir := t.TempDir()
	// The ConfigMap layout: c.txt -> ..data/c.txt, ..data -> ..v1.
	version := func(name, s string) {
		t.Helper()
		if err := os.Mkdir(filepath.Join(dir, name), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name, "c.txt"), []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	swap := func(name string) {
		t.Helper()
		tmp := filepath.Join(dir, "..data_tmp")
		if err := os.Symlink(name, tmp); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(dir, "..data")); err != nil {
			t.Fatal(err)
		}
	}
	version("..v1", "one")
	swap("..v1")
	path := filepath.Join(dir, "c.txt")
	if err := os.Symlink(filepath.Join("..data", "c.txt"), path); err != nil {
		t.Fatal(err)
	}
	cfg := &textConfig{}
	r := enforce.NewReloader(f, path, cfg.source())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Watch(ctx, time.Hour) }()
	defer func() { cancel(); <-done }()
	waitFor := func(want string) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for cfg.get() != want {
			if time.Now().After(deadline) {
				t.Fatalf("config %q, want %q: the change was not noticed", cfg.get(), want)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	waitFor("one")
	version("..v2", "two")
	swap("..v2")
	waitFor("two")

	// The file itself: written in place, then replaced by a rename.
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte("three"), 0o644); err != nil {
		t.Fatal(err)
	}
	waitFor("three")
	if err := os.WriteFile(path+".tmp", []byte("four"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(path+".tmp", path); err != nil {
		t.Fatal(err)
	}
	waitFor("four")
}
