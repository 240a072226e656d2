package extauthz

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/flashgate/flashgate/descriptors"
	"github.com/flashgate/flashgate/enforce"
)

// frontEnd is ext_authz as it registers with the core; its keys take the
// descriptors file's rule names, no namespace of its own.
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

// metrics are ext_authz's own metrics, registered by the core.
type metrics struct {
	checks   *prometheus.CounterVec
	checkDur prometheus.Histogram
}

func newMetrics(fm enforce.FrontMetrics) *metrics {
	return &metrics{checks: fm.Requests, checkDur: fm.Duration}
}

// seriesOf lists cfg's requests counter labels: every rule's and "".
func seriesOf(cfg *descriptors.Config) []enforce.RuleLabel {
	out := make([]enforce.RuleLabel, 0, len(cfg.Rules)+1)
	out = append(out, enforce.RuleLabel{Domain: cfg.Domain})
	for _, r := range cfg.Rules {
		out = append(out, enforce.RuleLabel{Domain: cfg.Domain, Rule: r.Name})
	}
	return out
}
