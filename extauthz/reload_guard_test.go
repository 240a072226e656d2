package extauthz

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/flashgate/flashgate/descriptors"
	"github.com/flashgate/flashgate/enforce"
	"github.com/flashgate/flashgate/internal/yamlguard"
)

// watch starts a Reloader of path for e's server, polling every 10ms,
// stops it at the end of the test, and returns it.
func watch(t *testing.T, e *env, path string) *enforce.Reloader {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	r := e.srv.Reloader(path)
	go func() { done <- r.Watch(ctx, 10*time.Millisecond) }()
	t.Cleanup(func() { cancel(); <-done })
	return r
}

// TestReloadRefusesNestingBomb: on a live server, a nesting bomb written
// over the descriptors file is refused (counted as an error, the old rules
// kept) before it is parsed, and a valid file written afterwards is picked
// up: the bomb never holds the reloader.
func TestReloadRefusesNestingBomb(t *testing.T) {
	bombs := map[string]string{
		"flow":  strings.Repeat("[", 30000),
		"block": "domain: reload\ndescriptors:\n" + strings.Repeat("- ", 100000),
	}
	for name, bomb := range bombs {
		t.Run(name, func(t *testing.T) {
			cm := &configMap{t: t, dir: t.TempDir()}
			cm.write(goodA)
			path := filepath.Join(cm.dir, "rules.yaml")
			cfg, err := descriptors.LoadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			e := newEnv(t, cfg, nil)
			r := watch(t, e, path)

			cm.write(bomb)
			waitFor(t, "the bomb's error to be counted", func() bool { return e.counter("reloads", "error") == 1 })
			if got := e.srv.Config().Rules[0].Name; got != "per_ip" {
				t.Fatalf("the bomb replaced the rules: %s", got)
			}
			cm.write(goodB)
			waitFor(t, "the valid file after the bomb", func() bool {
				return e.srv.Config().Rules[0].Name == "per_ip_v2" && e.counter("reloads", "success") == 1
			})

			// SIGHUP's path refuses it as well, with its position.
			cm.write(bomb)
			err = r.Reload()
			var ce *descriptors.ConfigError
			if !errors.As(err, &ce) || !strings.Contains(ce.Msg, "nested deeper than") {
				t.Fatalf("Reload of the bomb: %v, want the nesting refused", err)
			}
		})
	}
}

// TestLoadRefusesBombsBoundedMemory: loading a nesting bomb, as validate
// and serve's start do, fails at the bomb's position having allocated far
// less than parsing it would (over a gigabyte for these files).
func TestLoadRefusesBombsBoundedMemory(t *testing.T) {
	tests := map[string]struct {
		data string
		want string
	}{
		"30 KB of [":         {strings.Repeat("[", 30000), ":1:65: the YAML is nested deeper than 64 levels"},
		"150 KB of {a: ":     {"domain: d\ndescriptors: " + strings.Repeat("{a: ", 37500), ":2:266: the YAML is nested deeper than 64 levels"},
		"200 KB of - ":       {"domain: d\ndescriptors:\n" + strings.Repeat("- ", 100000), ":3:127: the YAML is nested deeper than 64 levels"},
		"too many tokens":    {"domain: d\ndescriptors: [" + strings.Repeat("a,", yamlguard.MaxTokens/2) + "]", ":2:262153: the file has more than 262144 YAML tokens"},
		"nested descriptors": {nestedDescriptors(40), ":65:129: the YAML is nested deeper than 64 levels"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "bomb.yaml")
			if err := os.WriteFile(path, []byte(tc.data), 0o644); err != nil {
				t.Fatal(err)
			}
			var err error
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			_, err = descriptors.LoadFile(path)
			runtime.ReadMemStats(&after)
			var ce *descriptors.ConfigError
			if !errors.As(err, &ce) || !strings.Contains(err.Error(), path+tc.want) {
				t.Fatalf("LoadFile: %v, want %s%s", err, path, tc.want)
			}
			if n := after.TotalAlloc - before.TotalAlloc; n > 64<<20 {
				t.Errorf("refusing it allocated %d MiB, want < 64", n>>20)
			}
		})
	}
}

// nestedDescriptors is a descriptors file of n levels of descriptors in
// block style (two YAML levels each).
func nestedDescriptors(n int) string {
	var b strings.Builder
	b.WriteString("domain: d\ndescriptors:\n")
	for i := range n {
		ind := strings.Repeat("    ", i)
		b.WriteString(ind + "  - key: path\n" + ind + "    descriptors:\n")
	}
	return b.String()
}

// TestReloadCountsUnreadableFile: a directory or a symlink loop where the
// descriptors file should be is a failed reload, counted once, the old
// rules kept; a valid file put back is picked up.
func TestReloadCountsUnreadableFile(t *testing.T) {
	tests := map[string]func(t *testing.T, path string){
		"directory": func(t *testing.T, path string) {
			if err := os.Mkdir(path, 0o755); err != nil {
				t.Fatal(err)
			}
		},
		"symlink loop": func(t *testing.T, path string) {
			if err := os.Symlink(filepath.Base(path), path); err != nil {
				t.Fatal(err)
			}
		},
		"dangling symlink": func(t *testing.T, path string) {
			if err := os.Symlink("nowhere.yaml", path); err != nil {
				t.Fatal(err)
			}
		},
	}
	for name, breakIt := range tests {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "rules.yaml")
			if err := os.WriteFile(path, []byte(goodA), 0o644); err != nil {
				t.Fatal(err)
			}
			cfg, err := descriptors.LoadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			e := newEnv(t, cfg, nil)
			r := watch(t, e, path)
			if err := os.Remove(path); err != nil {
				t.Fatal(err)
			}
			breakIt(t, path)
			// Between the removal and breakIt, a poll may count the
			// vanished file first: one error or two.
			waitFor(t, "the error to be counted", func() bool { return e.counter("reloads", "error") >= 1 })
			time.Sleep(50 * time.Millisecond)
			counted := e.counter("reloads", "error")
			if counted > 2 {
				t.Errorf("%v errors counted, want the broken file's once", counted)
			}
			if err := r.Reload(); err == nil {
				t.Error("Reload (SIGHUP) succeeded")
			}
			if got := e.srv.Config().Rules[0].Name; got != "per_ip" {
				t.Fatalf("rules %s, want the old per_ip", got)
			}
			time.Sleep(50 * time.Millisecond) // a few polls: the same error is not counted again
			if got := e.counter("reloads", "error"); got != counted+1 {
				t.Errorf("%v errors counted, want %v (the watcher's, then Reload's)", got, counted+1)
			}
			if err := os.RemoveAll(path); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(path, []byte(goodB), 0o644); err != nil {
				t.Fatal(err)
			}
			waitFor(t, "the valid file", func() bool {
				return e.srv.Config().Rules[0].Name == "per_ip_v2" && e.counter("reloads", "success") == 1
			})
		})
	}
}
