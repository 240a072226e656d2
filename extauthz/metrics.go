package extauthz

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/flashgate/flashgate/descriptors"
	"github.com/flashgate/flashgate/enforce"
)

// metrics are ext_authz's own Prometheus metrics, listed in docs/operations.md:
// flashgate_checks_total and flashgate_check_duration_seconds, registered
// by the core with its own (enforce.FrontMetrics; the Reloader counts
// flashgate_config_reloads_total). Labels never carry request values: rule and
// domain come from the descriptors file.
type metrics struct {
	checks   *prometheus.CounterVec
	checkDur prometheus.Histogram
}

func newMetrics(fm enforce.FrontMetrics) *metrics {
	return &metrics{checks: fm.Requests, checkDur: fm.Duration}
}

// ruleCounters are the flashgate_checks_total children of one rule,
// resolved once per rule set so a check does no label lookup.
type ruleCounters struct {
	allowed, denied, shadowDenied, errored prometheus.Counter
}

func (m *metrics) forRule(domain, rule string) ruleCounters {
	return ruleCounters{
		allowed:      m.checks.WithLabelValues(domain, rule, enforce.DecisionAllowed),
		denied:       m.checks.WithLabelValues(domain, rule, enforce.DecisionDenied),
		shadowDenied: m.checks.WithLabelValues(domain, rule, enforce.DecisionShadowDenied),
		errored:      m.checks.WithLabelValues(domain, rule, enforce.DecisionError),
	}
}

// dropRules deletes the flashgate_checks_total series of old's rules that
// cur does not have (old's rule="" series too when the domain changed), so
// that a reload leaves the series of the rules in force only. Call it after
// cur is swapped in. A check still running under old counts into a child
// resolved before the swap: once deleted, that child is no longer exported
// and its late count is lost; it never brings the series back.
func (m *metrics) dropRules(old, cur *descriptors.Config) {
	keep := make(map[string]struct{}, len(cur.Rules)+1)
	if old.Domain == cur.Domain {
		keep[""] = struct{}{}
		for _, r := range cur.Rules {
			keep[r.Name] = struct{}{}
		}
	}
	drop := func(rule string) {
		if _, ok := keep[rule]; ok {
			return
		}
		for _, d := range enforce.Decisions {
			m.checks.DeleteLabelValues(old.Domain, rule, d)
		}
	}
	drop("")
	for _, r := range old.Rules {
		drop(r.Name)
	}
}
