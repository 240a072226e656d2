package enforce

import (
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/flashgate/flashgate/window"
)

// FrontEnd is how a front-end registers with the core ([Core.Front]).
type FrontEnd struct {
	// Name names the front-end; Core.Front returns one Front per Name.
	Name    string
	Metrics MetricNames
	// KeyNamespace, when not empty, is the limit keys' rule prefix no
	// other front-end may use.
	KeyNamespace string
}

// MetricNames name one front-end's metrics; a zero BackendDuration exports
// no backend latency.
type MetricNames struct {
	// The front-end's own, counted by it (FrontMetrics).
	Requests, Duration, Reloads prometheus.Opts
	// The core's, counted by Decide.
	BackendErrors, FailureModes, LocalDenials, BackendDuration prometheus.Opts
}

var durationBuckets = []float64{.00005, .0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25}

// Decision labels of a front-end's requests counter (FrontMetrics.Requests).
const (
	DecisionAllowed      = "allowed"
	DecisionDenied       = "denied"
	DecisionShadowDenied = "shadow_denied"
	// DecisionError: failure mode allow or deny answered without a decision.
	DecisionError = "error"
)

// Decisions are the four decision labels, indexed by Label.
var Decisions = [numLabels]string{DecisionAllowed, DecisionDenied, DecisionShadowDenied, DecisionError}

// FrontMetrics are the metrics a front-end counts itself.
type FrontMetrics struct {
	// Requests counts requests by domain, binding rule and decision;
	// labels come from the config, never from requests.
	Requests *prometheus.CounterVec
	Duration prometheus.Histogram
	// Reloads counts config reloads by result; the [Reloader] counts it.
	Reloads *prometheus.CounterVec
}

// kindFallback labels backend errors of a failed local fallback.
const kindFallback = "fallback"

// metrics are one front-end's policy metrics, every child resolved once so
// that a decision does no label lookup.
type metrics struct {
	front                          FrontMetrics
	series                         *Series
	backendDur                     prometheus.Histogram // nil: not exported
	errsByKind                     [window.KindOther + 1]prometheus.Counter
	fallbackErr                    prometheus.Counter
	localFull, localBanned         prometheus.Counter
	failLocal, failAllow, failDeny prometheus.Counter
}

func newMetrics(reg prometheus.Registerer, o MetricNames) (*metrics, error) {
	errs := prometheus.NewCounterVec(prometheus.CounterOpts(o.BackendErrors), []string{"kind"})
	modes := prometheus.NewCounterVec(prometheus.CounterOpts(o.FailureModes), []string{"mode"})
	local := prometheus.NewCounterVec(prometheus.CounterOpts(o.LocalDenials), []string{"reason"})
	m := &metrics{front: FrontMetrics{
		Requests: prometheus.NewCounterVec(prometheus.CounterOpts(o.Requests), []string{"domain", "rule", "decision"}),
		Duration: prometheus.NewHistogram(prometheus.HistogramOpts{Name: o.Duration.Name, Help: o.Duration.Help, Buckets: durationBuckets}),
		Reloads:  prometheus.NewCounterVec(prometheus.CounterOpts(o.Reloads), []string{"result"}),
	}}
	m.series = &Series{vec: m.front.Requests}
	cs := []prometheus.Collector{m.front.Requests, m.front.Duration, m.front.Reloads, errs, local, modes}
	if o.BackendDuration.Name != "" {
		m.backendDur = prometheus.NewHistogram(prometheus.HistogramOpts{Name: o.BackendDuration.Name, Help: o.BackendDuration.Help, Buckets: durationBuckets})
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

// RuleLabel is a (domain, rule) pair of a front-end's requests counter.
type RuleLabel struct{ Domain, Rule string }

// Series keeps a front-end's requests counter to the rules in force. Safe
// for concurrent use.
type Series struct {
	vec *prometheus.CounterVec

	// mu guards live.
	mu   sync.Mutex
	live map[RuleLabel]*RuleCounters
}

// Series returns the front-end's requests series.
func (f *Front) Series() *Series { return f.m.series }

// RuleCounters count one rule's requests by Label; safe for concurrent use.
type RuleCounters struct {
	vec     *prometheus.CounterVec
	label   RuleLabel
	eager   *[numLabels]prometheus.Counter
	dropped atomic.Bool
}

// Inc counts one request under l; a count into a dropped rule's series is
// lost.
func (c *RuleCounters) Inc(l Label) {
	if c.eager != nil {
		c.eager[l].Inc()
		return
	}
	if c.dropped.Load() {
		return
	}
	c.vec.WithLabelValues(c.label.Domain, c.label.Rule, Decisions[l]).Inc()
	if c.dropped.Load() { // dropped meanwhile: drop it again
		c.vec.DeleteLabelValues(c.label.Domain, c.label.Rule, Decisions[l])
	}
}

// Install makes labels the rules in force: it deletes the series of the
// rules dropped and calls swap, under the lock, with the labels' counters.
// Eager exports every label's series at 0 from now on.
func (s *Series) Install(labels []RuleLabel, eager bool, swap func(map[RuleLabel]*RuleCounters)) {
	cur := make(map[RuleLabel]*RuleCounters, len(labels))
	for _, l := range labels {
		if _, ok := cur[l]; ok {
			continue
		}
		c := &RuleCounters{vec: s.vec, label: l}
		if eager {
			c.eager = new([numLabels]prometheus.Counter)
			for k := range c.eager {
				c.eager[k] = s.vec.WithLabelValues(l.Domain, l.Rule, Decisions[k])
			}
		}
		cur[l] = c
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for l, c := range s.live {
		if _, ok := cur[l]; !ok {
			c.dropped.Store(true)
			for _, d := range Decisions {
				s.vec.DeleteLabelValues(l.Domain, l.Rule, d)
			}
		}
	}
	s.live = cur
	swap(cur)
}
