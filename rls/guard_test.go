package rls

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"
)

// TestEveryError: a file with several mistakes reports every one at its
// position, in file order, the same on every run (unknown keys were found
// by a map walk, in random order): every field of a descriptor and of its
// rate_limit, and a bad descriptor without hiding its siblings or its
// nested ones; past MaxErrors the list ends with how many more there are.
func TestEveryError(t *testing.T) {
	descFields := "known fields: key, value, rate_limit, descriptors, shadow_mode, detailed_metric, value_to_metric, share_threshold, quota_mode, metadata, failure_mode, local_share, ban, lease"
	rlFields := "known fields: unit, requests_per_unit, unit_multiplier, unlimited, name, replaces, requests, window, algorithm, buckets"
	fortnight := `: invalid rate limit unit "fortnight": want second, minute, hour, day or week`
	var overTwenty []string
	for i := range MaxErrors {
		overTwenty = append(overTwenty, fmt.Sprintf(":%d:18%s", 4+2*i, fortnight))
	}
	tests := map[string]struct {
		want []string
		more int
	}{
		"unknown_fields": {want: []string{
			`:4:5: unknown field "zzz"; ` + descFields,
			`:5:5: unknown field "aaa"; ` + descFields,
			`:6:54: unknown field "yyy"; ` + rlFields,
			`:6:62: unknown field "bbb"; ` + rlFields,
			":8:18" + fortnight,
		}},
		"every_field": {want: []string{
			`:3:5: share_threshold applies to a wildcard value (with a *); "" has none`,
			`:4:5: failure_mode "open" must be local, allow or deny`,
			":5:5: local_share must be between 1 and 1000000, not 0 (omit it to share the limit evenly among the live sidecars)",
			":7:18" + fortnight,
			":7:35: unit_multiplier must be at least 1",
			`:7:55: algorithm "fast" must be auto, exact or buckets`,
			":7:84: replaces entry has an empty name",
			":8:5: descriptor has an empty key",
			":9:18: requests must be at least 1, not 0",
			`:9:31: window "1 sec": in a ratelimit config, a whole number of seconds from 1s to 168h0m0s (current_limit reports it in a unit)`,
			`:12:5: duplicate descriptor composite key "every.b"`,
			":15:36: requests_per_unit must be at most 1000000 per window, not 9999999",
		}},
		"over_twenty": {want: overTwenty, more: 5},
		// each value of the wrong type, and the checks of the others
		"wrong_types": {want: []string{
			":4:18: cannot unmarshal uint64 into Go struct field yamlFile.Descriptors of type bool",
			":5:51: cannot unmarshal -1 into Go value of type uint32 ( overflow )",
			":6:10: cannot unmarshal []interface {} into Go struct field yamlFile.Descriptors of type string",
			":9:18: cannot unmarshal string into Go struct field yamlFile.Descriptors of type int64",
			":10:24: cannot unmarshal []interface {} into Go struct field yamlFile.Descriptors of type string",
			":10:53: cannot unmarshal 99999999999 into Go value of type uint32 ( overflow )",
			":12:18" + fortnight,
		}},
	}
	files, err := filepath.Glob("testdata/many/*.yaml")
	if err != nil || len(files) != len(tests) {
		t.Errorf("%d fixtures (%v), %d table entries", len(files), err, len(tests))
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			path := "testdata/many/" + name + ".yaml"
			data, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			var lines []string
			for _, w := range tc.want {
				lines = append(lines, path+w)
			}
			if tc.more > 0 {
				lines = append(lines, fmt.Sprintf("and %d more", tc.more))
			}
			for range 20 {
				_, err := ParseFiles([]File{{Name: path, Data: data}})
				var errs ConfigErrors
				if !errors.As(err, &errs) {
					t.Fatalf("ParseFiles: %v (%T), want ConfigErrors", err, err)
				}
				if got := errs.Error(); got != strings.Join(lines, "\n") {
					t.Fatalf("errors:\n%s\nwant:\n%s", got, strings.Join(lines, "\n"))
				}
				if errs.Len() != len(tc.want)+tc.more {
					t.Fatalf("Len %d, want %d", errs.Len(), len(tc.want)+tc.more)
				}
			}
		})
	}
}

// TestErrorsBounded: no more than MaxErrors errors are reported, the first
// ones of the file.
func TestErrorsBounded(t *testing.T) {
	var b strings.Builder
	b.WriteString("domain: d\ndescriptors:\n")
	for i := range 50 {
		fmt.Fprintf(&b, "  - key: k%d\n    typo: 1\n", i)
	}
	_, err := ParseFiles([]File{{Name: "d.yaml", Data: []byte(b.String())}})
	var errs ConfigErrors
	if !errors.As(err, &errs) || len(errs.List) != MaxErrors || errs.More != 50-MaxErrors {
		t.Fatalf("%v, want %d errors listed and %d more", err, MaxErrors, 50-MaxErrors)
	}
	if errs.List[0].Line != 4 || errs.List[MaxErrors-1].Line != 2+2*MaxErrors {
		t.Errorf("lines %d to %d, want the first ones", errs.List[0].Line, errs.List[MaxErrors-1].Line)
	}
}

// bombs are nesting bombs of the sizes met in the field.
var bombs = map[string]struct{ data, at string }{
	"30 KB of [":     {strings.Repeat("[", 30000), ":1:65: "},
	"150 KB of {a: ": {"domain: d\ndescriptors: " + strings.Repeat("{a: ", 37500), ":2:266: "},
	"200 KB of - ":   {"domain: d\ndescriptors:\n" + strings.Repeat("- ", 100000), ":3:127: "},
}

// TestLoadRefusesBombsBoundedMemory: a nesting bomb in a config directory
// is refused at its position, having allocated far less than parsing it
// would (over a gigabyte for these files).
func TestLoadRefusesBombsBoundedMemory(t *testing.T) {
	for name, tc := range bombs {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "bomb.yaml")
			if err := os.WriteFile(path, []byte(tc.data), 0o644); err != nil {
				t.Fatal(err)
			}
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			_, err := LoadDir(dir)
			runtime.ReadMemStats(&after)
			var ce *ConfigError
			if !errors.As(err, &ce) || !strings.HasPrefix(err.Error(), path+tc.at+"the YAML is nested deeper than 64 levels") {
				t.Fatalf("LoadDir: %v, want the nesting refused at %s", err, tc.at)
			}
			if n := after.TotalAlloc - before.TotalAlloc; n > 64<<20 {
				t.Errorf("refusing it allocated %d MiB, want < 64", n>>20)
			}
		})
	}
}

// TestReloadRefusesBomb: on a live server, a nesting bomb is refused and
// counted, the config kept, and a valid file written afterwards is picked
// up: the bomb never holds the watcher.
func TestReloadRefusesBomb(t *testing.T) {
	for name, tc := range bombs {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			file := filepath.Join(dir, "d.yaml")
			write := func(s string) {
				t.Helper()
				if err := os.WriteFile(file, []byte(s), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			write("domain: one\ndescriptors:\n  - key: k\n")
			cfg, err := LoadDir(dir)
			if err != nil {
				t.Fatal(err)
			}
			s, _ := newMemoryServer(t, cfg, nil)
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error)
			go func() { done <- s.Reloader(dir).Watch(ctx, 10*time.Millisecond) }()
			defer func() { cancel(); <-done }()

			write(tc.data)
			errs := s.core.Metrics().Reloads.WithLabelValues("error")
			waitUntil(t, "the bomb's error", func() bool { return counterValue(t, errs) == 1 })
			if s.Config().domains["one"] == nil {
				t.Fatal("the bomb replaced the config")
			}
			write("domain: two\ndescriptors:\n  - key: k\n")
			ok := s.core.Metrics().Reloads.WithLabelValues("success")
			waitUntil(t, "the valid file after the bomb", func() bool {
				return s.Config().domains["two"] != nil && counterValue(t, ok) == 1
			})
		})
	}
}

// TestReadDirRefusesDirectoryOrLoop: a *.yaml entry that is a directory or
// a symlink loop is an error (counted by a reload), not a file skipped in
// silence or a domain dropped.
func TestReadDirRefusesDirectoryOrLoop(t *testing.T) {
	for name, make := range map[string]func(path string) error{
		"directory":    func(path string) error { return os.Mkdir(path, 0o755) },
		"symlink loop": func(path string) error { return os.Symlink(filepath.Base(path), path) },
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			if err := os.WriteFile(filepath.Join(dir, "a.yaml"), []byte("domain: a\ndescriptors:\n  - key: k\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			b := filepath.Join(dir, "b.yaml")
			if err := os.WriteFile(b, []byte("domain: b\ndescriptors:\n  - key: k\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			cfg, err := LoadDir(dir)
			if err != nil {
				t.Fatal(err)
			}
			s, _ := newMemoryServer(t, cfg, nil)
			if err := os.Remove(b); err != nil {
				t.Fatal(err)
			}
			if err := make(b); err != nil {
				t.Fatal(err)
			}
			if err := s.Reloader(dir).Reload(); err == nil {
				t.Fatal("reload succeeded")
			}
			if n := counterValue(t, s.core.Metrics().Reloads.WithLabelValues("error")); n != 1 {
				t.Errorf("%v reload errors counted, want 1", n)
			}
			if s.Config().domains["b"] == nil {
				t.Error("domain b was dropped")
			}
		})
	}
}

// waitUntil polls cond for up to 10 seconds.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
