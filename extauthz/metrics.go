package extauthz

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/flashgate/flashgate/enforce"
)

// frontEnd is ext_authz as it registers with the core: its metric family,
// under the names listed in docs/operations.md (unprefixed). Its limit keys
// take the rule names of the descriptors file, no namespace of its own.
var frontEnd = enforce.FrontEnd{Name: "ext_authz", Metrics: enforce.MetricNames{
	Requests: prometheus.Opts{
		Name: "flashgate_checks_total",
		Help: "ext_authz checks by domain, binding rule (empty when no rule matched) and decision.",
	},
	Duration: prometheus.Opts{
		Name: "flashgate_check_duration_seconds",
		Help: "Time to answer one ext_authz check, mapping and response included.",
	},
	Reloads: prometheus.Opts{
		Name: "flashgate_config_reloads_total",
		Help: "Descriptors file reloads by result: success or error.",
	},
	BackendErrors: prometheus.Opts{
		Name: "flashgate_backend_errors_total",
		Help: "Checks the backend could not decide, by kind: timeout, canceled, connection, breaker_open, invalid_hit, fallback, other.",
	},
	FailureModes: prometheus.Opts{
		Name: "flashgate_failure_mode_decisions_total",
		Help: "Checks decided by a failure mode because the backend failed, by mode: local, allow or deny.",
	},
	LocalDenials: prometheus.Opts{
		Name: "flashgate_local_denials_total",
		Help: "Denials decided by the local guard without a backend round trip, by reason: full or banned.",
	},
	BackendDuration: prometheus.Opts{
		Name: "flashgate_redis_duration_seconds",
		Help: "Time spent in the rate-limit backend (Redis, or Memory when embedded) per check that reached it, errors included.",
	},
}}

// ReservedRulePrefix begins no rule name of a descriptors file: it is the
// key namespace of the ratelimit service that serve runs beside ext_authz
// (--rls-config), which keys a domain's windows under the rule
// rls.<domain>; a rule of the same name would share them.
const ReservedRulePrefix = "rls."

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
		for _, d := range enforce.Decisions {
			m.checks.DeleteLabelValues(old.Domain, rule, d)
		}
	}
	drop("")
	for _, r := range old.Rules {
		drop(r.Name)
	}
}
