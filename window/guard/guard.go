package guard

import (
	"context"
	"fmt"
	"math"
	"sync/atomic"
	"time"

	"github.com/dgraph-io/ristretto/v2"

	"github.com/flashgate/flashgate/window"
	"github.com/flashgate/flashgate/window/bans"
)

// DefaultGuardBudget is the default memory budget of a [Guard], in bytes.
const DefaultGuardBudget = 32 << 20

// MinGuardBudget is the smallest memory budget [New] accepts, in bytes.
const MinGuardBudget = 64 << 10

// guardEntryCost approximates the bytes one cached key costs besides the key
// itself: the entry, ristretto's item and its policy counters.
const guardEntryCost = 160

// GuardOptions configures a [Guard]. The zero value is usable.
type GuardOptions struct {
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// Budget is the memory budget in bytes for the over-limit cache and the
	// penalty box together; 0 means DefaultGuardBudget, else at least
	// MinGuardBudget.
	Budget int64
	// Ban is the penalty box of the rules that ask for one (see [RuleBan]):
	// the fields a rule leaves zero are taken from it. A hit whose rule
	// does not ask is never banned. serve sets it from its --ban-* flags
	// (window.DefaultBan).
	Ban window.Ban
	// Reporter, if not nil, is told of every denial that counts toward a
	// ban (see [BanReporter]).
	Reporter BanReporter
}

// BanReporter hears of the denials that count toward a penalty box: every
// denial of an enforcing hit whose ban is enabled, remote or local (a
// refusal by a full window or a ban), with the ban of the hit's rule. The
// Guard calls Denied on the check path: it must not block (a fleet reporter
// queues it and returns).
type BanReporter interface {
	Denied(key string, ban window.Ban)
}

// RuleBan is what the Guard reads of a hit's Tag: the penalty box the hit's
// rule asks for, its zero fields taken from GuardOptions.Ban, or nil when
// the rule asks for none (its keys are then never banned). A front-end's
// rule implements it; a hit whose Tag does not is never banned.
type RuleBan interface {
	PenaltyBox() *window.Ban
}

// Guard is the local over-limit cache and penalty box in front of a
// [window.Limiter] (see the package doc): it refuses known-full keys and
// repeat offenders without asking the limiter behind it. Guard is safe for
// concurrent use; Close releases the cache's goroutines.
type Guard struct {
	next     window.Limiter
	now      func() time.Time
	ban      window.Ban
	reporter BanReporter // nil: none
	cache    *ristretto.Cache[string, *guardEntry]
}

// guardEntry is what the Guard knows of one key; fields are updated in
// place with atomics, so concurrent requests share one entry.
type guardEntry struct {
	limit     window.Limit // the limit the entry was made for; zero: none yet (a ban learnt by Ban)
	ban       window.Ban   // the penalty box the entry was made under
	fullUntil atomic.Int64 // UnixNano; refuse before this
	tally     bans.Tally   // the key's denials and ban
}

// madeFor reports whether e was made for limit l ("full until" holds only
// for the limit it was measured under).
func (e *guardEntry) madeFor(l window.Limit) bool {
	return e.limit.Requests == l.Requests && e.limit.Window == l.Window
}

// newEntry returns an entry for h's limit and its rule's box b, its count
// begun at now.
func newEntry(h *window.Hit, b window.Ban, now int64) *guardEntry {
	e := &guardEntry{limit: window.Limit{Requests: h.Limit.Requests, Window: h.Limit.Window}, ban: b}
	e.tally.Begin(now)
	return e
}

// NewGuard returns a Guard in front of next.
func NewGuard(next window.Limiter, opts GuardOptions) (*Guard, error) {
	if next == nil {
		return nil, fmt.Errorf("guard: the limiter behind it is nil")
	}
	if opts.Budget == 0 {
		opts.Budget = DefaultGuardBudget
	}
	if opts.Budget < MinGuardBudget {
		return nil, fmt.Errorf("guard: budget of %d bytes is below the minimum of 64 KiB", opts.Budget)
	}
	if opts.Ban.Duration < 0 || opts.Ban.Window < 0 || opts.Ban.Threshold < 0 {
		return nil, fmt.Errorf("guard: penalty box %+v has a negative field", opts.Ban)
	}
	if opts.Ban.Duration > window.MaxBanDuration {
		return nil, fmt.Errorf("guard: penalty box duration %s is longer than the maximum of %s", opts.Ban.Duration, window.MaxBanDuration)
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	items := opts.Budget / (guardEntryCost + 64)
	cache, err := ristretto.NewCache(&ristretto.Config[string, *guardEntry]{
		NumCounters: max(items*10, 1000),
		MaxCost:     opts.Budget,
		BufferItems: 64,
	})
	if err != nil {
		return nil, fmt.Errorf("guard: local cache: %w", err)
	}
	return &Guard{next: next, now: opts.Now, ban: opts.Ban, reporter: opts.Reporter, cache: cache}, nil
}

// Close stops the cache's background work. Decide after Close passes every
// request to the backend.
func (g *Guard) Close() { g.cache.Close() }

// Decide implements [window.Limiter]: a local refusal if any enforcing hit is known
// full or banned, else the backend's decision, remembered when it denies: a
// refusal learnt holds for the checks that start after Decide returns.
func (g *Guard) Decide(ctx context.Context, hits []window.Hit) (window.Decision, error) {
	now := g.now().UnixNano() // the send time: "full until" counts from here
	if d, refused := g.local(hits, now); refused {
		return d, nil
	}
	return g.remote(ctx, hits, now)
}

// remote asks the backend; now is the send time.
func (g *Guard) remote(ctx context.Context, hits []window.Hit, now int64) (window.Decision, error) {
	d, err := g.next.Decide(ctx, hits)
	if err != nil || d.Allowed || d.Index < 0 || d.Index >= len(hits) {
		return d, err
	}
	h := &hits[d.Index]
	ban := g.banOf(h)
	e, ok := g.cache.Get(h.Key)
	fresh := !ok || e == nil || !e.madeFor(h.Limit) || e.ban != ban
	if fresh {
		// First denial, or the rule changed: a fresh entry for the rule as
		// it is now, keeping a ban that still holds.
		ne := newEntry(h, ban, now)
		if ok && e != nil && bans.Holds(ban, e.limit, h.Limit) {
			ne.tally.Carry(&e.tally, false)
		}
		e = ne
	}
	// A denial of cost c > 1 says when c requests fit; a single one may fit
	// now (the window had room, not enough): "full until" only from cost 1.
	if h.Counted() == 1 {
		until := now + int64(d.RetryAfter)
		for cur := e.fullUntil.Load(); cur < until && !e.fullUntil.CompareAndSwap(cur, until); cur = e.fullUntil.Load() {
		}
	}
	g.denied(h, e, now)
	if fresh {
		g.set(h.Key, e)
	} else {
		g.store(h, e)
	}
	return d, nil
}

// local looks every enforcing hit up in the cache. "Full until" holds only
// for the limit it was measured under; a ban holds until it expires unless
// a reload made the rule more lenient (bans.Holds).
func (g *Guard) local(hits []window.Hit, now int64) (window.Decision, bool) {
	for i := range hits {
		h := &hits[i]
		if h.Shadow {
			continue
		}
		e, ok := g.cache.Get(h.Key)
		if !ok || e == nil {
			continue
		}
		if until := e.tally.Until(); now < until && bans.Holds(g.banOf(h), e.limit, h.Limit) {
			if e.limit.Requests == 0 {
				e = g.adopt(h, e)
			}
			g.denied(h, e, now)
			return localDecision(i, h, until-now, window.SourceLocalBanned), true
		}
		if !e.madeFor(h.Limit) {
			continue
		}
		if until := e.fullUntil.Load(); now < until {
			g.denied(h, e, now)
			return localDecision(i, h, until-now, window.SourceLocalFull), true
		}
	}
	return window.Decision{}, false
}

// denied counts a denial of h's key for the penalty box (bans.Tally),
// banning the key when it crosses the threshold.
func (g *Guard) denied(h *window.Hit, e *guardEntry, now int64) {
	ban := g.banOf(h)
	if !ban.Enabled() {
		return
	}
	if g.reporter != nil {
		g.reporter.Denied(h.Key, ban)
	}
	if e.tally.Deny(ban, now) {
		g.store(h, e)
	}
}

// adopt replaces e, an entry made by Ban for a key the Guard had no limit
// for, by one made for h's limit and rule, keeping its ban and denial
// count: so a reload that loosens the rule lifts it as it lifts a ban the
// Guard raised itself (bans.Holds).
func (g *Guard) adopt(h *window.Hit, e *guardEntry) *guardEntry {
	ne := &guardEntry{limit: window.Limit{Requests: h.Limit.Requests, Window: h.Limit.Window}, ban: g.banOf(h)}
	ne.tally.Carry(&e.tally, true)
	g.set(h.Key, ne)
	return ne
}

// Ban refuses key until until, as the penalty box does (SourceLocalBanned,
// retry-after until-now), whatever the Guard knew of it: an earlier or a
// later ban is replaced. It is how a ban raised elsewhere in the fleet (or
// by hand) takes effect here. The ban holds for every enforcing hit of key
// whose rule enables a penalty box; a reload that disables the rule's box
// or loosens its rate lifts it, as it lifts the Guard's own (the first hit
// refused makes the rule's limit the one the ban was earned under). Ban is
// safe for concurrent use; it returns when the ban is in effect, unless the
// cache, full, rejected it (a cache is a hint: the key is then decided by
// the store again).
func (g *Guard) Ban(key string, until time.Time) {
	u := unixNano(until)
	if e, ok := g.cache.Get(key); ok && e != nil {
		e.tally.Ban(u)
		return
	}
	e := &guardEntry{}
	e.tally.Ban(u)
	e.tally.Begin(g.now().UnixNano())
	g.set(key, e)
}

// Lift ends key's ban here and forgets when its window was full (a lift may
// have emptied the window: the store decides the key's next request). It is
// how a ban lifted elsewhere in the fleet takes effect here; a ban the
// Guard raises again by its own count is not prevented. Lift is safe for
// concurrent use; it returns when the lift is in effect.
func (g *Guard) Lift(key string) {
	e, ok := g.cache.Get(key)
	if !ok || e == nil {
		return
	}
	e.tally.Lift(g.now().UnixNano())
	e.fullUntil.Store(0)
}

// set inserts e for key and waits until it is in effect: a Set that the
// cache's buffers dropped under contention is tried once more.
func (g *Guard) set(key string, e *guardEntry) {
	if !g.cache.Set(key, e, int64(len(key))+guardEntryCost) {
		g.cache.Wait()
		g.cache.Set(key, e, int64(len(key))+guardEntryCost)
	}
	g.cache.Wait()
}

// banOf returns the penalty box that applies to h: the one its rule asks
// for (RuleBan), completed by the Guard's, or none.
func (g *Guard) banOf(h *window.Hit) window.Ban {
	if r, ok := h.Tag.(RuleBan); ok {
		if b := r.PenaltyBox(); b != nil {
			return b.Or(g.ban)
		}
	}
	return window.Ban{}
}

// unixNano returns t in Unix nanoseconds, saturated: an instant past what
// an int64 holds (2262) is the latest one, never a wrapped, past one.
func unixNano(t time.Time) int64 {
	if t.After(maxInstant) {
		return math.MaxInt64
	}
	return t.UnixNano()
}

// maxInstant is the latest instant in Unix nanoseconds.
var maxInstant = time.Unix(0, math.MaxInt64)

// store (re)inserts h's entry e. Entries carry no TTL: an expired entry
// refuses nothing (its instants are past) and the fixed budget evicts it in
// time; a TTL would cost a clock read on every lookup of the deny path.
func (g *Guard) store(h *window.Hit, e *guardEntry) {
	g.cache.Set(h.Key, e, int64(len(h.Key))+guardEntryCost)
}

func localDecision(i int, h *window.Hit, retry int64, src window.Source) window.Decision {
	return window.Decision{
		Allowed:     false,
		Index:       i,
		Limit:       h.Limit,
		Count:       h.Limit.Requests,
		Remaining:   0,
		RetryAfter:  time.Duration(retry),
		ShadowIndex: -1,
		Source:      src,
	}
}
