package enforce

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/flashgate/flashgate/window"
)

// FrontEnd names a front-end in the core's metrics. Each front-end counts
// into a set of its own, under the names it has always exported (a user
// contract, in docs/operations.md): ext_authz's unprefixed, the ratelimit
// service's flashgate_rls_*.
type FrontEnd uint8

const (
	// ExtAuthz: flashgate_backend_errors_total{kind},
	// flashgate_failure_mode_decisions_total{mode},
	// flashgate_local_denials_total{reason},
	// flashgate_redis_duration_seconds.
	ExtAuthz FrontEnd = iota
	// RLS: flashgate_rls_backend_errors_total{kind},
	// flashgate_rls_failure_mode_decisions_total{mode},
	// flashgate_rls_local_denials_total{reason}; no backend latency.
	RLS
	numFrontEnds
)

// String returns "ext_authz" or "rls".
func (f FrontEnd) String() string {
	switch f {
	case ExtAuthz:
		return "ext_authz"
	case RLS:
		return "rls"
	}
	return fmt.Sprintf("FrontEnd(%d)", uint8(f))
}

// metricOpts name one front-end's metrics; a zero backendDur exports no
// backend latency.
type metricOpts struct {
	// The front-end's own, counted by it (FrontMetrics).
	requests, duration, reloads prometheus.Opts
	// The core's, counted by Decide.
	backendErrs, failureModes, localDenials, backendDur prometheus.Opts
}

var frontMetrics = [numFrontEnds]metricOpts{
	ExtAuthz: {
		requests: prometheus.Opts{
			Name: "flashgate_checks_total",
			Help: "ext_authz checks by domain, binding rule (empty when no rule matched) and decision.",
		},
		duration: prometheus.Opts{
			Name: "flashgate_check_duration_seconds",
			Help: "Time to answer one ext_authz check, mapping and response included.",
		},
		reloads: prometheus.Opts{
			Name: "flashgate_config_reloads_total",
			Help: "Descriptors file reloads by result: success or error.",
		},
		backendErrs: prometheus.Opts{
			Name: "flashgate_backend_errors_total",
			Help: "Checks the backend could not decide, by kind: timeout, canceled, connection, breaker_open, invalid_hit, fallback, other.",
		},
		failureModes: prometheus.Opts{
			Name: "flashgate_failure_mode_decisions_total",
			Help: "Checks decided by a failure mode because the backend failed, by mode: local, allow or deny.",
		},
		localDenials: prometheus.Opts{
			Name: "flashgate_local_denials_total",
			Help: "Denials decided by the local guard without a backend round trip, by reason: full or banned.",
		},
		backendDur: prometheus.Opts{
			Name: "flashgate_redis_duration_seconds",
			Help: "Time spent in the rate-limit backend (Redis, or Memory when embedded) per check that reached it, errors included.",
		},
	},
	RLS: {
		requests: prometheus.Opts{
			Name: "flashgate_rls_requests_total",
			Help: "ShouldRateLimit calls by domain, binding rule (rate_limit.name, else its descriptor path; empty when none matched) and decision.",
		},
		duration: prometheus.Opts{
			Name: "flashgate_rls_request_duration_seconds",
			Help: "Time to answer one ShouldRateLimit call.",
		},
		reloads: prometheus.Opts{
			Name: "flashgate_rls_config_reloads_total",
			Help: "ratelimit config directory reloads by result: success or error.",
		},
		backendErrs: prometheus.Opts{
			Name: "flashgate_rls_backend_errors_total",
			Help: "ShouldRateLimit calls the backend could not decide, by kind (window.ErrKind, or fallback).",
		},
		failureModes: prometheus.Opts{
			Name: "flashgate_rls_failure_mode_decisions_total",
			Help: "ShouldRateLimit calls decided by the failure mode because the backend failed, by mode: local, allow or deny.",
		},
		localDenials: prometheus.Opts{
			Name: "flashgate_rls_local_denials_total",
			Help: "ShouldRateLimit denials decided by the local guard without a backend round trip, by reason: full or banned.",
		},
	},
}

// durationBuckets are the buckets of the latency histograms, in seconds.
var durationBuckets = []float64{.00005, .0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25}

// Decision labels of a front-end's requests counter (FrontMetrics.Requests).
const (
	DecisionAllowed      = "allowed"
	DecisionDenied       = "denied"
	DecisionShadowDenied = "shadow_denied"
	// DecisionError: the backend failed and failure mode allow or deny
	// answered without a decision.
	DecisionError = "error"
)

// Decisions are the four decision labels.
var Decisions = [...]string{DecisionAllowed, DecisionDenied, DecisionShadowDenied, DecisionError}

// FrontMetrics are the metrics a front-end counts itself, registered by
// the core with its own under the front-end's names (see [FrontEnd]):
// ext_authz's flashgate_checks_total, flashgate_check_duration_seconds and
// flashgate_config_reloads_total; the RLS's flashgate_rls_requests_total,
// flashgate_rls_request_duration_seconds and
// flashgate_rls_config_reloads_total.
type FrontMetrics struct {
	// Requests counts requests by domain, binding rule and decision (one
	// of Decisions); labels come from the config, never from requests.
	Requests *prometheus.CounterVec
	// Duration observes the time to answer one request, in seconds.
	Duration prometheus.Histogram
	// Reloads counts config reloads by result, success or error (both
	// exported from the start); the front-end's [Reloader] counts it.
	Reloads *prometheus.CounterVec
}

// kindFallback labels the backend errors counter for a failed local
// fallback; the other kinds are window.ErrKind's.
const kindFallback = "fallback"

// metrics are one front-end's policy metrics, every child resolved once so
// that a decision does no label lookup: local denials are the common
// answer under attack, failure-mode decisions and backend errors every
// answer during an outage. Labels never carry request values.
type metrics struct {
	front                          FrontMetrics
	backendDur                     prometheus.Histogram // nil: not exported
	errsByKind                     [window.KindOther + 1]prometheus.Counter
	fallbackErr                    prometheus.Counter
	localFull, localBanned         prometheus.Counter
	failLocal, failAllow, failDeny prometheus.Counter
}

func newMetrics(reg prometheus.Registerer, o metricOpts) (*metrics, error) {
	errs := prometheus.NewCounterVec(prometheus.CounterOpts(o.backendErrs), []string{"kind"})
	modes := prometheus.NewCounterVec(prometheus.CounterOpts(o.failureModes), []string{"mode"})
	local := prometheus.NewCounterVec(prometheus.CounterOpts(o.localDenials), []string{"reason"})
	m := &metrics{front: FrontMetrics{
		Requests: prometheus.NewCounterVec(prometheus.CounterOpts(o.requests), []string{"domain", "rule", "decision"}),
		Duration: prometheus.NewHistogram(prometheus.HistogramOpts{Name: o.duration.Name, Help: o.duration.Help, Buckets: durationBuckets}),
		Reloads:  prometheus.NewCounterVec(prometheus.CounterOpts(o.reloads), []string{"result"}),
	}}
	cs := []prometheus.Collector{m.front.Requests, m.front.Duration, m.front.Reloads, errs, local, modes}
	if o.backendDur.Name != "" {
		m.backendDur = prometheus.NewHistogram(prometheus.HistogramOpts{Name: o.backendDur.Name, Help: o.backendDur.Help, Buckets: durationBuckets})
		cs = append(cs, m.backendDur)
	}
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register metrics: %w", err)
		}
	}
	for k := window.KindTimeout; k <= window.KindOther; k++ {
		m.errsByKind[k] = errs.WithLabelValues(k.String())
	}
	m.fallbackErr = errs.WithLabelValues(kindFallback)
	m.localFull, m.localBanned = local.WithLabelValues("full"), local.WithLabelValues("banned")
	m.failLocal, m.failAllow, m.failDeny = modes.WithLabelValues("local"), modes.WithLabelValues("allow"), modes.WithLabelValues("deny")
	for _, r := range []string{"success", "error"} {
		m.front.Reloads.WithLabelValues(r)
	}
	return m, nil
}

// backendErr is the backend errors child of kind.
func (m *metrics) backendErr(kind window.ErrKind) prometheus.Counter {
	if kind > window.KindNone && kind <= window.KindOther {
		return m.errsByKind[kind]
	}
	return m.errsByKind[window.KindOther]
}
