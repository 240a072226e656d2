// Package enforcetest is what the tests of every front-end share about
// the enforcement core's answers: it reads the core's metrics as /metrics
// shows them, and checks the rate-limit header fields and the denial's
// body an answer carries (CheckHeaders, CheckProblem) with a strict RFC
// 8941 structured-field parser (ParseList), as a client would read them.
package enforcetest

import (
	"fmt"
	"slices"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// Counter returns the value of the series of counter family whose one
// label has value (the core's counters: backend errors by kind,
// failure-mode decisions by mode, local denials by reason), as g gathers
// it; 0 when g has no such series.
func Counter(t testing.TB, g prometheus.Gatherer, family, value string) float64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != family {
			continue
		}
		for _, m := range mf.GetMetric() {
			if ls := m.GetLabel(); len(ls) == 1 && ls[0].GetValue() == value {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

// RuleSeries returns the "domain/rule" pairs of family's series (a
// front-end's per-rule decision counter) as g gathers them, sorted, the
// first ten then "… N more", and how many series there are.
func RuleSeries(t testing.TB, g prometheus.Gatherer, family string) ([]string, int) {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var pairs []string
	n := 0
	for _, mf := range mfs {
		if mf.GetName() != family {
			continue
		}
		for _, m := range mf.GetMetric() {
			n++
			var dom, rule string
			for _, l := range m.GetLabel() {
				switch l.GetName() {
				case "domain":
					dom = l.GetValue()
				case "rule":
					rule = l.GetValue()
				}
			}
			if p := dom + "/" + rule; !slices.Contains(pairs, p) {
				pairs = append(pairs, p)
			}
		}
	}
	slices.Sort(pairs)
	if len(pairs) > 10 { // keep failure messages short
		pairs = append(pairs[:10], fmt.Sprintf("… %d more", len(pairs)-10))
	}
	return pairs, n
}
