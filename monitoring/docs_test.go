package monitoring

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

const opsDoc = "../docs/operations-monitoring.md"

// TestOperationsDoc checks that docs/operations-monitoring.md explains every
// alert (a "### Alert" section) and every dashboard row and panel (a
// "### Row" section, a "**Panel.**" paragraph), names no alert that does
// not exist, and that its Prometheus configuration passes `promtool check
// config`.
func TestOperationsDoc(t *testing.T) {
	data, err := os.ReadFile(opsDoc)
	if err != nil {
		t.Fatal(err)
	}
	doc := string(data)
	alerts := map[string]bool{}
	for _, r := range alertRules(t) {
		if r.Alert == "" {
			continue
		}
		alerts[r.Alert] = true
		if !strings.Contains(doc, "\n### "+r.Alert+"\n") {
			t.Errorf("%s has no section \"### %s\"", opsDoc, r.Alert)
		}
	}
	for _, m := range regexp.MustCompile(`\bFlashgate[A-Z][A-Za-z]+`).FindAllString(doc, -1) {
		if !alerts[m] {
			t.Errorf("%s names alert %s, which %s does not define", opsDoc, m, alertsFile)
		}
	}
	for _, p := range loadDashboard(t).allPanels() {
		want := "**" + p.Title + ".**"
		if p.Type == "row" {
			want = "\n### " + p.Title + "\n"
		}
		if !strings.Contains(doc, want) {
			t.Errorf("%s does not explain %s %q (want %q)", opsDoc, p.Type, p.Title, strings.TrimSpace(want))
		}
	}

	// The prometheus.yml shown, with the alerts as the file it names.
	blocks := regexp.MustCompile("(?s)```yaml\n(rule_files:\n  - flashgate-alerts.yaml .*?)```").FindAllStringSubmatch(doc, -1)
	if len(blocks) != 1 {
		t.Fatalf("%s: %d prometheus.yml blocks naming flashgate-alerts.yaml, want 1", opsDoc, len(blocks))
	}
	dir := t.TempDir()
	rules, err := os.ReadFile(alertsFile)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "flashgate-alerts.yaml"), rules, 0o644); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(file, []byte(blocks[0][1]), 0o644); err != nil {
		t.Fatal(err)
	}
	promtool(t, "check", "config", file)
}
