package extauthz

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/flashgate/flashgate/window"
)

// Decision labels of flashgate_checks_total.
const (
	decisionAllowed      = "allowed"
	decisionDenied       = "denied"
	decisionShadowDenied = "shadow_denied"
	decisionError        = "error"
)

// kindFallback labels flashgate_backend_errors_total for a failed local
// fallback; the other kinds are window.ErrKind's.
const kindFallback = "fallback"

// metrics are the Prometheus metrics listed in the README. Labels never carry
// request values: rule and domain come from the descriptors file.
type metrics struct {
	checks       *prometheus.CounterVec
	checkDur     prometheus.Histogram
	backendDur   prometheus.Histogram
	backendErrs  *prometheus.CounterVec
	localDenials *prometheus.CounterVec
	reloads      *prometheus.CounterVec
	failureModes *prometheus.CounterVec

	// Children resolved once, so that a check does no label lookup: local
	// denials are the common answer under attack, failure-mode decisions
	// and backend errors every answer during an outage.
	localFull, localBanned         prometheus.Counter
	failLocal, failAllow, failDeny prometheus.Counter
	errsByKind                     [window.KindOther + 1]prometheus.Counter
	fallbackErr                    prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	buckets := []float64{.00005, .0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25}
	m := &metrics{
		checks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "flashgate_checks_total",
			Help: "ext_authz checks by domain, binding rule (empty when no rule matched) and decision.",
		}, []string{"domain", "rule", "decision"}),
		checkDur: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "flashgate_check_duration_seconds",
			Help:    "Time to answer one ext_authz check, mapping and response included.",
			Buckets: buckets,
		}),
		backendDur: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "flashgate_redis_duration_seconds",
			Help:    "Time spent in the rate-limit backend (Redis, or Memory when embedded) per check that reached it, errors included.",
			Buckets: buckets,
		}),
		backendErrs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "flashgate_backend_errors_total",
			Help: "Checks the backend could not decide, by kind: timeout, canceled, connection, breaker_open, invalid_hit, fallback, other.",
		}, []string{"kind"}),
		localDenials: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "flashgate_local_denials_total",
			Help: "Denials decided by the local guard without a backend round trip, by reason: full or banned.",
		}, []string{"reason"}),
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "flashgate_config_reloads_total",
			Help: "Descriptors file reloads by result: success or error.",
		}, []string{"result"}),
		failureModes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "flashgate_failure_mode_decisions_total",
			Help: "Checks decided by a failure mode because the backend failed, by mode: local, allow or deny.",
		}, []string{"mode"}),
	}
	for _, c := range []prometheus.Collector{m.checks, m.checkDur, m.backendDur, m.backendErrs, m.localDenials, m.reloads, m.failureModes} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register metrics: %w", err)
		}
	}
	for k := window.KindTimeout; k <= window.KindOther; k++ {
		m.errsByKind[k] = m.backendErrs.WithLabelValues(k.String())
	}
	m.fallbackErr = m.backendErrs.WithLabelValues(kindFallback)
	m.localFull, m.localBanned = m.localDenials.WithLabelValues("full"), m.localDenials.WithLabelValues("banned")
	for _, r := range []string{"success", "error"} {
		m.reloads.WithLabelValues(r)
	}
	m.failLocal, m.failAllow, m.failDeny = m.failureModes.WithLabelValues("local"), m.failureModes.WithLabelValues("allow"), m.failureModes.WithLabelValues("deny")
	return m, nil
}

// backendErr is the flashgate_backend_errors_total child of kind.
func (m *metrics) backendErr(kind window.ErrKind) prometheus.Counter {
	if kind > window.KindNone && kind <= window.KindOther {
		return m.errsByKind[kind]
	}
	return m.errsByKind[window.KindOther]
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
