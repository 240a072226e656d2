package monitoring

import (
	"os"
	"regexp"
	"strings"
	"testing"
)

const opsDoc = "../docs/operations-monitoring.md"

// TestOperationsDoc checks that docs/operations-monitoring.md explains every
// alert (a "### Alert" section) and every dashboard row and panel (a
// "### Row" section, a "**Panel.**" paragraph), and names no alert that
// does not exist.
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
}
