package fallback

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"sync/atomic"
	"time"

	"github.com/flashgate/flashgate/window"
	"github.com/flashgate/flashgate/window/memory"
)

// Options configures a [Fallback]. The zero value is usable: a fleet of
// one.
type Options struct {
	// Size returns the live fleet size N (a [Fleet]'s count, or a fixed
	// --fleet-size); nil, or an answer below 1, means 1.
	Size func() int
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// MaxKeys bounds the local logs, as memory.Options.MaxKeys does, and
	// sizes the seed table (as many entries, in buckets of four, 16 bytes an
	// entry), and the keys whose local admissions wait to be written back;
	// 0 means DefaultMaxKeys.
	MaxKeys int
	// WriteBack, if not nil, is where the local admissions are written back
	// when the shared backend answers again (the store that Watch's limiter
	// calls); nil: they are not.
	WriteBack Restorer
	// RestoreTimeout bounds one write-back call; 0 means
	// DefaultRestoreTimeout.
	RestoreTimeout time.Duration
	// Settle is how long, after an outage, calls keep their failure mode
	// once Redis answers again, while the fleet writes back; 0 means
	// DefaultRestoreSettle, negative none.
	Settle time.Duration
	// OnReturn, if not nil, is called when a write-back round finds the
	// store answering after an outage, or restarted unseen: as the settle
	// begins. A circuit breaker below Watch is closed there, so that the
	// settle does not end on calls the breaker refuses (each a local
	// admission beside the fleet's first decisions in the store).
	OnReturn func()
	// SharedSettle, if not nil, is where the fleet agrees when a settle
	// ends: each sidecar that finds the store back proposes its end, and
	// every sidecar settling takes the latest proposed, so that the fleet
	// turns back to the store at one moment rather than one by one. nil:
	// each settles on its own clock.
	SharedSettle SettleStore
}

// SettleStore agrees the end of the fleet's settle after an outage, on
// the store's clock, so that sidecars' clocks need not agree. SettleEnd
// proposes an end d from the store's now (0 only reads) and returns how
// far from now the latest end proposed lies, 0 if none or past.
type SettleStore interface {
	SettleEnd(ctx context.Context, d time.Duration) (time.Duration, error)
}

// Restorer writes local admissions back into the shared windows, each at
// most once however often it is retried (the Redis store does). RunID
// tells whether the store answers and names the instance that does ("" if
// unknown): after an outage and while the fleet settles, it is how the
// Fallback finds the store back, and tells a store that restarted
// meanwhile. Both return an error wrapping [window.ErrClosed] once the
// store is closed.
type Restorer interface {
	Restore(ctx context.Context, batch []window.Admitted) error
	RunID(ctx context.Context) (string, error)
}

// DefaultMaxKeys is the default bound on the local logs a
// [Fallback] keeps in an outage (past it, new keys evict the ones that go
// idle soonest; see [memory.Memory]) and the default size of its seed table: 4 MiB.
const DefaultMaxKeys = 1 << 18

// Fallback is the in-process limiter of failure mode "local": what one
// sidecar enforces on its own while the shared store cannot decide, at a
// fleet-aware share seeded by what the store last said (see the package
// doc for the bound). It is safe for concurrent use.
type Fallback struct {
	mem     *memory.Memory // the local logs
	seeds   *seedTable     // what Redis last reported, by key hash
	size    func() int
	now     func() time.Time
	pending [pendingSlots]atomic.Int32 // calls in flight by key hash (Watch)
	seed    maphash.Seed               // of that hash: random, so no request can aim at a key's slot
	wb      *writeBack                 // nil without Options.WriteBack
	admit   memory.Admitted            // wb.record, or nil
}

// maxStackHits is how many hits Watch's limiter hashes without allocating.
const maxStackHits = 8

// pendingSlots is the size of the in-flight table: 16 KiB.
const pendingSlots = 4096

// pendingOf returns the calls in flight for the key of hash h (or a
// colliding key).
func (f *Fallback) pendingOf(h uint64) int {
	return int(f.pending[h%pendingSlots].Load())
}

// hash is key's hash for the in-flight table (its slot: hash %
// pendingSlots) and the seed table.
func (f *Fallback) hash(key string) uint64 { return maphash.String(f.seed, key) }

var _ window.Limiter = (*Fallback)(nil)

// New returns an empty Fallback.
func New(o Options) (*Fallback, error) {
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Size == nil {
		o.Size = func() int { return 1 }
	}
	if o.MaxKeys == 0 {
		o.MaxKeys = DefaultMaxKeys
	}
	if o.RestoreTimeout < 0 {
		return nil, fmt.Errorf("fallback: restore timeout %s is negative", o.RestoreTimeout)
	}
	if o.RestoreTimeout == 0 {
		o.RestoreTimeout = DefaultRestoreTimeout
	}
	if o.Settle == 0 {
		o.Settle = DefaultRestoreSettle
	}
	mem, err := memory.New(memory.Options{Now: o.Now, MaxKeys: o.MaxKeys})
	if err != nil {
		return nil, fmt.Errorf("fallback: %w", err)
	}
	f := &Fallback{mem: mem, seeds: newSeedTable(o.MaxKeys), size: o.Size, now: o.Now, seed: maphash.MakeSeed()}
	if o.WriteBack != nil {
		if f.wb, err = newWriteBack(o.WriteBack, o.Now, o.RestoreTimeout, o.Settle, o.MaxKeys); err != nil {
			return nil, fmt.Errorf("fallback: %w", err)
		}
		f.wb.onReturn, f.wb.settles = o.OnReturn, o.SharedSettle
		f.admit = f.wb.record
	}
	return f, nil
}

// Close stops the write-back: no round starts after it, a scheduled retry
// is dropped, and a round in flight is canceled and waited for. Decide and
// DecideAfter still answer locally. Calling it again does nothing.
func (f *Fallback) Close() {
	if f.wb != nil {
		f.wb.close()
	}
}

// WriteBack returns the write-back's counts; zero without
// Options.WriteBack.
func (f *Fallback) WriteBack() WriteBackStats {
	if f.wb == nil {
		return WriteBackStats{}
	}
	return f.wb.stats()
}

// Len returns the keys held (see [memory.Memory.Len]).
func (f *Fallback) Len() int { return f.mem.Len() }

// Evictions returns the live keys evicted at MaxKeys (see
// [memory.Memory.Evictions]).
func (f *Fallback) Evictions() uint64 { return f.mem.Evictions() }

// Decide implements [window.Limiter]: hits decided together, all or nothing, each
// at its local allowance (see the package doc). The Decision's Limit is the
// hit's own; Remaining counts against the allowance, and Reset is the local
// log's (until its oldest local admission leaves). It is DecideAfter with
// no cause.
func (f *Fallback) Decide(ctx context.Context, hits []window.Hit) (window.Decision, error) {
	return f.DecideAfter(ctx, hits, nil)
}

// DecideAfter decides hits locally after the shared backend failed with
// cause. When cause is a timeout (Classify: KindTimeout) Redis may have
// admitted the request anyway, so it is recorded in every local window
// under its hit's limit even if denied here; after any other failure Redis
// did not decide it, and only a local admission is recorded. Only
// admissions are written back (see the package doc).
func (f *Fallback) DecideAfter(ctx context.Context, hits []window.Hit, cause error) (window.Decision, error) {
	n := max(f.size(), 1)
	timedOut := window.Classify(cause) == window.KindTimeout
	// In the settle's last moments nothing is admitted locally: what the
	// fleet admitted is in the store when it turns back to it.
	closing := f.wb != nil && errors.Is(cause, ErrRestoring) && f.wb.closing()
	d, err := f.mem.DecideWith(ctx, hits, memory.DecideOptions{
		Allowance: func(h *window.Hit, now int64) (int, int64) {
			if closing {
				return 0, 0
			}
			// The key's seed, as of now: the allowance grows when it expires.
			hk := f.hash(h.Key)
			seen, until, _ := f.seeds.load(hk, h.Limit.Requests, now)
			return max(allowance(h, seen, until, now, n)-f.pendingOf(hk), 0), until
		},
		RecordDenied: timedOut,
		Admitted:     f.admit,
	})
	if f.wb == nil || err != nil {
		return d, err
	}
	switch k := window.Classify(cause); {
	case k == window.KindConnection:
		// Failure mode local in an outage, admitting or not: every call
		// is held off until Redis answers a round, then for the settle,
		// and an admission holds its key's calls off until written back.
		f.wb.markDown()
		f.wb.poke()
	case !d.Allowed, k == window.KindTimeout:
		// Redis slow, not down: an admission is written back, holding
		// nothing off.
		if d.Allowed {
			f.wb.poke()
		}
	default:
		// Admitted while held off (ErrRestoring), with the breaker open,
		// one Cluster master down (its keys' calls, not the store's) or
		// after another error: the key's calls wait for its write-back.
		f.wb.markHeld()
		f.wb.poke()
	}
	return d, err
}

// allowance is a hit's local allowance in a fleet of n (see the package doc).
// seen is the count Redis last reported for its key, live until until.
func allowance(h *window.Hit, seen int, until, now int64, n int) int {
	share := shareOf(h, n)
	if now < until {
		return min(share, ceilDiv(max(h.Limit.Requests-seen, 0), n))
	}
	return share
}

// RuleShare is what the Fallback reads of a hit's Tag: how many admissions
// per window this process may make on its own for the hit's rule while the
// shared store cannot decide, or 0 for ceil(Limit.Requests / fleet size). A
// front-end's rule implements it.
type RuleShare interface {
	FallbackShare() int
}

// shareOf is h's share in a fleet of n: its rule's (RuleShare), or
// ceil(limit / n).
func shareOf(h *window.Hit, n int) int {
	if r, ok := h.Tag.(RuleShare); ok {
		if s := r.FallbackShare(); s > 0 {
			return s
		}
	}
	return ceilDiv(h.Limit.Requests, n)
}

func ceilDiv(a, b int) int { return (a + b - 1) / b }

// teaches reports whether d is a backend's decision with a binding hit of
// hits, the decisions Watch learns from.
func teaches(hits []window.Hit, d window.Decision) bool {
	return d.Source == window.SourceBackend && d.Index >= 0 && d.Index < len(hits)
}

// observe seeds h, the binding hit of the store's decision d, whose key
// hashes to hk: its count, live until one window from now.
func (f *Fallback) observe(h *window.Hit, d window.Decision, hk uint64) {
	now := f.now().UnixNano()
	n := max(f.size(), 1)
	share := shareOf(h, n)
	// A count that leaves the allowance at the share teaches nothing new:
	// it is recorded only over a seed the key already has. In a fleet of
	// N ≥ 2 that skips the keys Redis reports with fewer than about N
	// entries (a uniform load's); alone, every count counts.
	informative := ceilDiv(max(h.Limit.Requests-d.Count, 0), n) < share
	f.seeds.store(hk, d.Count, h.Limit.Requests, now+int64(h.Limit.Window), now, informative)
}

// Restarted tells f that the store restarted or failed over, unseen by
// any failed call (a new connection found Redis's run id changed): it may
// have come back empty. An outage begins as after a connection error:
// every call through Watch is held off until a write-back round answers,
// then for the settle, and a call in flight meanwhile has its answer
// refused. Without Options.WriteBack it does nothing. It implements
// redisstore.RestartListener; safe for concurrent use.
func (f *Fallback) Restarted() {
	if f.wb == nil {
		return
	}
	f.wb.markDown()
	f.wb.poke()
}

// Outstanding is a part of the stack that admits from entries the store
// counted before an outage began, which a store that came back empty has
// forgotten: window/lease's holder and its leases' slots. Outstanding
// returns those entries still inside their windows, each under its own
// member id, aged from the call (a negative age: scored after now).
type Outstanding interface {
	Outstanding() []window.Admitted
}

// WriteBackAlso makes the write-back write o's entries back after each
// outage, and again when a settle finds the store restarted: in the round
// that finds the store back, before the settle ends, idempotently. Call
// it once, before the stack decides; without Options.WriteBack it does
// nothing.
func (f *Fallback) WriteBackAlso(o Outstanding) {
	if f.wb != nil && o != nil {
		f.wb.also.Store(&o)
	}
}

// Gate returns [ErrRestoring] when a call for hits must not reach the
// store now (an outage, its settle, their keys' admissions not yet written
// back), as Watch's limiter would: for a caller that reaches the store
// another way (a lease's reservation). Nil without Options.WriteBack.
func (f *Fallback) Gate(hits []window.Hit) error {
	if f.wb == nil || !f.wb.gated() {
		return nil
	}
	return f.wb.gate(hits)
}

// Watch returns next with every successful decision observed by f: the
// layer of the stack that seeds the fallback (Guard(f.Watch(Breaker(…)))).
// With Options.WriteBack it also holds calls off next (returning
// [ErrRestoring]) while any of their keys has local admissions not yet
// written back, and for Settle after an outage (see the package doc); an
// answer to a call during which an outage began is refused too
// (ErrRestoring), as it may come from a store that came back empty.
func (f *Fallback) Watch(next window.Limiter) window.Limiter { return watched{f: f, next: next} }

type watched struct {
	f    *Fallback
	next window.Limiter
}

func (w watched) Decide(ctx context.Context, hits []window.Hit) (window.Decision, error) {
	wb := w.f.wb
	if wb != nil && wb.gated() {
		if err := wb.gate(hits); err != nil {
			return window.Decision{}, err
		}
	}
	var outages uint64
	if wb != nil {
		outages = wb.outages.Load()
	}
	// Each key hashed once: its in-flight slot, then its seed.
	var stack [maxStackHits]uint64
	hashes := stack[:0]
	for i := range hits {
		hk := w.f.hash(hits[i].Key)
		w.f.pending[hk%pendingSlots].Add(1)
		hashes = append(hashes, hk)
	}
	d, err := w.next.Decide(ctx, hits)
	for _, hk := range hashes {
		w.f.pending[hk%pendingSlots].Add(-1)
	}
	if wb != nil && err == nil && wb.outages.Load() != outages {
		// An outage began while the call was in flight: a restarted store
		// may have answered it (another connection found the restart
		// after this call passed the gate). Its answer is not taken; if
		// the store admitted it, that entry only makes the window stricter.
		return window.Decision{}, ErrRestoring
	}
	if err == nil && teaches(hits, d) {
		w.f.observe(&hits[d.Index], d, hashes[d.Index])
	}
	if wb != nil {
		if err == nil {
			wb.answeredCall()
		} else {
			wb.failedCall(err)
		}
	}
	return d, err
}
