package k8s

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

// podFragment matches a ```yaml block of the docs that is a Pod's
// `containers:` list.
var podFragment = regexp.MustCompile(`(?m)^containers:`)

// docYAMLBlocks returns the ```yaml blocks of the README, BENCHMARKS.md, the
// wiring READMEs, every page under docs/ and a chart's README, each with
// the FILE:LINE of its opening fence; a block indented inside a list item
// loses its indentation.
func docYAMLBlocks(t *testing.T) (where, text []string) {
	t.Helper()
	files := []string{"../README.md", "../BENCHMARKS.md", "../envoy/README.md", "README.md"}
	for _, pattern := range []string{"../docs/*.md", "../docs/*/*.md", "../charts/*/README.md"} {
		more, err := filepath.Glob(pattern)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, more...)
	}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if os.IsNotExist(err) {
			continue
		} else if err != nil {
			t.Fatal(err)
		}
		open, indent, lang, block := 0, "", "", ""
		for i, line := range strings.Split(string(data), "\n") {
			trimmed := strings.TrimLeft(line, " ")
			fence := strings.HasPrefix(trimmed, "```")
			switch {
			case !fence && open != 0:
				block += strings.TrimPrefix(line, indent) + "\n"
			case fence && open == 0:
				open, indent, lang, block = i+1, line[:len(line)-len(trimmed)], strings.TrimSpace(trimmed[3:]), ""
			case fence:
				if lang == "yaml" || lang == "yml" {
					where = append(where, fmt.Sprintf("%s:%d", strings.TrimPrefix(f, "../"), open))
					text = append(text, block)
				}
				open = 0
			}
		}
		if open != 0 {
			t.Fatalf("%s:%d: a ``` block is not closed", f, open)
		}
	}
	return where, text
}

// checkContainersBlock decodes a `containers:` fragment of a Pod spec
// strictly into Kubernetes' types.
func checkContainersBlock(text string) error {
	var spec struct {
		Containers []corev1.Container `json:"containers"`
	}
	if err := yaml.UnmarshalStrict([]byte(text), &spec); err != nil {
		return err
	}
	for _, c := range spec.Containers {
		if c.Name == "" || c.Image == "" {
			return fmt.Errorf("a container without a name or image")
		}
	}
	return nil
}

// TestDocsPodFragments: a Pod's `containers:` fragment in the docs decodes
// strictly into Kubernetes' types.
func TestDocsPodFragments(t *testing.T) {
	pods := 0
	where, text := docYAMLBlocks(t)
	for i := range text {
		if !podFragment.MatchString(text[i]) {
			continue
		}
		pods++
		if err := checkContainersBlock(text[i]); err != nil {
			t.Errorf("%s: a containers fragment that Kubernetes refuses: %v\n%s", where[i], err, text[i])
		}
	}
	if pods < 1 {
		t.Errorf("%d Kubernetes fragments checked; want the README's sidecar", pods)
	}
}

func TestCheckContainersBlockRefusesMistakes(t *testing.T) {
	if err := checkContainersBlock("containers:\n  - name: flashgate\n    image: flashgate:dev\n    envs: []\n"); err == nil {
		t.Error("checkContainersBlock accepted an unknown field")
	}
}
