package main

import (
	"flag"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/flashgate/flashgate/daemon/ratelimitenv"
)

var updateDocs = flag.Bool("update-docs", false, "rewrite docs/ratelimit.md's table of ratelimit's variables from ratelimitenv.Vars()")

// Markers around docs/ratelimit.md's table of ratelimit's variables.
const (
	ratelimitTableBegin = "<!-- ratelimit env table: generated from daemon/ratelimitenv by `go test ./cmd/flashgate -run TestRatelimitDocsTable -update-docs` -->\n"
	ratelimitTableEnd   = "<!-- end of ratelimit env table -->\n"
)

// ratelimitTable renders ratelimitenv.Vars() as the docs' table; a row whose
// flag this build lacks says so.
func ratelimitTable() string {
	fs := serveFlags()
	var b strings.Builder
	b.WriteString("| variable | ratelimit's default | serve flag | how, or why not honoured |\n|---|---|---|---|\n")
	for _, r := range ratelimitenv.Vars() {
		def := ""
		if r.Default != "" {
			def = "`" + r.Default + "`"
		}
		to := "not honoured"
		if r.Flag != "" {
			to = "`--" + r.Flag + "`"
			if fs.Lookup(r.Flag) == nil {
				to += " (not honoured yet: not in this build)"
			}
		}
		fmt.Fprintf(&b, "| `%s` | %s | %s | %s |\n", r.Name, def, to, strings.ReplaceAll(r.Note, "|", "\\|"))
	}
	return b.String()
}

// TestRatelimitDocsTable: docs/ratelimit.md's table of ratelimit's
// variables is ratelimitenv.Vars()'s.
func TestRatelimitDocsTable(t *testing.T) {
	const path = "../../docs/ratelimit.md"
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	doc := string(data)
	i, j := strings.Index(doc, ratelimitTableBegin), strings.Index(doc, ratelimitTableEnd)
	if i < 0 || j < i {
		t.Fatalf("%s lacks the markers of the ratelimit env table:\n%s%s", path, ratelimitTableBegin, ratelimitTableEnd)
	}
	got, want := doc[i+len(ratelimitTableBegin):j], ratelimitTable()
	if got == want {
		return
	}
	if *updateDocs {
		if err := os.WriteFile(path, []byte(doc[:i+len(ratelimitTableBegin)]+want+doc[j:]), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	t.Errorf("%s's ratelimit env table differs from ratelimitenv.Vars(); run with -update-docs. Want:\n%s", path, want)
}
