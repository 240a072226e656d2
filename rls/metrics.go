package rls

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// Decision labels of flashgate_rls_requests_total (ext_authz's words).
const (
	decisionAllowed      = "allowed"
	decisionDenied       = "denied"
	decisionShadowDenied = "shadow_denied"
	decisionError        = "error"
)

// metrics are the RLS server's Prometheus metrics. Labels never carry
// request values: domain and rule come from the config files (an unknown
// domain counts under domain=""; request overrides under rule="override").
type metrics struct {
	requests     *prometheus.CounterVec
	duration     prometheus.Histogram
	backendErrs  *prometheus.CounterVec
	failureModes *prometheus.CounterVec
	localDenials *prometheus.CounterVec
	reloads      *prometheus.CounterVec

	localFull, localBanned prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "flashgate_rls_requests_total",
			Help: "ShouldRateLimit calls by domain, binding rule (rate_limit.name, else its descriptor path; empty when none matched) and decision.",
		}, []string{"domain", "rule", "decision"}),
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "flashgate_rls_request_duration_seconds",
			Help:    "Time to answer one ShouldRateLimit call.",
			Buckets: []float64{.00005, .0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25},
		}),
		backendErrs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "flashgate_rls_backend_errors_total",
			Help: "ShouldRateLimit calls the backend could not decide, by kind (window.ErrKind, or fallback).",
		}, []string{"kind"}),
		failureModes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "flashgate_rls_failure_mode_decisions_total",
			Help: "ShouldRateLimit calls decided by the failure mode because the backend failed, by mode: local, allow or deny.",
		}, []string{"mode"}),
		localDenials: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "flashgate_rls_local_denials_total",
			Help: "ShouldRateLimit denials decided by the local guard without a backend round trip, by reason: full or banned.",
		}, []string{"reason"}),
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "flashgate_rls_config_reloads_total",
			Help: "ratelimit config directory reloads by result: success or error.",
		}, []string{"result"}),
	}
	for _, c := range []prometheus.Collector{m.requests, m.duration, m.backendErrs, m.failureModes, m.localDenials, m.reloads} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("rls: register metrics: %w", err)
		}
	}
	m.localFull, m.localBanned = m.localDenials.WithLabelValues("full"), m.localDenials.WithLabelValues("banned")
	for _, r := range []string{"success", "error"} {
		m.reloads.WithLabelValues(r)
	}
	return m, nil
}
