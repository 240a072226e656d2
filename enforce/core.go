package enforce

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/flashgate/flashgate/window"
)

// Options configure a [Core]. Only Limiter is required.
type Options struct {
	// Limiter decides hits: the whole stack the wiring built (packages
	// under window/). On its error the core applies the failure modes.
	Limiter window.Limiter
	// Fallback decides the hits of failure mode local when Limiter fails;
	// nil makes local behave as allow.
	Fallback Fallback
	// FailureMode applies to rules that set none; FailureDefault means
	// FailureLocal.
	FailureMode FailureMode
	// Shadow makes every rule a shadow rule (--shadow).
	Shadow bool
	// Headers are the rate-limit header families every answer carries.
	Headers Families
	// Registerer receives every metric; nil means a private registry.
	Registerer prometheus.Registerer
	// Logger receives structured logs; nil discards them.
	Logger *slog.Logger
	// Now is the clock for durations and log sampling; nil means time.Now.
	Now func() time.Time
	// Overrides, when not nil, gives the operator's overrides in force:
	// Decide applies them to hits and decides dry runs beside them.
	Overrides Overrides
}

// Fallback decides hits in process after the backend failed with cause; it
// must not wait. *fallback.Fallback is one.
type Fallback interface {
	DecideAfter(ctx context.Context, hits []window.Hit, cause error) (window.Decision, error)
}

// Policies give Decide hits[i]'s failure mode, read only when the limiter
// fails.
type Policies interface {
	FailureMode(i int) FailureMode
}

// Core is the enforcement policy and its limiter, fallback and metrics.
// Build it once with [New]; each front-end takes its [Front]. Safe for
// concurrent use.
type Core struct {
	opts    Options
	lastLog atomic.Int64 // UnixNano of the last sampled warning
	dryRuns *prometheus.CounterVec

	// mu guards fronts.
	mu     sync.Mutex
	fronts map[string]*Front // by FrontEnd.Name
}

// New returns a Core with opts, defaulted.
func New(opts Options) (*Core, error) {
	if opts.Limiter == nil {
		return nil, errors.New("enforce: no limiter given")
	}
	if opts.Headers > FamiliesNone {
		return nil, fmt.Errorf("enforce: unknown rate-limit header families %d", uint8(opts.Headers))
	}
	if opts.FailureMode == FailureDefault {
		opts.FailureMode = FailureLocal
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if opts.Registerer == nil {
		opts.Registerer = prometheus.NewRegistry()
	}
	c := &Core{opts: opts}
	if opts.Overrides != nil {
		var err error
		if c.dryRuns, err = newDryRuns(opts.Registerer); err != nil {
			return nil, fmt.Errorf("enforce: register metrics: %w", err)
		}
	}
	return c, nil
}

// Registerer returns the registry every metric is registered on.
func (c *Core) Registerer() prometheus.Registerer { return c.opts.Registerer }

// Logger returns the core's logger.
func (c *Core) Logger() *slog.Logger { return c.opts.Logger }

// Clock returns the core's clock (Options.Now).
func (c *Core) Clock() func() time.Time { return c.opts.Now }

// Front returns the core as front-end fe uses it, registering fe's metrics
// on the first call for fe.Name. It fails for an unnamed front-end, a key
// namespace another front-end holds, or metrics the registry refuses.
func (c *Core) Front(fe FrontEnd) (*Front, error) {
	if fe.Name == "" {
		return nil, errors.New("enforce: a front-end without a name")
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if f := c.fronts[fe.Name]; f != nil {
		return f, nil
	}
	for name, g := range c.fronts {
		if ns := g.fe.KeyNamespace; ns != "" && fe.KeyNamespace != "" && (strings.HasPrefix(ns, fe.KeyNamespace) || strings.HasPrefix(fe.KeyNamespace, ns)) {
			return nil, fmt.Errorf("enforce: %s: key namespace %q is %s's", fe.Name, ns, name)
		}
	}
	m, err := newMetrics(c.opts.Registerer, fe.Metrics)
	if err != nil {
		return nil, fmt.Errorf("enforce: %s: %w", fe.Name, err)
	}
	f := &Front{c: c, m: m, fe: fe}
	if c.fronts == nil {
		c.fronts = make(map[string]*Front)
	}
	c.fronts[fe.Name] = f
	return f, nil
}

// Front is a [Core] as one front-end uses it; safe for concurrent use.
type Front struct {
	c  *Core
	m  *metrics
	fe FrontEnd
}

// Shadow reports whether every rule is in shadow mode (Options.Shadow).
func (f *Front) Shadow() bool { return f.c.opts.Shadow }

// Headers returns the rate-limit header families (Options.Headers).
func (f *Front) Headers() Families { return f.c.opts.Headers }

// Mode resolves m, FailureDefault to the core's default.
func (f *Front) Mode(m FailureMode) FailureMode {
	if m == FailureDefault {
		return f.c.opts.FailureMode
	}
	return m
}

// Metrics returns the metrics the front-end counts itself.
func (f *Front) Metrics() FrontMetrics { return f.m.front }

// HasFallback reports whether failure mode local has a fallback limiter.
func (f *Front) HasFallback() bool { return f.c.opts.Fallback != nil }

// Via says how Decide decided.
type Via uint8

const (
	// ViaLimiter: the limiter decided every hit (Outcome.Decision).
	ViaLimiter Via = iota
	// ViaFallback: the limiter failed; the fallback decided the hits of
	// mode local (indices mapped by Outcome.Hit).
	ViaFallback
	// ViaDeny: the limiter failed and hit Outcome.Denier's mode is deny.
	ViaDeny
	// ViaAllow: the limiter failed and no failure mode refused or decided.
	ViaAllow
	// ViaRefusal: Request.Refusal refused before the limiter was asked.
	ViaRefusal
)

// Outcome is how the core decided one request's hits.
type Outcome struct {
	// Decision is the limiter's or the fallback's; map its indices to
	// the hits with Hit.
	Decision window.Decision
	Via      Via
	// Denier is, for ViaDeny, the first enforcing hit whose mode is deny.
	Denier int
	// ShadowDeny: the limiter failed and a shadow hit's mode is deny.
	ShadowDeny bool
	// decided maps Decision's indices to the hits when the fallback
	// decided only some; nil: the same indices.
	decided []int
}

// Failed reports whether the limiter failed and the failure modes decided.
func (o *Outcome) Failed() bool { return o.Via != ViaLimiter }

// Hit maps an index of Decision to one of the hits given to Decide; -1, or
// an index beyond the hits the fallback decided, is -1.
func (o *Outcome) Hit(k int) int {
	if o.decided == nil || k < 0 {
		return k
	}
	if k >= len(o.decided) {
		return -1
	}
	return o.decided[k]
}

// Decided reports whether Decision counted hit j.
func (o *Outcome) Decided(j int) bool {
	switch o.Via {
	case ViaLimiter:
		return true
	case ViaFallback:
		return o.decided == nil || slices.Contains(o.decided, j)
	}
	return false
}

// decideHits decides hits by one call of the limiter, else by the failure
// modes p gives, and counts what it did. No hits admits without asking.
func (f *Front) decideHits(ctx context.Context, hits []window.Hit, p Policies) Outcome {
	if len(hits) == 0 {
		return Outcome{Decision: window.Decision{Allowed: true, Index: -1, ShadowIndex: -1}}
	}
	c := f.c
	var t0 time.Time
	if f.m.backendDur != nil {
		t0 = c.opts.Now()
	}
	d, err := c.opts.Limiter.Decide(ctx, hits)
	if f.m.backendDur != nil && (err != nil || d.Source == window.SourceBackend) {
		f.m.backendDur.Observe(c.opts.Now().Sub(t0).Seconds())
	}
	if err != nil {
		return f.failure(ctx, hits, p, err)
	}
	switch d.Source {
	case window.SourceLocalFull:
		f.m.localFull.Inc()
	case window.SourceLocalBanned:
		f.m.localBanned.Inc()
	}
	return Outcome{Decision: d}
}

// failure decides hits whose backend call failed with err.
func (f *Front) failure(ctx context.Context, hits []window.Hit, p Policies, err error) Outcome {
	c := f.c
	kind := window.Classify(err)
	f.m.backendErr(kind).Inc()
	if kind != window.KindBreakerOpen && kind != window.KindRestoring { // a call held off is logged where the hold begins, not per call
		c.logSampled("backend failed; deciding by failure mode", "kind", kind.String(), "error", err)
	}
	o := Outcome{Via: ViaAllow, Denier: -1}
	nlocal := 0
	for i := range hits {
		switch f.Mode(p.FailureMode(i)) {
		case FailureDeny:
			if hits[i].Shadow {
				o.ShadowDeny = true
			} else if o.Denier < 0 {
				o.Denier = i
			}
		case FailureLocal:
			nlocal++
		}
	}
	if o.Denier >= 0 {
		f.m.failDeny.Inc()
		o.Via = ViaDeny
		return o
	}
	if nlocal > 0 && c.opts.Fallback != nil {
		local := hits // all local: the usual case
		if nlocal < len(hits) {
			local, o.decided = make([]window.Hit, 0, nlocal), make([]int, 0, nlocal)
			for i := range hits {
				if f.Mode(p.FailureMode(i)) == FailureLocal {
					local = append(local, hits[i])
					o.decided = append(o.decided, i)
				}
			}
		}
		// Decide even if the caller gave up, so the fallback's log stays whole.
		d, ferr := c.opts.Fallback.DecideAfter(context.WithoutCancel(ctx), local, err)
		if ferr == nil {
			f.m.failLocal.Inc()
			o.Via, o.Decision = ViaFallback, d
			return o
		}
		o.decided = nil
		f.m.fallbackErr.Inc()
		c.logSampled("fallback limiter failed; admitting", "error", ferr)
	}
	f.m.failAllow.Inc()
	return o
}

// logSampled logs a warning at most once a second.
func (c *Core) logSampled(msg string, args ...any) {
	now := c.opts.Now().UnixNano()
	last := c.lastLog.Load()
	if now-last < int64(time.Second) || !c.lastLog.CompareAndSwap(last, now) {
		return
	}
	c.opts.Logger.Warn(msg, args...)
}
