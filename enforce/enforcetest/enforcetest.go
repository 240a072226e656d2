// Package enforcetest reads the enforcement core's metrics in tests, as
// /metrics shows them.
package enforcetest

import (
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
