package extauthz

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/flashgate/flashgate/enforce"
)

// Decision labels of flashgate_checks_total.
const (
	decisionAllowed      = "allowed"
	decisionDenied       = "denied"
	decisionShadowDenied = "shadow_denied"
	decisionError        = "error"
)

// metrics are ext_authz's own Prometheus metrics, listed in the README;
// the core (package enforce) counts backend errors, failure-mode
// decisions, local denials and the backend's latency. Labels never carry
// request values: rule and domain come from the descriptors file.
type metrics struct {
	checks   *prometheus.CounterVec
	checkDur prometheus.Histogram
	reloads  *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		checks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "flashgate_checks_total",
			Help: "ext_authz checks by domain, binding rule (empty when no rule matched) and decision.",
		}, []string{"domain", "rule", "decision"}),
		checkDur: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "flashgate_check_duration_seconds",
			Help:    "Time to answer one ext_authz check, mapping and response included.",
			Buckets: enforce.DurationBuckets,
		}),
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "flashgate_config_reloads_total",
			Help: "Descriptors file reloads by result: success or error.",
		}, []string{"result"}),
	}
	for _, c := range []prometheus.Collector{m.checks, m.checkDur, m.reloads} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register metrics: %w", err)
		}
	}
	for _, r := range []string{"success", "error"} {
		m.reloads.WithLabelValues(r)
	}
	return m, nil
}

// ruleCounters are the flashgate_checks_total children of one rule,
// resolved once per rule set so a check does no label lookup.
type ruleCounters struct {
	allowed, denied, shadowDenied, errored prometheus.Counter
}

func (m *metrics) forRule(domain, rule string) ruleCounters {
	return ruleCounters{
		allowed:      m.checks.WithLabelValues(domain, rule, decisionAllowed),
		denied:       m.checks.WithLabelValues(domain, rule, decisionDenied),
		shadowDenied: m.checks.WithLabelValues(domain, rule, decisionShadowDenied),
		errored:      m.checks.WithLabelValues(domain, rule, decisionError),
	}
}

// dropRules deletes the flashgate_checks_total series of old's rules that
// cur does not have (old's rule="" series too when the domain changed), so
// that a reload leaves the series of the rules in force only. Call it after
// cur is swapped in. A check still running under old counts into a child
// resolved before the swap: once deleted, that child is no longer exported
// and its late count is lost; it never brings the series back.
func (m *metrics) dropRules(old, cur *Config) {
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
		for _, d := range []string{decisionAllowed, decisionDenied, decisionShadowDenied, decisionError} {
			m.checks.DeleteLabelValues(old.Domain, rule, d)
		}
	}
	drop("")
	for _, r := range old.Rules {
		drop(r.Name)
	}
}
