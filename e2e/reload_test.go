package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// reloadWithin is how soon a changed descriptors file must apply (issue 5).
const reloadWithin = 2 * time.Second

// limitNow returns the x-ratelimit-limit of a fresh user's first request:
// the limit of the rules in force.
func limitNow(p *proc) int {
	a := p.Check(coupon(freshUID("reload"), "10.3.0.1"))
	if a.Verdict() != vAllowed {
		return -1
	}
	n, err := strconv.Atoi(a.Headers()["x-ratelimit-limit"])
	if err != nil {
		return -1
	}
	return n
}

func fixture(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// writeAtomic replaces path with data by rename, as editors and most
// deployment tools do.
func writeAtomic(t *testing.T, path string, data []byte) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// configMap lays out a directory the way the kubelet mounts a ConfigMap:
// dir/..<version>/rules.yaml, dir/..data → ..<version>, dir/rules.yaml →
// ..data/rules.yaml; Update swaps ..data atomically and removes the old
// version.
type configMap struct {
	t       *testing.T
	dir     string
	version int
}

func newConfigMap(t *testing.T, data []byte) *configMap {
	c := &configMap{t: t, dir: t.TempDir()}
	c.Update(data)
	if err := os.Symlink(filepath.Join("..data", "rules.yaml"), c.Path()); err != nil {
		t.Fatal(err)
	}
	return c
}

// Path is the file flashgate is given.
func (c *configMap) Path() string { return filepath.Join(c.dir, "rules.yaml") }

func (c *configMap) Update(data []byte) {
	t := c.t
	old := fmt.Sprintf("..2026_01_01_00_00_%02d.%d", c.version, c.version)
	c.version++
	ver := fmt.Sprintf("..2026_01_01_00_00_%02d.%d", c.version, c.version)
	if err := os.Mkdir(filepath.Join(c.dir, ver), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(c.dir, ver, "rules.yaml"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	tmp := filepath.Join(c.dir, "..data_tmp")
	if err := os.Symlink(ver, tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(c.dir, "..data")); err != nil {
		t.Fatal(err)
	}
	if c.version > 1 {
		_ = os.RemoveAll(filepath.Join(c.dir, old))
	}
}

// TestReload: bad descriptors files (truncated YAML, a negative limit, a
// duplicate YAML key, a duplicate rule) keep the old rules serving, health
// SERVING, and count flashgate_config_reloads_total{result="error"}; a
// later valid file applies within 2 s. Both with a plain file replaced by
// rename and with a ConfigMap-style ..data symlink swap; SIGHUP reloads
// too.
func TestReload(t *testing.T) {
	bad := []string{"bad_truncated.yaml", "bad_negative.yaml", "bad_duplicate_key.yaml", "bad_duplicate_descriptor.yaml"}

	t.Run("file", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "rules.yaml")
		writeAtomic(t, path, fixture(t, "uid.yaml"))
		p := startFlashgate(t, "--config", path, "--ban-duration", "0")
		if got := limitNow(p); got != 5 {
			t.Fatalf("initial rules: x-ratelimit-limit %d, want 5", got)
		}
		for _, name := range bad {
			reloadBad(t, p, name, func() { writeAtomic(t, path, fixture(t, name)) })
		}
		reloadGood(t, p, "uid3.yaml", 3, func() { writeAtomic(t, path, fixture(t, "uid3.yaml")) })

		// SIGHUP alone reloads the (unchanged) file.
		m0 := p.Metrics()
		p.Signal(syscall.SIGHUP)
		if took, ok := waitFor(reloadWithin, func() bool {
			return p.Metrics().Value("flashgate_config_reloads_total", "result", "success") > m0.Value("flashgate_config_reloads_total", "result", "success")
		}); !ok {
			t.Errorf(`SIGHUP: flashgate_config_reloads_total{result="success"} did not grow within %s`, reloadWithin)
		} else {
			t.Logf("SIGHUP reloaded in %s", took)
		}
		// SIGHUP with a bad file on disk counts an error and keeps the rules.
		if err := os.WriteFile(path, fixture(t, "bad_negative.yaml"), 0o644); err != nil {
			t.Fatal(err)
		}
		reloadBad(t, p, "bad_negative.yaml (SIGHUP)", func() { p.Signal(syscall.SIGHUP) })
		if got := limitNow(p); got != 3 {
			t.Errorf("after the bad SIGHUP reload: x-ratelimit-limit %d, want the old 3", got)
		}
	})

	t.Run("configmap", func(t *testing.T) {
		cm := newConfigMap(t, fixture(t, "uid.yaml"))
		p := startFlashgate(t, "--config", cm.Path(), "--ban-duration", "0")
		if got := limitNow(p); got != 5 {
			t.Fatalf("initial rules: x-ratelimit-limit %d, want 5", got)
		}
		for _, name := range bad[:2] {
			reloadBad(t, p, name+" (..data swap)", func() { cm.Update(fixture(t, name)) })
		}
		reloadGood(t, p, "uid7.yaml (..data swap)", 7, func() { cm.Update(fixture(t, "uid7.yaml")) })
		reloadGood(t, p, "uid3.yaml (..data swap)", 3, func() { cm.Update(fixture(t, "uid3.yaml")) })
	})
}

// reloadBad applies a bad file with do and checks that an error is counted
// within reloadWithin while the old rules keep serving and health stays
// SERVING.
func reloadBad(t *testing.T, p *proc, name string, do func()) {
	t.Helper()
	before := limitNow(p)
	m0 := p.Metrics()
	e0 := m0.Value("flashgate_config_reloads_total", "result", "error")
	do()
	took, ok := waitFor(reloadWithin, func() bool {
		return p.Metrics().Value("flashgate_config_reloads_total", "result", "error") > e0
	})
	if !ok {
		t.Errorf(`%s: flashgate_config_reloads_total{result="error"} did not grow within %s`, name, reloadWithin)
	} else {
		t.Logf("%s: error counted after %s", name, took)
	}
	// The old rules keep serving, and health stays SERVING, for a while.
	for i := 0; i < 5; i++ {
		if got := limitNow(p); got != before {
			t.Errorf("%s: x-ratelimit-limit %d after the bad file, want the old %d", name, got, before)
			break
		}
		if st, err := p.HealthStatus(); err != nil || st != healthpb.HealthCheckResponse_SERVING {
			t.Errorf("%s: health %v %v after the bad file, want SERVING", name, st, err)
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if p.Exited() {
		t.Fatalf("%s: flashgate exited", name)
	}
}

// reloadGood applies a valid file with do and checks that its limit want
// applies within reloadWithin and a success is counted.
func reloadGood(t *testing.T, p *proc, name string, want int, do func()) {
	t.Helper()
	s0 := p.Metrics().Value("flashgate_config_reloads_total", "result", "success")
	do()
	took, ok := waitFor(reloadWithin, func() bool { return limitNow(p) == want })
	if !ok {
		t.Errorf("%s: limit %d not in force within %s (x-ratelimit-limit %d)", name, want, reloadWithin, limitNow(p))
		return
	}
	t.Logf("%s: applied after %s", name, took)
	if s := p.Metrics().Value("flashgate_config_reloads_total", "result", "success"); s <= s0 {
		t.Errorf(`%s: applied, but flashgate_config_reloads_total{result="success"} stayed %v`, name, s)
	}
}
