package rls

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/flashgate/flashgate/enforce"
)

// frontEnd is the RLS as it registers with the core, with its key
// namespace and no backend latency.
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

// metrics are the RLS server's own metrics, registered by the core. An
// unknown domain counts under domain="", request overrides under
// rule="override".
type metrics struct {
	requests *prometheus.CounterVec
	duration prometheus.Histogram
}

func newMetrics(fm enforce.FrontMetrics) *metrics {
	return &metrics{requests: fm.Requests, duration: fm.Duration}
}

// seriesOf lists the requests counter labels a call under cfg can count.
func seriesOf(cfg *Config) []enforce.RuleLabel {
	out := []enforce.RuleLabel{{}}
	for _, d := range cfg.domains {
		out = append(out, enforce.RuleLabel{Domain: d.Name}, enforce.RuleLabel{Domain: d.Name, Rule: overrideLabel})
		for _, r := range d.rules {
			out = append(out, enforce.RuleLabel{Domain: d.Name, Rule: r.Label()})
		}
	}
	return out
}
