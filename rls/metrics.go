package rls

import (
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/flashgate/flashgate/enforce"
)

// frontEnd is the RLS as it registers with the core: its metric family,
// flashgate_rls_* (no backend latency), and its key namespace, KeyNamespace.
var frontEnd = enforce.FrontEnd{Name: "rls", KeyNamespace: KeyNamespace, Metrics: enforce.MetricNames{
	Requests: prometheus.Opts{
		Name: "flashgate_rls_requests_total",
		Help: "ShouldRateLimit calls by domain, binding rule (rate_limit.name, else its descriptor path; empty when none matched) and decision.",
	},
	Duration: prometheus.Opts{
		Name: "flashgate_rls_request_duration_seconds",
		Help: "Time to answer one ShouldRateLimit call.",
	},
	Reloads: prometheus.Opts{
		Name: "flashgate_rls_config_reloads_total",
		Help: "ratelimit config directory reloads by result: success or error.",
	},
	BackendErrors: prometheus.Opts{
		Name: "flashgate_rls_backend_errors_total",
		Help: "ShouldRateLimit calls the backend could not decide, by kind (window.ErrKind, or fallback).",
	},
	FailureModes: prometheus.Opts{
		Name: "flashgate_rls_failure_mode_decisions_total",
		Help: "ShouldRateLimit calls decided by the failure mode because the backend failed, by mode: local, allow or deny.",
	},
	LocalDenials: prometheus.Opts{
		Name: "flashgate_rls_local_denials_total",
		Help: "ShouldRateLimit denials decided by the local guard without a backend round trip, by reason: full or banned.",
	},
}}

// metrics are the RLS server's own Prometheus metrics:
// flashgate_rls_requests_total and flashgate_rls_request_duration_seconds,
// registered by the core with its own (enforce.FrontMetrics; the Reloader
// counts flashgate_rls_config_reloads_total). Labels never carry request values: domain and
// rule come from the config files (an unknown domain counts under
// domain=""; request overrides under rule="override").
type metrics struct {
	requests *prometheus.CounterVec
	duration prometheus.Histogram

	// live holds the label pairs of the config in force (see setRules).
	live atomic.Pointer[liveRules]
}

func newMetrics(fm enforce.FrontMetrics) *metrics {
	return &metrics{requests: fm.Requests, duration: fm.Duration}
}

// ruleLabel is a (domain, rule) label pair of flashgate_rls_requests_total.
type ruleLabel struct{ domain, rule string }

// liveRules are the label pairs a call under cfg can count: per domain,
// every rule's label, "" (no rule bound) and overrideLabel.
type liveRules struct {
	cfg    *Config
	labels map[ruleLabel]struct{}
}

func liveRulesOf(cfg *Config) *liveRules {
	l := &liveRules{cfg: cfg, labels: make(map[ruleLabel]struct{})}
	for _, d := range cfg.domains {
		l.labels[ruleLabel{d.Name, ""}] = struct{}{}
		l.labels[ruleLabel{d.Name, overrideLabel}] = struct{}{}
		for _, r := range d.rules {
			l.labels[ruleLabel{d.Name, r.Label()}] = struct{}{}
		}
	}
	return l
}

// setRules makes cfg the config in force for the metrics and deletes the
// flashgate_rls_requests_total series of the rules and domains the
// previous one had and cfg has not, so that a reload leaves the series of
// live rules only. Call it before cfg is swapped in, one call at a time.
func (m *metrics) setRules(cfg *Config) {
	cur := liveRulesOf(cfg)
	old := m.live.Swap(cur)
	if old == nil {
		return
	}
	for l := range old.labels {
		if _, ok := cur.labels[l]; !ok {
			for _, d := range enforce.Decisions {
				m.requests.DeleteLabelValues(l.domain, l.rule, d)
			}
		}
	}
}

// count adds a call decided under cfg to flashgate_rls_requests_total. A
// call that started before a reload and counts after it may name a rule
// the reload removed: its series is deleted again here, so none outlives
// the reload that removed its rule.
func (m *metrics) count(cfg *Config, domain, rule, decision string) {
	m.requests.WithLabelValues(domain, rule, decision).Inc()
	if l := m.live.Load(); l != nil && l.cfg != cfg {
		if _, ok := l.labels[ruleLabel{domain, rule}]; !ok {
			m.requests.DeleteLabelValues(domain, rule, decision)
		}
	}
}
