package main

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// yamlBlock is one ```yaml block of a Markdown file.
type yamlBlock struct {
	file string
	line int // of the opening fence
	text string
}

// yamlBlocks returns the ```yaml blocks of a Markdown file.
func yamlBlocks(t *testing.T, file string) []yamlBlock {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var out []yamlBlock
	var cur *yamlBlock
	var indent string
	for i, line := range strings.Split(string(data), "\n") {
		trimmed := strings.TrimLeft(line, " ")
		switch {
		case cur == nil && strings.HasPrefix(trimmed, "```yaml"):
			cur, indent = &yamlBlock{file: file, line: i + 1}, line[:len(line)-len(trimmed)]
		case cur != nil && strings.HasPrefix(trimmed, "```"):
			out = append(out, *cur)
			cur = nil
		case cur != nil:
			cur.text += strings.TrimPrefix(line, indent) + "\n"
		}
	}
	if cur != nil {
		t.Fatalf("%s:%d: a ```yaml block is not closed", file, cur.line)
	}
	return out
}

// configFile matches a block that is a descriptors file or a ratelimit
// config: one with a top-level domain key.
var configFile = regexp.MustCompile(`(?m)^domain:`)

// TestDocsYAMLValidate: every ```yaml block of README.md and of the docs
// that is a config file (a top-level `domain:`) passes `flashgate
// validate`, with --config (a descriptors file) or --rls-config (a
// ratelimit config); a block passing neither fails the test with both
// errors. Other blocks (Envoy and Kubernetes fragments, checked by the envoy
// and k8s tests, and rate_limit fragments) are listed and skipped.
func TestDocsYAMLValidate(t *testing.T) {
	files := []string{"../../README.md", "../../envoy/README.md", "../../k8s/README.md"}
	for _, pattern := range []string{"../../docs/*.md", "../../docs/*/*.md", "../../charts/*/README.md"} {
		more, err := filepath.Glob(pattern)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, more...)
	}
	configs := 0
	for _, f := range files {
		if _, err := os.Stat(f); os.IsNotExist(err) {
			continue
		}
		for _, b := range yamlBlocks(t, f) {
			where := strings.TrimPrefix(b.file, "../../") + ":" + strconv.Itoa(b.line)
			if !configFile.MatchString(b.text) {
				t.Logf("%s: not a config file (no top-level domain), skipped", where)
				continue
			}
			configs++
			t.Run(where, func(t *testing.T) {
				dir := t.TempDir()
				path := filepath.Join(dir, "block.yaml")
				if err := os.WriteFile(path, []byte(b.text), 0o644); err != nil {
					t.Fatal(err)
				}
				var errs []string
				for _, args := range [][]string{{"--config", path}, {"--rls-config", dir}} {
					var stdout, stderr strings.Builder
					err := runEnv(context.Background(), append([]string{"validate"}, args...),
						env{stdout: &stdout, stderr: &stderr, lookupEnv: func(string) (string, bool) { return "", false }})
					if err == nil {
						t.Logf("valid with %s", args[0])
						return
					}
					errs = append(errs, args[0]+": "+stderr.String()+errorLine(err))
				}
				t.Errorf("the block is neither a valid descriptors file nor a valid ratelimit config:\n%s\n%s",
					strings.Join(errs, "\n"), b.text)
			})
		}
	}
	if configs < 2 {
		t.Errorf("%d config blocks found, want at least README's descriptors file and ratelimit config", configs)
	}
}
