package window

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// MinWindow is the shortest window a [Limit] may have.
const MinWindow = time.Millisecond

// MaxRequests is the largest number of requests a [Limit] may allow per
// window. It bounds the size of one key's log (a sorted set in Redis).
const MaxRequests = 1_000_000

// MaxWindow is the longest window a [Limit] may have.
const MaxWindow = 7 * 24 * time.Hour

// MaxBuckets is the most sub-windows a bucketed [Limit] may have.
const MaxBuckets = 1000

// DefaultBuckets is the number of sub-windows [Limit.Auto] gives a limit
// above AutoBucketsAbove: the window admits again at most Window/60 (1.7%)
// later than an exact log would, and its key stays a compact Redis listpack
// (see [Limit]).
const DefaultBuckets = 60

// AutoBucketsAbove is the size above which [Limit.Auto] makes a limit
// bucketed: up to 10,000 requests per window a key keeps an exact log (about
// 110 bytes an entry in Redis, so at most about 1.1 MB per key); above it,
// 60 counters (about 1.5 KB per key, whatever the limit).
const AutoBucketsAbove = 10_000

// Limit allows at most Requests admissions in any span of length Window.
// The zero Limit is invalid; see [Limit.Validate].
//
// Buckets chooses how a key's window is kept. 0 is the exact log: one entry
// per admission (Memory: 8 bytes; Redis: a sorted-set entry, about 110
// bytes), so a decision is exact. B ≥ 1 is a bounded-memory window of B
// sub-window counters, each Width() = ceil(Window/B) long and aligned on the
// Unix epoch: a request at t is admitted iff the counters of every
// sub-window that overlaps (t-Window, t] — the oldest one counted whole,
// though partly expired — plus its cost fit in Requests. It never
// over-admits: no span of length Window ever holds more than Requests
// admissions, as with the exact log. What it costs is early refusal: the
// counted span reaches back between Window and Window+Width(), so a request
// is refused when the exact log would admit it only while the oldest
// counter, already partly out of the window, still holds the admissions
// that make room; it is admitted at the latest Width() after the exact log
// would (its retry-after says exactly when). Under a saturating load it
// admits at least Requests·B/(B+1) per Window. Memory per key is bounded by
// B+1 counters (and, in Redis, the member ids of the last few seconds, see
// redisstore).
type Limit struct {
	Requests int
	Window   time.Duration
	Buckets  int
}

// Auto returns l with Buckets set to DefaultBuckets when l is exact and
// allows more than AutoBucketsAbove requests per window; otherwise l. The
// descriptors file and the RLS config apply it to every rule that does not
// choose its algorithm.
func (l Limit) Auto() Limit {
	if l.Buckets == 0 && l.Requests > AutoBucketsAbove {
		l.Buckets = DefaultBuckets
	}
	return l
}

// Width returns the length of one sub-window of a bucketed limit,
// ceil(Window/Buckets) in whole microseconds; 0 for an exact log.
func (l Limit) Width() time.Duration {
	if l.Buckets <= 0 {
		return 0
	}
	us := l.Window.Microseconds()
	return time.Duration((us+int64(l.Buckets)-1)/int64(l.Buckets)) * time.Microsecond
}

// Validate reports whether l can be enforced: 1 ≤ Requests ≤ MaxRequests and
// MinWindow ≤ Window ≤ MaxWindow, with Window a whole number of microseconds
// (the resolution of the Redis clock), and 0 ≤ Buckets ≤ MaxBuckets (so a
// sub-window is at least a microsecond).
func (l Limit) Validate() error {
	switch {
	case l.Requests < 1:
		return fmt.Errorf("limit of %d requests: must be at least 1", l.Requests)
	case l.Requests > MaxRequests:
		return fmt.Errorf("limit of %d requests: must be at most %d", l.Requests, MaxRequests)
	case l.Window < MinWindow:
		return fmt.Errorf("window %s: must be at least %s", l.Window, MinWindow)
	case l.Window > MaxWindow:
		return fmt.Errorf("window %s: must be at most %s", l.Window, MaxWindow)
	case l.Window%time.Microsecond != 0:
		return fmt.Errorf("window %s: must be a whole number of microseconds", l.Window)
	case l.Buckets < 0 || l.Buckets > MaxBuckets:
		return fmt.Errorf("%d buckets: must be between 0 (an exact log) and %d", l.Buckets, MaxBuckets)
	}
	return nil
}

// String formats l as "5/1s", or "100000/24h0m0s in 60 buckets".
func (l Limit) String() string {
	if l.Buckets > 0 {
		return fmt.Sprintf("%d/%s in %d buckets", l.Requests, l.Window, l.Buckets)
	}
	return fmt.Sprintf("%d/%s", l.Requests, l.Window)
}

// Ban is a penalty-box policy: a key denied more than Threshold times within
// Window is refused locally for Duration. A zero Duration disables the box.
type Ban struct {
	Threshold int
	Window    time.Duration
	Duration  time.Duration
}

// Enabled reports whether b refuses anything.
func (b Ban) Enabled() bool { return b.Duration > 0 && b.Threshold > 0 && b.Window > 0 }

// Or returns b with each zero field taken from def: a rule that asks for a
// penalty box and sets only some of its fields gets the server's others.
func (b Ban) Or(def Ban) Ban {
	if b.Threshold == 0 {
		b.Threshold = def.Threshold
	}
	if b.Window == 0 {
		b.Window = def.Window
	}
	if b.Duration == 0 {
		b.Duration = def.Duration
	}
	return b
}

// DefaultBan is serve's default penalty box for the rules that ask for one:
// 5 denials in 10s → refused 5m.
var DefaultBan = Ban{Threshold: 5, Window: 10 * time.Second, Duration: 5 * time.Minute}

// MaxBanDuration is the longest ban, by a rule's penalty box or by hand: one
// year. A longer one is refused where it is set, so that every ban's end is
// one that every sidecar can hold (a time.Time in Unix nanoseconds ends in
// 2262).
const MaxBanDuration = 365 * 24 * time.Hour

// Hit is one limit applied to one key for one request.
//
// Key must come from [Keys.Key] (or be otherwise bounded and safe): it is used
// verbatim as a Redis key. Rule is the operator-given rule name, used for
// reporting only. A Shadow hit is counted and reported but never denies: when
// it is over its limit the request is still admitted (and not recorded in
// that full window). Cost is how many requests the hit counts as (Envoy's
// hits_addend): the request is admitted only if the window has room for all
// of them, and then records them all; 0 means 1.
//
// Tag is the caller's, opaque to the contract and to every store: a layer
// with a setting of its own per hit declares a small interface and reads it
// from Tag (the front-ends tag a hit with its rule), so that the contract
// names no layer's policy; a Tag that implements [HitReporter] receives the
// hit's own outcome. A nil Tag, or one without a layer's interface, takes
// that layer's default. See the package doc.
type Hit struct {
	Key    string
	Rule   string
	Limit  Limit
	Shadow bool
	Cost   int
	Tag    any
}

// HitReporter is a hit's Tag that asks for the hit's own outcome: the
// Decide call the hit is passed to calls ReportHit once, before it returns,
// if it counted the hit's window (see [HitReport]).
type HitReporter interface {
	ReportHit(HitReport)
}

// HitReport is one hit's own outcome, beside the [Decision] that describes
// only the binding hit: what a caller answering per hit needs (an RLS's
// per-descriptor statuses). A limiter that counted the hit's window reports
// it, Known; one that did not (the Guard refusing another key locally, a
// failed call) reports nothing, so a caller starts from the zero report.
type HitReport struct {
	Known bool
	// Count: entries in the window after the decision (a denied request
	// added none).
	Count int
	// Remaining admissions in the window (0 when Over).
	Remaining int
	// Over: the window had no room for the hit's cost.
	Over bool
	// RetryAfter: when Over, how long until it has.
	RetryAfter time.Duration
	// Reset: when the request was admitted and the hit is not Over, how
	// long until the window's oldest counted admission leaves it, so that it
	// has room for more than Remaining (see [Decision.Reset]); 0 for every
	// hit of a denied request.
	Reset time.Duration
}

// Counted returns the requests h counts as: Cost, or 1 for 0.
func (h *Hit) Counted() int { return max(h.Cost, 1) }

// Source tells what produced a [Decision].
type Source uint8

const (
	// SourceBackend: the limiter's store (Memory or Redis) decided.
	SourceBackend Source = iota
	// SourceLocalFull: the Guard knew the window was full until a later instant.
	SourceLocalFull
	// SourceLocalBanned: the Guard's penalty box refused a repeat offender.
	SourceLocalBanned
)

// String returns "backend", "full" or "banned".
func (s Source) String() string {
	switch s {
	case SourceLocalFull:
		return "full"
	case SourceLocalBanned:
		return "banned"
	default:
		return "backend"
	}
}

// Decision is the outcome for one request. It describes one hit, the binding
// one: for a denial, the first enforcing hit that was over its limit; for an
// admission, the hit with the fewest requests remaining. It is a plain value:
// returning it allocates nothing.
//
// The zero Decision (no hits) is Allowed with Index -1.
type Decision struct {
	// Allowed: the request was admitted and recorded in every window under
	// its limit.
	Allowed bool
	// Index of the binding hit in the hits passed to Decide, -1 for none.
	Index int
	// Limit of the binding hit.
	Limit Limit
	// Count: entries in the binding hit's window after the decision.
	Count int
	// Remaining admissions in the binding hit's window (0 when denied).
	Remaining int
	// RetryAfter: for a denial, how long until the binding window admits
	// again (its oldest needed entry ages out); 0 for an admission.
	RetryAfter time.Duration
	// Reset: for an admission, how long until the binding window's oldest
	// counted admission leaves it, so that it has room for one more than
	// Remaining: the whole window for a key the request started, never more.
	// A bucketed window counts whole sub-windows: until its oldest counted
	// sub-window leaves, for a key the request started between the window
	// and Window+Width(). 0 when the limiter does not know it (a failure
	// mode's answer, or a binding hit that is a shadow hit over its limit);
	// 0 for a denial. It is what the IETF RateLimit field's t and RLS's
	// duration_until_reset report for an admission.
	Reset time.Duration
	// Shadowed: some shadow hit was over its limit (a would-be denial).
	// ShadowIndex is its index, -1 if none.
	Shadowed    bool
	ShadowIndex int
	// Source tells whether the backend or the local Guard decided.
	Source Source
}

// Limiter decides a request's hits together, all or nothing.
//
// Decide returns an error only when the decision could not be made (backend
// unreachable, deadline exceeded, invalid hit); the Decision is then
// meaningless. With no hits the request is admitted. Implementations are safe
// for concurrent use.
type Limiter interface {
	Decide(ctx context.Context, hits []Hit) (Decision, error)
}

// ErrInvalidHit is wrapped by errors for hits with an empty key or invalid limit.
var ErrInvalidHit = errors.New("invalid hit")

// ValidateHits reports the first hit that cannot be enforced (an empty key,
// an invalid limit or cost), wrapping ErrInvalidHit; it allocates only on
// error. Every Limiter checks its hits with it.
func ValidateHits(hits []Hit) error {
	for i := range hits {
		h := &hits[i]
		if h.Key == "" {
			return fmt.Errorf("hit %d: empty key: %w", i, ErrInvalidHit)
		}
		if err := h.Limit.Validate(); err != nil {
			return fmt.Errorf("hit %d (%s): %w: %w", i, h.Rule, ErrInvalidHit, err)
		}
		if h.Cost < 0 || h.Cost > MaxRequests {
			return fmt.Errorf("hit %d (%s): %w: cost %d: must be between 0 and %d", i, h.Rule, ErrInvalidHit, h.Cost, MaxRequests)
		}
	}
	return nil
}

// HitState is what a store learnt of one hit's window in one decision; a
// store fills one per hit and [Resolve] makes the Decision of them.
type HitState struct {
	// Count: entries in the window after the decision.
	Count int
	// Over: the window had no room for the hit's cost before this request.
	Over bool
	// RetryAfter: when Over, how long until it has.
	RetryAfter time.Duration
	// Reset: when not Over and the request is admitted, how long until the
	// window's oldest counted admission leaves it, after the decision (see
	// [Decision.Reset]). A store may leave it unset for a denied request:
	// Resolve reports none then.
	Reset time.Duration
	// Allowance, when Scaled, replaces the hit's Limit.Requests as the
	// entries its window may hold in this decision (a fallback's share).
	Allowance int
	Scaled    bool
}

// limit returns the entries the hit's window may hold in this decision.
func (s *HitState) limit(h *Hit) int {
	if s.Scaled {
		return s.Allowance
	}
	return h.Limit.Requests
}

// Resolve turns the states of hits (st[i] of hits[i]) into their Decision
// and reports each hit's own outcome to its Tag if it is a [HitReporter].
// The request counts as admitted iff no enforcing hit is Over. It allocates
// nothing.
func Resolve(hits []Hit, st []HitState) Decision {
	d := resolve(hits, st)
	for i := range hits {
		if r, ok := hits[i].Tag.(HitReporter); ok {
			rep := HitReport{Known: true, Count: st[i].Count, Over: st[i].Over, RetryAfter: st[i].RetryAfter}
			if !st[i].Over {
				rep.Remaining = max(st[i].limit(&hits[i])-st[i].Count, 0)
				if d.Allowed {
					rep.Reset = st[i].Reset
				}
			}
			r.ReportHit(rep)
		}
	}
	return d
}

// resolve is Resolve's Decision.
func resolve(hits []Hit, st []HitState) Decision {
	d := Decision{Allowed: true, Index: -1, ShadowIndex: -1}
	for i := range hits {
		if !st[i].Over {
			continue
		}
		if hits[i].Shadow {
			if !d.Shadowed {
				d.Shadowed, d.ShadowIndex = true, i
			}
			continue
		}
		if d.Allowed {
			d.Allowed = false
			d.Index = i
		}
	}
	if !d.Allowed {
		i := d.Index
		d.Limit, d.Count, d.Remaining, d.RetryAfter = hits[i].Limit, st[i].Count, 0, st[i].RetryAfter
		return d
	}
	for i := range hits {
		rem := max(st[i].limit(&hits[i])-st[i].Count, 0)
		if d.Index < 0 || rem < d.Remaining {
			d.Index, d.Limit, d.Count, d.Remaining = i, hits[i].Limit, st[i].Count, rem
		}
	}
	if i := d.Index; i >= 0 && !st[i].Over {
		d.Reset = st[i].Reset
	}
	return d
}
