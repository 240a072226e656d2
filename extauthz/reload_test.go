package extauthz

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/flashgate/flashgate/descriptors"
	"github.com/flashgate/flashgate/enforce"
)

const goodA = `
domain: reload
descriptors:
  - key: remote_address
    name: per_ip
    rate_limit: {requests: 1, window: 1s}
`

const goodB = `
domain: reload
descriptors:
  - key: remote_address
    name: per_ip_v2
    rate_limit: {requests: 3, window: 1s}
`

const bad = `
domain: reload
descriptors:
  - key: remote_address
    rate_limit: {requests: 0, window: 1s}
`

// configMap lays out dir like a Kubernetes ConfigMap volume: the file is a
// symlink through ..data, which is swapped atomically to a new directory.
type configMap struct {
	t   *testing.T
	dir string
	gen int
}

func (c *configMap) write(content string) {
	c.t.Helper()
	c.gen++
	ts := filepath.Join(c.dir, "..ts"+string(rune('0'+c.gen)))
	if err := os.Mkdir(ts, 0o755); err != nil {
		c.t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(ts, "rules.yaml"), []byte(content), 0o644); err != nil {
		c.t.Fatal(err)
	}
	tmp := filepath.Join(c.dir, "..data_tmp")
	if err := os.Symlink(filepath.Base(ts), tmp); err != nil {
		c.t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(c.dir, "..data")); err != nil {
		c.t.Fatal(err)
	}
	link := filepath.Join(c.dir, "rules.yaml")
	if _, err := os.Lstat(link); err != nil {
		if err := os.Symlink("..data/rules.yaml", link); err != nil {
			c.t.Fatal(err)
		}
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestReloadWatch(t *testing.T) {
	cm := &configMap{t: t, dir: t.TempDir()}
	cm.write(goodA)
	path := filepath.Join(cm.dir, "rules.yaml")
	cfg, err := descriptors.LoadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, cfg, nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- e.srv.Reloader(path).Watch(ctx, 10*time.Millisecond) }()
	defer func() { cancel(); <-done }()

	rule := func() string { return e.srv.Config().Rules[0].Name }
	cm.write(bad)
	waitFor(t, "the error to be counted", func() bool { return e.counter("reloads", "error") == 1 })
	if rule() != "per_ip" {
		t.Fatalf("a bad file replaced the rules: %s", rule())
	}
	if got := e.run(req{path: "/"}, 2); got != 1 {
		t.Errorf("old rules: allowed %d of 2, want 1", got)
	}
	time.Sleep(50 * time.Millisecond)
	if got := e.counter("reloads", "error"); got != 1 {
		t.Errorf("the same bad content was counted %v times", got)
	}
	cm.write(goodB)
	// The rules are swapped in, then the success counted: wait for both.
	waitFor(t, "the good file", func() bool { return rule() == "per_ip_v2" && e.counter("reloads", "success") >= 1 })
	if got := e.counter("reloads", "success"); got != 1 {
		t.Errorf("success %v", got)
	}
	e.clock.Advance(time.Second)
	if got := e.run(req{path: "/"}, 4); got != 3 {
		t.Errorf("new rules: allowed %d of 4, want 3", got)
	}
}

func TestReloadSIGHUP(t *testing.T) {
	path, cfg := loadGoodA(t)
	e := newEnv(t, cfg, nil)
	r := e.srv.Reloader(path)
	for _, step := range []struct {
		content string
		ok      bool
		rule    string
	}{{bad, false, "per_ip"}, {goodB, true, "per_ip_v2"}, {goodA, true, "per_ip"}} {
		if err := os.WriteFile(path, []byte(step.content), 0o644); err != nil {
			t.Fatal(err)
		}
		err := r.Reload()
		if (err == nil) != step.ok {
			t.Fatalf("Reload: %v, want ok=%v", err, step.ok)
		}
		if err != nil && err.Error()[len("reload: "):] != path+":5:28: requests must be at least 1, not 0" {
			t.Errorf("error %v", err)
		}
		if got := e.srv.Config().Rules[0].Name; got != step.rule {
			t.Errorf("rule %s, want %s", got, step.rule)
		}
	}
	ex, _ := descriptors.ExampleConfig()
	if err := e.srv.SetConfig(ex); err != nil {
		t.Fatal(err)
	}
	if err := e.srv.Reloader("").Reload(); err != enforce.ErrNoPath {
		t.Errorf("Reload of the built-in example: %v", err)
	}
}

// TestReloadLogsEveryError: a reload of a file with more errors than
// descriptors.MaxErrors keeps the old rules and logs validate's list: the first
// descriptors.MaxErrors errors at their positions, then how many more.
func TestReloadLogsEveryError(t *testing.T) {
	path, cfg := loadGoodA(t)
	var logs bytes.Buffer
	e := newEnv(t, cfg, func(o *enforce.Options) { o.Logger = slog.New(slog.NewJSONHandler(&logs, nil)) })
	bad, err := os.ReadFile("../descriptors/testdata/many/over_twenty.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, bad, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := e.srv.Reloader(path).Reload(); err == nil {
		t.Fatal("Reload of a bad file succeeded")
	}
	if got := e.srv.Config().Rules[0].Name; got != "per_ip" {
		t.Errorf("rule %s, want the old per_ip", got)
	}
	var rec struct{ Level, Error string }
	for d := json.NewDecoder(&logs); rec.Level != "ERROR"; {
		if err := d.Decode(&rec); err != nil {
			t.Fatalf("no error logged: %v", err)
		}
	}
	lines := strings.Split(rec.Error, "\n")
	if len(lines) != descriptors.MaxErrors+1 || lines[descriptors.MaxErrors] != "and 5 more" {
		t.Fatalf("logged error has %d lines, want %d ending in \"and 5 more\":\n%s", len(lines), descriptors.MaxErrors+1, rec.Error)
	}
	for i, l := range lines[:descriptors.MaxErrors] {
		if want := fmt.Sprintf("%s:%d:28: requests must be at least 1, not 0", path, 5+3*i); !strings.HasSuffix(l, want) {
			t.Errorf("line %d: %q, want %q", i, l, want)
		}
	}
}

// loadGoodA writes goodA to a file of its own and loads it.
func loadGoodA(t *testing.T) (string, *descriptors.Config) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "rules.yaml")
	if err := os.WriteFile(path, []byte(goodA), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := descriptors.LoadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return path, cfg
}
