package main

import (
	"flag"
	"fmt"
	"os"
	"strings"
	"testing"
)

var updateReadme = flag.Bool("update-readme", false, "rewrite docs/ratelimit.md's table of ratelimit's variables from ratelimitVars")

// ratelimitTableDoc is the page that holds the table of ratelimit's
// variables, between the markers below.
const ratelimitTableDoc = "../../docs/ratelimit.md"

// Markers around the table of ratelimit's variables.
const (
	ratelimitTableBegin = "<!-- ratelimit env table: generated from cmd/flashgate/ratelimit_env.go by `go test ./cmd/flashgate -run TestReadmeRatelimitTable -update-readme` -->\n"
	ratelimitTableEnd   = "<!-- end of ratelimit env table -->\n"
)

// ratelimitTable renders ratelimitVars as the docs' table; a row whose
// flag this build lacks says so.
func ratelimitTable() string {
	fs := serveFlags()
	var b strings.Builder
	b.WriteString("| variable | ratelimit's default | serve flag | how, or why not honoured |\n|---|---|---|---|\n")
	for _, r := range ratelimitVars {
		def := ""
		if r.def != "" {
			def = "`" + r.def + "`"
		}
		to := "not honoured"
		if r.flag != "" {
			to = "`--" + r.flag + "`"
			if fs.Lookup(r.flag) == nil {
				to += " (not honoured yet: not in this build)"
			}
		}
		fmt.Fprintf(&b, "| `%s` | %s | %s | %s |\n", r.name, def, to, strings.ReplaceAll(r.note, "|", "\\|"))
	}
	return b.String()
}

// TestReadmeRatelimitTable: the table of ratelimit's variables in
// docs/ratelimit.md, the page for users of envoyproxy/ratelimit, is
// ratelimitVars's; the README, the project's front page, holds no copy of
// it that could go stale.
func TestReadmeRatelimitTable(t *testing.T) {
	if data, err := os.ReadFile("../../README.md"); err != nil {
		t.Fatal(err)
	} else if strings.Contains(string(data), ratelimitTableBegin) {
		t.Errorf("README.md holds the ratelimit env table; it belongs in %s", strings.TrimPrefix(ratelimitTableDoc, "../../"))
	}
	data, err := os.ReadFile(ratelimitTableDoc)
	if os.IsNotExist(err) {
		// The page is not written yet: nothing to compare (the README
		// check above still applies).
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	doc := string(data)
	i, j := strings.Index(doc, ratelimitTableBegin), strings.Index(doc, ratelimitTableEnd)
	if i < 0 || j < i {
		t.Fatalf("%s lacks the markers of the ratelimit env table:\n%s%s", ratelimitTableDoc, ratelimitTableBegin, ratelimitTableEnd)
	}
	got, want := doc[i+len(ratelimitTableBegin):j], ratelimitTable()
	if got == want {
		return
	}
	if *updateReadme {
		if err := os.WriteFile(ratelimitTableDoc, []byte(doc[:i+len(ratelimitTableBegin)]+want+doc[j:]), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	t.Errorf("%s's ratelimit env table differs from ratelimitVars; run with -update-readme. Want:\n%s", ratelimitTableDoc, want)
}
