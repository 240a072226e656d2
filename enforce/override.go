package enforce

import (
	"context"
	"fmt"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/flashgate/flashgate/window"
	"github.com/flashgate/flashgate/window/overrides"
)

// Overrides gives the operator's override in force of a rule, by its
// RuleLabel; nil for none. Lookup must not block.
type Overrides interface {
	Lookup(domain, rule string) *overrides.Override
}

// DryRunSuffix ends a dry run's limit key, beside its hit's key.
const DryRunSuffix = "!dry"

const dryRunTotal = "flashgate_override_dry_run_total"

func newDryRuns(reg prometheus.Registerer) (*prometheus.CounterVec, error) {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: dryRunTotal,
		Help: "Requests a dry-run override (flashgate limits set --dry-run) decided beside its rule, by domain, rule and result: would_deny (over the dry run's limit; admitted all the same) or admitted.",
	}, []string{"domain", "rule", "result"})
	if err := reg.Register(c); err != nil {
		return nil, err
	}
	return c, nil
}

// override applies the overrides in force to r's hits in place and
// returns the dry runs to decide beside them.
func (f *Front) override(r *Request) []dryRun {
	var dry []dryRun
	for j := range r.Tags {
		t := &r.Tags[j]
		if t.Counters == nil {
			continue
		}
		lbl := t.Counters.label
		o := f.c.opts.Overrides.Lookup(lbl.Domain, lbl.Rule)
		if o == nil {
			continue
		}
		h := &r.Hits[j]
		if l, ok := o.DryRun(h.Limit); ok {
			dry = append(dry, dryRun{hit: window.Hit{Key: h.Key + DryRunSuffix, Rule: h.Rule, Limit: l, Shadow: true, Cost: h.Cost}, label: lbl})
			continue
		}
		l, shadow, changed := o.Apply(h.Limit, h.Shadow, f.Shadow())
		if !changed && o.Mode == overrides.ModeLimit && o.Refused(h.Limit) {
			f.refused(o, h.Limit)
		}
		h.Limit, h.Shadow = l, shadow
		if changed && t.Policy != nil {
			// Keyed by the file's policy, which a reload replaces.
			t.Policy = o.Memo(t.Policy, func() any {
				p := NewPolicy(lbl.Rule, l)
				p.Ref = -1
				return p
			}).(*Policy)
		}
	}
	return dry
}

type refusedKey struct{ file window.Limit }

// refused reports once per override and file limit an override Apply
// refuses as a raise.
func (f *Front) refused(o *overrides.Override, file window.Limit) {
	s, ok := f.c.opts.Overrides.(interface{ Skipped(overrides.Skip) })
	if !ok {
		return
	}
	o.Memo(refusedKey{file}, func() any {
		s.Skipped(overrides.Skip{What: strconv.QuoteToASCII(o.Target.String()), Reason: overrides.SkipRaise,
			Err: fmt.Errorf("%s over the file's %s: %w", o.Describe(), file, overrides.ErrRaise)})
		return struct{}{}
	})
}

// dryRun is one dry run's hit and the rule it runs beside.
type dryRun struct {
	hit    window.Hit
	label  RuleLabel
	report window.HitReport
}

// ReportHit implements window.HitReporter.
func (d *dryRun) ReportHit(r window.HitReport) { d.report = r }

// decideDryRuns decides the dry runs of an admitted request in one call
// and counts their would-be denials; a failed call counts nothing.
func (f *Front) decideDryRuns(ctx context.Context, dry []dryRun) {
	hits := make([]window.Hit, len(dry))
	for i := range dry {
		hits[i] = dry[i].hit
		hits[i].Tag = &dry[i]
	}
	if _, err := f.c.opts.Limiter.Decide(ctx, hits); err != nil {
		return
	}
	for i := range dry {
		result := "admitted"
		if dry[i].report.Over {
			result = "would_deny"
		}
		f.c.dryRuns.WithLabelValues(dry[i].label.Domain, dry[i].label.Rule, result).Inc()
	}
}
