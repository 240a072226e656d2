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

// reloadWithin is how soon a changed descriptors file must apply.
const reloadWithin = 2 * time.Second

// giveUp bounds how long a test waits for a reload to show: far past
// reloadWithin, so that a slow machine is told apart from a late reload by
// the polls themselves (see untilApplied), not by this bound.
const giveUp = 15 * time.Second

// untilApplied polls cond until it holds or giveUp passes after since, and
// returns stale: how long after since the last poll that still found cond
// false was sent. A reload is late only if a poll sent reloadWithin after
// the change still saw the old state; a poll that was merely slow to come
// back on a busy machine proves nothing, so stale, not the time until cond
// was seen, is what is held to reloadWithin.
func untilApplied(since time.Time, cond func() bool) (stale time.Duration, ok bool) {
	for {
		sent := time.Now()
		if cond() {
			return stale, true
		}
		stale = sent.Sub(since)
		if time.Since(since) > giveUp {
			return stale, false
		}
		time.Sleep(10 * time.Millisecond)
	}
}

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
	t       testing.TB
	dir     string
	version int
}

func newConfigMap(t testing.TB, data []byte) *configMap {
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
		since := time.Now()
		p.Signal(syscall.SIGHUP)
		stale, ok := untilApplied(since, func() bool {
			return p.Metrics().Value("flashgate_config_reloads_total", "result", "success") > m0.Value("flashgate_config_reloads_total", "result", "success")
		})
		switch {
		case !ok:
			t.Errorf(`SIGHUP: flashgate_config_reloads_total{result="success"} did not grow within %s`, giveUp)
		case stale >= reloadWithin:
			t.Errorf(`SIGHUP: flashgate_config_reloads_total{result="success"} had not grown %s after the signal, want within %s`, stale, reloadWithin)
		default:
			t.Logf("SIGHUP reloaded within %s (seen %s after the signal)", stale, time.Since(since))
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
// within reloadWithin (see untilApplied) while the old rules keep serving
// and health stays SERVING.
func reloadBad(t *testing.T, p *proc, name string, do func()) {
	t.Helper()
	before := limitNow(p)
	m0 := p.Metrics()
	e0 := m0.Value("flashgate_config_reloads_total", "result", "error")
	since := time.Now()
	do()
	stale, ok := untilApplied(since, func() bool {
		return p.Metrics().Value("flashgate_config_reloads_total", "result", "error") > e0
	})
	switch {
	case !ok:
		t.Errorf(`%s: flashgate_config_reloads_total{result="error"} did not grow within %s`, name, giveUp)
	case stale >= reloadWithin:
		t.Errorf(`%s: flashgate_config_reloads_total{result="error"} had not grown %s after the change, want within %s`, name, stale, reloadWithin)
	default:
		t.Logf("%s: error counted within %s (seen %s after the change)", name, stale, time.Since(since))
	}
	// The old rules keep serving, and health stays SERVING, for a while.
	for i := 0; i < 5; i++ {
		if got := limitNow(p); got != before {
			t.Errorf("%s: x-ratelimit-limit %d after the bad file, want the old %d", name, got, before)
			break
		}
		// A generous deadline: only the answer matters, not how fast a busy
		// machine gives it.
		if st, err := p.healthStatus(giveUp); err != nil || st != healthpb.HealthCheckResponse_SERVING {
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
// applies within reloadWithin (see untilApplied) and a success is counted.
func reloadGood(t *testing.T, p *proc, name string, want int, do func()) {
	t.Helper()
	s0 := p.Metrics().Value("flashgate_config_reloads_total", "result", "success")
	since := time.Now()
	do()
	stale, ok := untilApplied(since, func() bool { return limitNow(p) == want })
	if !ok {
		t.Errorf("%s: limit %d not in force within %s (x-ratelimit-limit %d)", name, want, giveUp, limitNow(p))
		return
	}
	if stale >= reloadWithin {
		t.Errorf("%s: a check sent %s after the change still saw the old limit, want the new %d within %s", name, stale, want, reloadWithin)
	}
	t.Logf("%s: applied within %s (seen %s after the change)", name, stale, time.Since(since))
	// The rules are swapped in, then the success counted: a check may see
	// the new rules a moment before the counter grows.
	for end := time.Now().Add(giveUp); ; time.Sleep(10 * time.Millisecond) {
		s := p.Metrics().Value("flashgate_config_reloads_total", "result", "success")
		if s > s0 {
			return
		}
		if time.Now().After(end) {
			t.Errorf(`%s: applied, but flashgate_config_reloads_total{result="success"} stayed %v for %s`, name, s, giveUp)
			return
		}
	}
}
