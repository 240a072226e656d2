// Package enforcetest is what every front-end's tests share about the
// core's answers: its metrics as /metrics shows them, and a strict check
// of the rate-limit header fields and the denial's body.
package enforcetest

import (
	"fmt"
	"slices"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// Counter returns the value of counter family's series whose one label has
// value, as g gathers it; 0 when there is none.
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

// RuleSeries returns family's "domain/rule" series, sorted, the first ten
// then "… N more", and how many there are.
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
