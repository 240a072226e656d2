package rls

import (
	"fmt"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/flashgate/flashgate/enforce"
)

// Decision labels of flashgate_rls_requests_total (ext_authz's words).
const (
	decisionAllowed      = "allowed"
	decisionDenied       = "denied"
	decisionShadowDenied = "shadow_denied"
	decisionError        = "error"
)

// metrics are the RLS server's own Prometheus metrics; the core (package
// enforce) counts backend errors, failure-mode decisions and local
// denials, under flashgate_rls_* names. Labels never carry request values:
// domain and rule come from the config files (an unknown domain counts
// under domain=""; request overrides under rule="override").
type metrics struct {
	requests *prometheus.CounterVec
	duration prometheus.Histogram
	reloads  *prometheus.CounterVec

	// live holds the label pairs of the config in force (see setRules).
	live atomic.Pointer[liveRules]
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
			Buckets: enforce.DurationBuckets,
		}),
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "flashgate_rls_config_reloads_total",
			Help: "ratelimit config directory reloads by result: success or error.",
		}, []string{"result"}),
	}
	for _, c := range []prometheus.Collector{m.requests, m.duration, m.reloads} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("rls: register metrics: %w", err)
		}
	}
	for _, r := range []string{"success", "error"} {
		m.reloads.WithLabelValues(r)
	}
	return m, nil
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
			for _, d := range []string{decisionAllowed, decisionDenied, decisionShadowDenied, decisionError} {
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
