package lease

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/flashgate/flashgate/window"
	"github.com/flashgate/flashgate/window/redisstore"
)

// RuleLease is what a Holder reads of a hit's Tag: the lease length its
// rule asks for, 0 for none. A front-end's rule implements it.
type RuleLease interface {
	LeaseFor() time.Duration
}

// Reserver reserves and returns a key's slots: the Redis store.
type Reserver interface {
	LeaseID() string
	Lease(ctx context.Context, c redisstore.LeaseCall) (redisstore.Grant, error)
	// Member and Undo take back the other hits of a check that the
	// wrapped limiter recorded under redisstore.WithMember(member), when
	// a leased hit denies the check after them.
	Member() string
	Undo(ctx context.Context, member string, hits []window.Hit)
}

// Options configures [New].
type Options struct {
	// Store reserves the slots; required.
	Store Reserver
	// Size returns the live fleet's size and whether it is known; a lease
	// is at most ceil(limit / size) slots, and none is taken while the
	// size is unknown (a sidecar that never reached Redis). Nil: a fleet
	// of one, known.
	Size func() (int, bool)
	// Gate, if not nil, refuses a reservation for hits that must not reach
	// the store now (the fallback holding Redis off, the breaker open); its
	// error is the check's.
	Gate func(hits []window.Hit) error
	// Timeout returns a reservation's deadline; nil or 0: the check's
	// context alone.
	Timeout func() time.Duration
	// Now is the clock; nil means time.Now (monotonic).
	Now func() time.Time
}

// Holder is a [window.Limiter] decorator: a hit whose rule asks for a
// lease (RuleLease on its Tag, not shadow, an exact window) is admitted
// from a batch of slots this process reserved in the key's window; the
// request's other hits go to the wrapped limiter, all or nothing with it.
// A request without leased hits goes to the wrapped limiter unchanged. A
// reservation that fails fails the check with its error, which the core
// turns into the rule's failure mode: a leased hit never reaches the
// wrapped limiter. Holder is safe for concurrent use; Close it.
type Holder struct {
	next    window.Limiter
	store   Reserver
	size    func() (int, bool)
	gate    func([]window.Hit) error
	timeout func() time.Duration
	now     func() time.Time

	// mu guards keys and sweepAt.
	mu      sync.Mutex
	keys    map[string]*keyState
	sweepAt int // len(keys) at which state sweeps idle keys out

	heldUntil atomic.Int64 // UnixNano before which no reservation is made
	longest   atomic.Int64 // the longest lease seen, ns
	returns   sync.WaitGroup
	closed    atomic.Bool
	stats     statCounters

	// keptMu guards kept, keptN and trimmed.
	keptMu  sync.Mutex
	kept    map[string][]retired // by key, oldest first
	keptN   int                  // the retired leases in kept
	trimmed time.Time            // when kept was last trimmed whole
}

// retired is a returned lease's used slots, kept while they are in the
// window for a write-back after an empty return of Redis (Outstanding).
type retired struct {
	id    string
	limit window.Limit
	used  int
	end   time.Time // the lease's end on this process's clock: start + its length
}

// Stats counts a Holder's leases since it was built.
type Stats struct {
	// Leases: reservations that granted at least one slot.
	Leases uint64
	// Refusals: reservations that granted nothing (the window had no room
	// for the least worth a grant).
	Refusals uint64
	// Reserved: slots granted.
	Reserved uint64
	// Returned: slots given back unused (that the window still held).
	Returned uint64
	// Admitted: admissions made from a lease (request costs).
	Admitted uint64
	// Held: leases open now (slots this process may still use).
	Held int
}

type statCounters struct {
	leases, refusals, reserved, returned, admitted atomic.Uint64
	held                                           atomic.Int64
}

// keyState is one key's lease.
type keyState struct {
	// mu guards the fields below.
	mu     sync.Mutex
	cur    *held         // the lease, nil for none
	refill chan struct{} // closed when the reservation in flight ends; nil for none
	want   int           // the next reservation's size
	full   time.Time     // no reservation before: the window had no room
	dead   bool          // removed from Holder.keys
}

// held is one lease.
type held struct {
	id            string
	ks            *keyState
	key           string
	limit         window.Limit
	dur           time.Duration
	granted, used int
	start         time.Time // the reserving call's first send
	deadline      time.Time // closed to admissions from then
	closed        bool
	returned      bool // its unused slots were sent back, or are in a reservation's call
	timer         *time.Timer
}

// New returns a Holder over next.
func New(next window.Limiter, o Options) (*Holder, error) {
	if next == nil || o.Store == nil {
		return nil, errors.New("lease holder: the limiter and the store are required")
	}
	h := &Holder{next: next, store: o.Store, size: o.Size, gate: o.Gate, timeout: o.Timeout, now: o.Now, keys: map[string]*keyState{}, kept: map[string][]retired{}}
	if h.size == nil {
		h.size = func() (int, bool) { return 1, true }
	}
	if h.now == nil {
		h.now = time.Now
	}
	return h, nil
}

// Close closes every lease and returns its unused slots, and waits for the
// returns (each bounded by returnTimeout). Decide keeps working after it,
// through the wrapped limiter and new leases, which a later Close returns.
func (h *Holder) Close() {
	h.closed.Store(true)
	for _, ks := range h.states() {
		ks.mu.Lock()
		if l := ks.cur; l != nil && !l.returned {
			if !l.closed {
				h.closeLocked(l)
			}
			h.retireLocked(l)
			h.sendBack(l)
		}
		ks.mu.Unlock()
	}
	h.returns.Wait()
}

// states returns the keys' states now.
func (h *Holder) states() []*keyState {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]*keyState, 0, len(h.keys))
	for _, ks := range h.keys {
		out = append(out, ks)
	}
	return out
}

// Stats returns the counts so far.
func (h *Holder) Stats() Stats {
	return Stats{
		Leases: h.stats.leases.Load(), Refusals: h.stats.refusals.Load(), Reserved: h.stats.reserved.Load(),
		Returned: h.stats.returned.Load(), Admitted: h.stats.admitted.Load(), Held: int(h.stats.held.Load()),
	}
}

// leaseFor returns hit's lease length, 0 when it is not leased.
func leaseFor(hit *window.Hit) time.Duration {
	if hit.Shadow || hit.Limit.Buckets > 0 {
		return 0
	}
	if r, ok := hit.Tag.(RuleLease); ok {
		return r.LeaseFor()
	}
	return 0
}

// taken is a slot a request took from a lease, to give back if the
// request is not admitted.
type taken struct {
	ks   *keyState
	l    *held
	cost int
}

// Decide implements [window.Limiter].
func (h *Holder) Decide(ctx context.Context, hits []window.Hit) (window.Decision, error) {
	leased := 0
	for i := range hits {
		if leaseFor(&hits[i]) > 0 {
			leased++
		}
	}
	if leased == 0 {
		return h.next.Decide(ctx, hits)
	}
	if err := window.ValidateHits(hits); err != nil {
		return window.Decision{}, err
	}
	lhits := make([]window.Hit, 0, leased)
	lidx := make([]int, 0, leased)
	others := make([]window.Hit, 0, len(hits)-leased)
	oidx := make([]int, 0, len(hits)-leased)
	for i := range hits {
		if leaseFor(&hits[i]) > 0 {
			lhits, lidx = append(lhits, hits[i]), append(lidx, i)
		} else {
			others, oidx = append(others, hits[i]), append(oidx, i)
		}
	}
	st := make([]window.HitState, len(lhits))
	tk := make([]taken, 0, len(lhits))
	release := func() {
		for _, t := range tk {
			h.giveUp(t)
		}
	}
	for i := range lhits {
		t, err := h.take(ctx, &lhits[i], &st[i])
		if err != nil {
			release()
			return window.Decision{}, err
		}
		if st[i].Over {
			release()
			return denied(lhits, st, lidx), nil
		}
		tk = append(tk, t)
	}
	var (
		dn     window.Decision
		member string
	)
	if len(others) > 0 {
		// The other hits are recorded under a member id of ours, so that
		// they can be taken back if the leased ones fail at the end.
		member = h.store.Member()
		var err error
		dn, err = h.next.Decide(redisstore.WithMember(ctx, member), others)
		if err != nil || !dn.Allowed {
			release()
			return remap(dn, oidx), err
		}
	}
	// One leased hit alone was decided when take took its slot, under its
	// key's lock, inside its lease: nothing after it can change that.
	if len(tk) > 1 || len(others) > 0 {
		if err := h.confirm(ctx, lhits, st, tk); err != nil || anyOver(st) {
			h.store.Undo(ctx, member, others)
			if err != nil {
				return window.Decision{}, err
			}
			return denied(lhits, st, lidx), nil
		}
	}
	h.stats.admitted.Add(uint64(countOf(lhits)))
	dl := remap(window.Resolve(lhits, st), lidx)
	if len(others) == 0 {
		return dl, nil
	}
	dn = remap(dn, oidx)
	if dl.Remaining < dn.Remaining {
		dl.Shadowed, dl.ShadowIndex = dn.Shadowed, dn.ShadowIndex
		return dl, nil
	}
	return dn, nil
}

// maxConfirms bounds the rounds in which confirm takes again the slots of
// leases that ended before the check was decided.
const maxConfirms = 3

// confirm makes the check's decision final: at one instant, every slot in
// tk (tk[i] is lhits[i]'s) must come from a lease still running, so that
// the admission lies inside each lease's [reservation, end]. A slot whose
// lease ended meanwhile (a slow call for another hit, a reservation for
// another leased hit) is given up and taken again, from a running lease or
// a new one. When a hit's window has no room left for it then (it is Over
// in st) or confirm fails, every slot in tk has been given up.
func (h *Holder) confirm(ctx context.Context, lhits []window.Hit, st []window.HitState, tk []taken) error {
	for round := 0; ; round++ {
		now := h.now()
		late := false
		for i := range tk {
			if !now.Before(tk[i].l.deadline) {
				late = true
				break
			}
		}
		if !late {
			return nil
		}
		if round == maxConfirms {
			for _, t := range tk {
				h.giveUp(t)
			}
			return errLate
		}
		for i := range tk {
			if now.Before(tk[i].l.deadline) {
				continue
			}
			h.giveUp(tk[i])
			t, err := h.take(ctx, &lhits[i], &st[i])
			if err == nil && !st[i].Over {
				tk[i] = t
				continue
			}
			for j := range tk {
				if j != i {
					h.giveUp(tk[j])
				}
			}
			return err
		}
	}
}

// giveUp gives t's slot back to its lease, unless the lease's unused slots
// were already sent back: the slot then stays in the window unused until
// it ages out, which only makes the window stricter.
func (h *Holder) giveUp(t taken) {
	t.ks.mu.Lock()
	if !t.l.returned {
		t.l.used -= t.cost
	}
	t.ks.mu.Unlock()
}

// anyOver reports whether some hit's state is Over.
func anyOver(st []window.HitState) bool {
	for i := range st {
		if st[i].Over {
			return true
		}
	}
	return false
}

// denied is the decision of a check denied by one of its leased hits
// (lidx[i] is lhits[i]'s index in the check): the hits not over their
// limit admitted nothing.
func denied(lhits []window.Hit, st []window.HitState, lidx []int) window.Decision {
	for i := range st {
		if !st[i].Over {
			st[i] = window.HitState{Count: st[i].Count}
		}
	}
	return remap(window.Resolve(lhits, st), lidx)
}

// countOf returns the requests hits count as.
func countOf(hits []window.Hit) int {
	n := 0
	for i := range hits {
		n += hits[i].Counted()
	}
	return n
}

// remap returns d with its indexes into a subset of a request's hits
// turned into indexes into the request's (idx[i] is subset hit i's).
func remap(d window.Decision, idx []int) window.Decision {
	if d.Index >= 0 && d.Index < len(idx) {
		d.Index = idx[d.Index]
	}
	if d.ShadowIndex >= 0 && d.ShadowIndex < len(idx) {
		d.ShadowIndex = idx[d.ShadowIndex]
	}
	return d
}

// errLate fails a check whose lease came back after its own deadline:
// Redis answered later than a lease lasts.
var errLate = lateError{}

type lateError struct{}

func (lateError) Error() string {
	return "lease holder: the reservation came back after its lease ended"
}
func (lateError) Kind() window.ErrKind { return window.KindTimeout }

// errHeld is reserve's answer while grants are held after an outage: the
// check is denied (see take).
var errHeld = errors.New("lease holder: grants held after an outage")

// errNoFleet fails a check while the fleet's size is unknown.
var errNoFleet = noFleetError{}

type noFleetError struct{}

func (noFleetError) Error() string        { return "lease holder: the fleet's size is not known yet" }
func (noFleetError) Kind() window.ErrKind { return window.KindRestoring }

// state returns key's state, made if need be.
func (h *Holder) state(key string) *keyState {
	h.mu.Lock()
	defer h.mu.Unlock()
	ks := h.keys[key]
	if ks == nil {
		if len(h.keys) >= max(h.sweepAt, maxIdleKeys) {
			h.sweepLocked()
		}
		ks = &keyState{want: 1}
		h.keys[key] = ks
	}
	return ks
}

// sweepLocked forgets the keys that hold nothing (h.mu held): no lease
// whose slots are not yet back, no reservation in flight, no refusal still
// in force. Those left are
// in use, so the next sweep waits until the map has doubled past them.
func (h *Holder) sweepLocked() {
	now := h.now()
	for key, ks := range h.keys {
		ks.mu.Lock()
		if (ks.cur == nil || ks.cur.returned) && ks.refill == nil && !now.Before(ks.full) {
			ks.dead = true
			delete(h.keys, key)
		}
		ks.mu.Unlock()
	}
	h.sweepAt = 2 * len(h.keys)
}

// take takes hit's cost from its key's lease, reserving one if need be,
// and fills st: admitted (not Over) with the lease's count, or Over with
// the window's retry-after.
func (h *Holder) take(ctx context.Context, hit *window.Hit, st *window.HitState) (taken, error) {
	dur := leaseFor(hit)
	cost := hit.Counted()
	if int64(dur) > h.longest.Load() {
		h.longest.Store(int64(dur))
	}
	reserved := 0
	for {
		ks := h.state(hit.Key)
		ks.mu.Lock()
		if ks.dead {
			ks.mu.Unlock()
			continue
		}
		now := h.now()
		l := ks.cur
		// A lease granted under other settings (a reload changed the rule)
		// takes no check: the reservation below revokes it and returns its
		// remainder in the same call.
		same := l != nil && l.limit == hit.Limit && l.dur == dur
		if same && !l.closed && now.Before(l.deadline) && l.granted-l.used >= cost {
			l.used += cost
			rem := l.granted - l.used
			*st = window.HitState{Count: hit.Limit.Requests - rem, Reset: hit.Limit.Window}
			ks.mu.Unlock()
			return taken{ks: ks, l: l, cost: cost}, nil
		}
		if now.Before(ks.full) {
			*st = window.HitState{Count: hit.Limit.Requests, Over: true, RetryAfter: ks.full.Sub(now)}
			ks.mu.Unlock()
			return taken{}, nil
		}
		if ch := ks.refill; ch != nil {
			ks.mu.Unlock()
			select {
			case <-ch:
			case <-ctx.Done():
				return taken{}, fmt.Errorf("lease holder: waiting for a lease: %w", ctx.Err())
			}
			continue
		}
		if reserved == 2 {
			ks.mu.Unlock()
			return taken{}, errLate
		}
		reserved++
		if err := h.reserve(ctx, ks, hit, dur, cost); err != nil {
			if errors.Is(err, errHeld) {
				// No grant while leases of before an outage may still be
				// in use, and no local admission beside the fleet's
				// grants either: the check is denied until the hold ends.
				until := time.Unix(0, h.heldUntil.Load())
				*st = window.HitState{Count: hit.Limit.Requests, Over: true, RetryAfter: max(until.Sub(h.now()), time.Millisecond)}
				return taken{}, nil
			}
			return taken{}, err
		}
	}
}

// reserve makes ks's next lease for hit (ks.mu held; it is released and
// taken again around the call, while ks.refill tells other checks to wait,
// and released on return). The lease it replaces is closed first and its
// unused slots go back in the same call.
func (h *Holder) reserve(ctx context.Context, ks *keyState, hit *window.Hit, dur time.Duration, cost int) error {
	var back *held
	if l := ks.cur; l != nil && !l.returned {
		if !l.closed {
			h.closeLocked(l)
		}
		if l.granted > l.used {
			back = l
		}
		h.retireLocked(l)
	}
	n, known := h.size()
	if !known {
		ks.mu.Unlock()
		h.sendBack(back)
		return errNoFleet
	}
	if h.gate != nil {
		if err := h.gate([]window.Hit{*hit}); err != nil {
			h.heldUntil.Store(h.now().Add(time.Duration(h.longest.Load())).UnixNano())
			ks.mu.Unlock()
			h.sendBack(back)
			return err
		}
	}
	if h.now().UnixNano() < h.heldUntil.Load() {
		ks.mu.Unlock()
		h.sendBack(back)
		return errHeld
	}
	share := max((hit.Limit.Requests+max(n, 1)-1)/max(n, 1), 1)
	want := min(max(ks.want, cost), max(share, cost), hit.Limit.Requests)
	ch := make(chan struct{})
	ks.refill = ch
	ks.mu.Unlock()

	// A grant of less than half the batch wanted is not worth a call: the
	// check waits (denied) until that much fits, rather than every sidecar
	// of a full window calling for each slot that frees.
	call := redisstore.LeaseCall{Key: hit.Key, Limit: hit.Limit, For: dur, ID: h.store.LeaseID(), Want: want, Least: max(cost, want/2)}
	if back != nil {
		call.BackID, call.BackFrom, call.BackTo = back.id, back.used+1, back.granted
	}
	rctx := ctx
	if h.timeout != nil {
		if d := h.timeout(); d > 0 {
			var cancel context.CancelFunc
			rctx, cancel = context.WithTimeout(ctx, d)
			defer cancel()
		}
	}
	sent := h.now() // the first send: the lease's deadline counts from here
	g, err := h.store.Lease(rctx, call)

	ks.mu.Lock()
	defer ks.mu.Unlock()
	ks.refill = nil
	close(ch)
	if err != nil {
		return err
	}
	h.stats.returned.Add(uint64(g.Returned))
	if g.Slots == 0 {
		h.stats.refusals.Add(1)
		ks.full = sent.Add(g.RetryAfter)
		return nil
	}
	h.stats.leases.Add(1)
	h.stats.reserved.Add(uint64(g.Slots))
	h.stats.held.Add(1)
	l := &held{
		id: call.ID, ks: ks, key: hit.Key, limit: hit.Limit, dur: dur, granted: g.Slots,
		start: sent, deadline: sent.Add(dur - dur/50),
	}
	ks.cur = l
	// A grant that came back after its deadline expires at once: closed,
	// its slots sent back, its key forgotten if unused, like any other.
	l.timer = time.AfterFunc(max(l.deadline.Sub(h.now()), 0), func() { h.expire(ks, l) })
	return nil
}

// closeLocked closes l to admissions (its key's mu held) and sizes the
// key's next lease from l's use; its unused slots go back with the key's
// next reservation or by sendBack.
func (h *Holder) closeLocked(l *held) {
	l.closed = true
	h.stats.held.Add(-1)
	if l.timer != nil {
		l.timer.Stop()
	}
	if l.granted-l.used <= 0 && h.now().Sub(l.start) < l.dur {
		// Spent before its end: ask for half as much again. (Doubling
		// overshoots a sidecar that a lease's length caps: the slots it
		// cannot use are reserved and returned, a sorted-set entry added
		// and removed each.)
		l.ks.want = l.granted + l.granted/2 + 1
	} else {
		// Ended with slots left: about what it admitted.
		l.ks.want = max(l.used+l.used/8+1, 1)
	}
}

// sendBack returns l's unused slots in the background (nil: nothing); the
// caller has marked l returned, under its key's mu.
func (h *Holder) sendBack(l *held) {
	if l == nil || l.granted <= l.used {
		return
	}
	call := redisstore.LeaseCall{Key: l.key, Limit: l.limit, For: l.dur, BackID: l.id, BackFrom: l.used + 1, BackTo: l.granted}
	h.returns.Go(func() {
		ctx, cancel := context.WithTimeout(context.Background(), returnTimeout)
		defer cancel()
		if g, err := h.store.Lease(ctx, call); err == nil {
			h.stats.returned.Add(uint64(g.Returned))
		}
	})
}

// maxIdleKeys is how many keys the holder remembers the lease size of
// between leases; past it, a key forgets it when its lease ends.
const maxIdleKeys = 1 << 16

// returnTimeout bounds one return of unused slots; a return that fails
// leaves them to age out (stricter).
const returnTimeout = time.Second

// expire closes l at its deadline if it is still open. Its unused slots
// go back with the key's next reservation if one comes within another
// lease's length (a busy key: one call instead of two), else on their own
// then (giveBack).
func (h *Holder) expire(ks *keyState, l *held) {
	ks.mu.Lock()
	defer ks.mu.Unlock()
	if l.closed {
		return
	}
	h.closeLocked(l)
	time.AfterFunc(l.dur, func() { h.giveBack(ks, l) })
}

// giveBack sends back l's unused slots unless a reservation took them, and
// forgets a key whose lease went unused (so that an idle process holds
// nothing and remembers little).
func (h *Holder) giveBack(ks *keyState, l *held) {
	h.mu.Lock()
	defer h.mu.Unlock()
	ks.mu.Lock()
	defer ks.mu.Unlock()
	if !l.returned {
		h.retireLocked(l)
		h.sendBack(l)
	}
	if (l.used == 0 || len(h.keys) > maxIdleKeys) && ks.cur == l && ks.refill == nil {
		ks.dead = true
		if h.keys[l.key] == ks {
			delete(h.keys, l.key)
		}
	}
}

// maxKept bounds the returned leases a Holder keeps for Outstanding; past
// it a lease's used slots are not kept (an empty return of Redis then
// forgets them, see docs/design.md).
const maxKept = 1 << 16

// retireLocked marks l returned (its key's mu held): its used slots are
// final, and kept while they are in the window.
func (h *Holder) retireLocked(l *held) {
	l.returned = true
	if l.used <= 0 {
		return
	}
	now := h.now()
	h.keptMu.Lock()
	defer h.keptMu.Unlock()
	if h.keptN >= maxKept && now.Sub(h.trimmed) >= time.Second {
		h.trimmed = now
		for key := range h.kept {
			h.trimLocked(key, now)
		}
	}
	if h.keptN >= maxKept {
		return
	}
	h.trimLocked(l.key, now)
	h.kept[l.key] = append(h.kept[l.key], retired{id: l.id, limit: l.limit, used: l.used, end: l.start.Add(l.dur)})
	h.keptN++
}

// trimLocked drops key's kept leases whose slots have left the window
// (keptMu held).
func (h *Holder) trimLocked(key string, now time.Time) {
	rs := h.kept[key]
	i := 0
	for i < len(rs) && now.Sub(rs[i].end) >= rs[i].limit.Window {
		i++
	}
	switch {
	case i == len(rs):
		delete(h.kept, key)
	case i > 0:
		h.kept[key] = append(rs[:0:0], rs[i:]...)
	}
	h.keptN -= i
}

// Outstanding returns the slots this process reserved that a Redis which
// came back empty has forgotten and that are still in their windows: a
// running lease's every slot (it may use them all), a returned lease's
// used ones, each under its own member and aged from the lease's end on
// this clock (negative while it is ahead), so that the write-back scores
// it no earlier than any use of it. It implements fallback.Outstanding:
// the fallback writes them back after an outage, before its settle ends.
// A slot that goes back while they are written may be written again: it
// then only makes the window stricter until it ages out.
func (h *Holder) Outstanding() []window.Admitted {
	now := h.now()
	by := map[string]*window.Admitted{}
	add := func(key string, lim window.Limit, id string, n int, end time.Time) {
		age := now.Sub(end)
		if n <= 0 || age >= lim.Window {
			return
		}
		a := by[key]
		if a == nil {
			a = &window.Admitted{Key: key, Limit: lim}
			by[key] = a
		}
		for j := 1; j <= n; j++ {
			a.Entries = append(a.Entries, window.AdmittedEntry{Age: age, Cost: 1, ID: id + "#" + strconv.Itoa(j)})
		}
	}
	h.keptMu.Lock()
	for key := range h.kept {
		h.trimLocked(key, now)
		for _, r := range h.kept[key] {
			add(key, r.limit, r.id, r.used, r.end)
		}
	}
	h.keptMu.Unlock()
	for _, ks := range h.states() {
		ks.mu.Lock()
		if l := ks.cur; l != nil && !l.returned {
			n := l.used
			if !l.closed {
				n = l.granted
			}
			add(l.key, l.limit, l.id, n, l.start.Add(l.dur))
		}
		ks.mu.Unlock()
	}
	out := make([]window.Admitted, 0, len(by))
	for _, a := range by {
		slices.SortStableFunc(a.Entries, func(x, y window.AdmittedEntry) int { return cmp.Compare(y.Age, x.Age) })
		out = append(out, *a)
	}
	return out
}
