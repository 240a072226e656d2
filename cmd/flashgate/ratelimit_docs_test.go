package main

import (
	"flag"
	"fmt"
	"os"
	"strings"
	"testing"
)

var updateReadme = flag.Bool("update-readme", false, "rewrite README.md's table of ratelimit's variables from ratelimitVars")

// Markers around the README's table of ratelimit's variables.
const (
	ratelimitTableBegin = "<!-- ratelimit env table: generated from cmd/flashgate/ratelimit_env.go by `go test ./cmd/flashgate -run TestReadmeRatelimitTable -update-readme` -->\n"
	ratelimitTableEnd   = "<!-- end of ratelimit env table -->\n"
)

// ratelimitTable renders ratelimitVars as the README's table; a row whose
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

// TestReadmeRatelimitTable: the README's table of ratelimit's variables is
// ratelimitVars's.
func TestReadmeRatelimitTable(t *testing.T) {
	const path = "../../README.md"
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	readme := string(data)
	i, j := strings.Index(readme, ratelimitTableBegin), strings.Index(readme, ratelimitTableEnd)
	if i < 0 || j < i {
		t.Fatalf("README.md lacks the markers of the ratelimit env table:\n%s%s", ratelimitTableBegin, ratelimitTableEnd)
	}
	got, want := readme[i+len(ratelimitTableBegin):j], ratelimitTable()
	if got == want {
		return
	}
	if *updateReadme {
		if err := os.WriteFile(path, []byte(readme[:i+len(ratelimitTableBegin)]+want+readme[j:]), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	t.Errorf("README.md's ratelimit env table differs from ratelimitVars; run with -update-readme. Want:\n%s", want)
}
