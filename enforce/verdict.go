package enforce

import (
	"context"
	"time"

	"github.com/flashgate/flashgate/window"
)

// Label is the decision a request counts under in its front-end's requests
// counter.
type Label uint8

const (
	LabelAllowed Label = iota
	LabelDenied
	LabelShadowDenied
	// LabelError: failure mode allow or deny answered without a decision,
	// or the limiter broke its contract.
	LabelError
	numLabels
)

// String returns the label's value, one of Decisions.
func (l Label) String() string { return Decisions[l] }

// TagRule is what the limiter stack reads of a hit's rule through its Tag.
type TagRule interface {
	PenaltyBox() *window.Ban
	FallbackShare() int
	LeaseFor() time.Duration
}

// HitTag is a hit's Tag for [Front.Decide]: the hit's rule, what the core
// reads (failure mode, policy, counters), and the hit's own report.
type HitTag struct {
	Rule     TagRule
	Mode     FailureMode
	Policy   *Policy
	Counters *RuleCounters
	Report   window.HitReport
}

var _ window.HitReporter = (*HitTag)(nil)

// PenaltyBox returns the hit's rule's penalty box (guard.RuleBan).
func (t *HitTag) PenaltyBox() *window.Ban { return t.Rule.PenaltyBox() }

// FallbackShare returns the hit's rule's local share (fallback.RuleShare).
func (t *HitTag) FallbackShare() int { return t.Rule.FallbackShare() }

// LeaseFor returns the hit's rule's lease length (lease.RuleLease).
func (t *HitTag) LeaseFor() time.Duration { return t.Rule.LeaseFor() }

// ReportHit implements window.HitReporter.
func (t *HitTag) ReportHit(r window.HitReport) { t.Report = r }

// Refusal is a rule that refuses a request without asking the limiter:
// on_missing: deny, or a limit that can never admit the request.
type Refusal struct {
	Policy     *Policy
	Counters   *RuleCounters
	RetryAfter time.Duration
	// Shadow: the refusal is a would-be one.
	Shadow bool
}

// Never is a shadow rule whose limit can never admit the request: the
// answer lists its policy before hit At, over its limit.
type Never struct {
	At     int
	Policy *Policy
}

// Request is one request for [Front.Decide]; Reset empties it for reuse.
type Request struct {
	// Hits are the request's hits; Hits[j].Tag = &Tags[j] once Tags stops
	// growing.
	Hits []window.Hit
	Tags []HitTag
	// Refusal, when not nil, refuses before any hit is asked.
	Refusal *Refusal
	// Never lists the shadow rules that can never admit, in order.
	Never []Never
	// None counts a request no rule bound.
	None *RuleCounters

	answer Answer
}

// Reset empties r, keeping its storage.
func (r *Request) Reset() {
	clear(r.Hits)
	clear(r.Tags)
	clear(r.Never)
	r.Hits, r.Tags, r.Never, r.Refusal, r.None = r.Hits[:0], r.Tags[:0], r.Never[:0], nil, nil
}

// FailureMode implements Policies: Hits[i]'s rule's failure mode.
func (r *Request) FailureMode(i int) FailureMode { return r.Tags[i].Mode }

// Verdict is the core's answer to one request, whatever the front-end: how
// it was decided, what the answer says, and the decision it counted.
type Verdict struct {
	// Outcome is how the hits were decided.
	Outcome
	// Answer lives in the Request; it is valid until the Request is reset.
	Answer *Answer
	Label  Label
}

// Denied reports whether the answer refuses the request.
func (v *Verdict) Denied() bool { return v.Answer.Denied }

// Decide decides r by the policy of the package doc and counts the
// decision under the rule that bound it. A shadow refusal, or a shadow hit
// over its limit or of mode deny, makes a would-be denial.
func (f *Front) Decide(ctx context.Context, r *Request) Verdict {
	a := &r.answer
	a.reset()
	shadowRef := r.Refusal
	if ref := r.Refusal; ref != nil && !ref.Shadow && !f.Shadow() {
		ref.Counters.Inc(LabelDenied)
		a.refuse(ref.Policy, ref.RetryAfter)
		return Verdict{Outcome: Outcome{Via: ViaRefusal, Denier: -1}, Answer: a, Label: LabelDenied}
	}
	var dry []dryRun
	if f.c.opts.Overrides != nil {
		dry = f.override(r)
	}
	v := Verdict{Outcome: f.decideHits(ctx, r.Hits, r), Answer: a}
	o, d := &v.Outcome, &v.Decision
	if dry != nil && o.Via == ViaLimiter && d.Allowed {
		f.decideDryRuns(ctx, dry)
	}
	count := func(c *RuleCounters, l Label) {
		if c == nil {
			c = r.None
		}
		v.Label = l
		c.Inc(l)
	}
	counters := func(k int) *RuleCounters {
		if j := o.Hit(k); j >= 0 && j < len(r.Tags) {
			return r.Tags[j].Counters
		}
		return nil
	}
	switch o.Via {
	case ViaDeny:
		count(r.Tags[o.Denier].Counters, LabelError)
		a.refuse(r.Tags[o.Denier].Policy, time.Second)
		return v
	case ViaAllow:
		count(r.Tags[0].Counters, LabelError)
		a.fill(r, nil)
		a.Shadow = o.ShadowDeny || shadowRef != nil
		return v
	}
	binding := counters(d.Index)
	switch {
	case !d.Allowed && binding == nil:
		count(nil, LabelError) // a limiter broke its contract: admit rather than guess
	case !d.Allowed:
		count(binding, LabelDenied)
		a.fill(r, o)
	case d.Shadowed || o.ShadowDeny || shadowRef != nil:
		var c *RuleCounters
		if d.Shadowed {
			c = counters(d.ShadowIndex)
		}
		if c == nil && shadowRef != nil {
			c = shadowRef.Counters
		}
		count(c, LabelShadowDenied)
		a.fill(r, o)
		a.Shadow = true
	case binding == nil:
		count(nil, LabelAllowed)
	default:
		count(binding, LabelAllowed)
		a.fill(r, o)
	}
	return v
}

func (a *Answer) reset() {
	clear(a.Policies)
	clear(a.States)
	*a = Answer{Policies: a.Policies[:0], States: a.States[:0], Binding: -1}
}

// refuse makes a the answer of a refusal by p without a decision.
func (a *Answer) refuse(p *Policy, retry time.Duration) {
	a.Denied, a.RetryAfter, a.Binding = true, retry, 0
	a.Policies = append(a.Policies, p)
	a.States = append(a.States, State{Policy: p, T: RetrySeconds(retry)})
}

// fill makes a the answer of r after o (nil: a failure mode's admission
// without a decision).
func (a *Answer) fill(r *Request, o *Outcome) {
	bind := -1
	var d *window.Decision
	if o != nil {
		d = &o.Decision
		bind = o.Hit(d.Index)
		a.Denied, a.RetryAfter = !d.Allowed, d.RetryAfter
	}
	n := 0 // the next Never
	never := func(upTo int) {
		for ; n < len(r.Never) && r.Never[n].At <= upTo; n++ {
			p := r.Never[n].Policy
			a.Policies = append(a.Policies, p)
			a.States = append(a.States, State{Policy: p, T: p.Window()})
		}
	}
	for j := range r.Tags {
		never(j)
		t := &r.Tags[j]
		a.Policies = append(a.Policies, t.Policy)
		if o == nil {
			continue
		}
		var st State
		switch {
		case j == bind && !d.Allowed:
			st = t.Policy.Decided(d)
		case t.Report.Known && o.Decided(j):
			st = t.Policy.Reported(t.Report) // a shadow hit over its limit: its would-be state
		case j == bind:
			st = t.Policy.Decided(d)
		default:
			continue
		}
		if j == bind {
			a.Binding = len(a.States)
		}
		a.States = append(a.States, st)
	}
	never(len(r.Never) + len(r.Tags))
}
