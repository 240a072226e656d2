package fallback

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"hash/maphash"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/flashgate/flashgate/window"
)

// ErrRestoring is returned by the limiter [Fallback.Watch] returns for a
// call it does not send on: the store has not answered since an outage,
// local admissions on one of its keys are not written back yet, or the
// fleet is settling after an outage. [window.Classify] counts it as
// [window.KindRestoring].
var ErrRestoring error = restoringError{}

// restoringError is ErrRestoring's type: an error of window.KindRestoring.
type restoringError struct{}

func (restoringError) Error() string        { return "window: local admissions not yet written back" }
func (restoringError) Kind() window.ErrKind { return window.KindRestoring }

// Defaults of the write-back's [Options]. The settle outlasts go-redis's
// dial back-off: a pool whose dials all failed dials again once a second,
// so one sidecar may see Redis back up to a second after another.
const (
	DefaultRestoreTimeout = time.Second
	DefaultRestoreSettle  = 1500 * time.Millisecond
)

const (
	restoreRetryMin     = 10 * time.Millisecond
	restoreRetryMax     = 100 * time.Millisecond
	settleTail          = 100 * time.Millisecond // see writeBack.closing
	restoreChunkKeys    = 256                    // keys per Restore call
	restoreChunkEntries = 4096                   // admissions per Restore call, about
)

// WriteBackStats counts a [Fallback]'s write-back (see [Fallback.WriteBack]).
type WriteBackStats struct {
	// Landed and Failed count the write-back rounds.
	Landed, Failed uint64
	// Written counts the entries (request costs) written back.
	Written uint64
	// Outstanding counts the entries of Fallback.WriteBackAlso written
	// back (once per outage each).
	Outstanding uint64
	// Unremembered counts the entries admitted locally on a new key while
	// MaxKeys keys were waiting to be written back: never written back.
	Unremembered uint64
	// Pending is the keys waiting to be written back now.
	Pending int
	// Returns counts the times a round found Redis back: after an outage,
	// or restarted unseen (its run id changed). Each begins the settle.
	Returns uint64
	// Down is true during an outage: Redis failed and no round has found
	// it back yet, so every call is held off.
	Down bool
	// SettleEnd is when the settle under way ends (the fleet's end, when
	// it shares one: Options.SharedSettle); zero for none.
	SettleEnd time.Time
}

// writeBack is a Fallback's memory of its local admissions and the rounds
// that write them back (see the top of this file).
type writeBack struct {
	to       Restorer
	now      func() time.Time
	timeout  time.Duration
	settle   time.Duration
	maxKeys  int64
	onReturn func()      // Options.OnReturn, or nil
	settles  SettleStore // Options.SharedSettle, or nil
	idPrefix [9]byte     // 0x01, then 8 random bytes
	seed     maphash.Seed
	seq      atomic.Uint64

	keys        atomic.Int64           // keys in shards
	settleUntil atomic.Int64           // UnixNano: every call takes its failure mode until then; 0 for none
	settleBegan atomic.Int64           // UnixNano: when the settle under way began
	runID       atomic.Pointer[string] // the store's run id as the last round found it
	down        atomic.Uint64          // the outage under way (its number), or 0: Redis failed and no round since answered; every call is held off
	outages     atomic.Uint64          // the outages so far: the next one's number less one
	outage      atomic.Bool            // the admissions waiting include an outage's: they hold their keys' calls off
	waiting     atomic.Bool            // a retry is scheduled (timer)
	closed      atomic.Bool            // the restorer or the Fallback is closed: no more rounds

	landed, failed, written, lost, returns, alsoWritten atomic.Uint64

	also    atomic.Pointer[Outstanding] // WriteBackAlso's, or nil
	alsoDue atomic.Bool                 // also's entries are to be written (an outage, a restart in a settle)

	shards [wbShards]wbShard

	// ctx is the rounds' calls' parent, canceled by close; rounds counts
	// the rounds in flight and the retries scheduled.
	ctx    context.Context
	cancel context.CancelFunc
	rounds sync.WaitGroup

	// mu guards the fields below.
	mu      sync.Mutex
	running bool        // a round is in flight
	timer   *time.Timer // the retry after a failed round; nil for none
	backoff time.Duration
}

type wbShard struct {
	// mu guards keys.
	mu   sync.Mutex
	keys map[string]*wbKey
	_    [48]byte // keep shards on separate cache lines
}

// wbKey is one key's admissions not yet written back, oldest first, and
// the limit of the last.
type wbKey struct {
	limit window.Limit
	adm   []wbAdmission
}

type wbAdmission struct {
	at   int64 // UnixNano
	seq  uint64
	cost int
}

// trim drops the admissions that have left the window at now.
func (k *wbKey) trim(now int64) {
	cut := now - int64(k.limit.Window)
	i := 0
	for i < len(k.adm) && k.adm[i].at <= cut {
		i++
	}
	if i > 0 {
		k.adm = append(k.adm[:0], k.adm[i:]...)
	}
}

func newWriteBack(to Restorer, now func() time.Time, timeout, settle time.Duration, maxKeys int) (*writeBack, error) {
	w := &writeBack{to: to, now: now, timeout: timeout, settle: settle, maxKeys: int64(maxKeys), seed: maphash.MakeSeed()}
	w.idPrefix[0] = 1 // request ids never begin with 0x01 (see window.AdmittedEntry)
	if _, err := rand.Read(w.idPrefix[1:]); err != nil {
		return nil, fmt.Errorf("draw a write-back id prefix: %w", err)
	}
	for i := range w.shards {
		w.shards[i].keys = make(map[string]*wbKey)
	}
	w.ctx, w.cancel = context.WithCancel(context.Background())
	return w, nil
}

// close stops the rounds: no round starts after it, a scheduled retry is
// dropped, and a round in flight is canceled and waited for.
func (w *writeBack) close() {
	w.mu.Lock()
	w.closed.Store(true)
	if w.timer != nil && w.timer.Stop() {
		w.timer = nil
		w.waiting.Store(false)
		w.rounds.Done()
	}
	w.mu.Unlock()
	w.cancel()
	w.rounds.Wait()
}

// scheduleLocked schedules a retry in d.
func (w *writeBack) scheduleLocked(d time.Duration) {
	w.waiting.Store(true)
	w.rounds.Add(1)
	w.timer = time.AfterFunc(d, w.retry)
}

// wbShards is the number of independently locked shards of the keys.
const wbShards = 64

// shard returns key's shard.
func (w *writeBack) shard(key string) *wbShard {
	return &w.shards[maphash.String(w.seed, key)%wbShards]
}

// id returns the member id of admission seq.
func (w *writeBack) id(seq uint64) string {
	var b [9 + binary.MaxVarintLen64]byte
	copy(b[:], w.idPrefix[:])
	n := binary.PutUvarint(b[9:], seq)
	return string(b[:9+n])
}

// record remembers a local admission of cost on h's key at now; it is an
// admitFunc (called under the local log's lock).
func (w *writeBack) record(h *window.Hit, cost int, now int64) {
	s := w.shard(h.Key)
	s.mu.Lock()
	defer s.mu.Unlock()
	k := s.keys[h.Key]
	if k == nil {
		if w.keys.Load() >= w.maxKeys {
			w.lost.Add(uint64(cost))
			return
		}
		k = &wbKey{}
		s.keys[h.Key] = k
		w.keys.Add(1)
	}
	k.limit = h.Limit
	k.trim(now)
	k.adm = append(k.adm, wbAdmission{at: now, seq: w.seq.Add(1), cost: cost})
}

// holds reports whether any of hits' keys has admissions to write back.
func (w *writeBack) holds(hits []window.Hit) bool {
	for i := range hits {
		s := w.shard(hits[i].Key)
		s.mu.Lock()
		_, ok := s.keys[hits[i].Key]
		s.mu.Unlock()
		if ok {
			return true
		}
	}
	return false
}

// gated reports whether calls must pass gate: Redis is down, admissions
// wait, or the fleet settles.
func (w *writeBack) gated() bool {
	return w.down.Load() != 0 || w.keys.Load() > 0 || w.settleUntil.Load() != 0
}

// gate returns ErrRestoring for a call that must not reach Redis yet. While
// Redis is down no call goes on: the rounds (Redis's run id asked, then
// the write-back) find it back, so that no check is decided by a Redis that
// may have come back empty before the settle has begun. It reads the keys
// before the settle: a landing starts the settle before it forgets the
// admissions (see send).
func (w *writeBack) gate(hits []window.Hit) error {
	if w.down.Load() != 0 {
		return ErrRestoring
	}
	if w.keys.Load() > 0 && w.holds(hits) {
		w.poke()
		if w.outage.Load() {
			return ErrRestoring
		}
	}
	if until := w.settleUntil.Load(); until != 0 {
		if w.now().UnixNano() < until {
			return ErrRestoring
		}
		w.settleUntil.CompareAndSwap(until, 0)
	}
	return nil
}

// watching reports whether the rounds watch Redis: it is down, or the
// fleet settles.
func (w *writeBack) watching() bool {
	if w.down.Load() != 0 {
		return true
	}
	u := w.settleUntil.Load()
	return u != 0 && w.now().UnixNano() < u
}

// poke starts a round if admissions wait or the rounds watch Redis, and
// none is in flight or scheduled.
func (w *writeBack) poke() {
	if (w.keys.Load() == 0 && !w.watching()) || w.closed.Load() {
		return
	}
	w.mu.Lock()
	w.startLocked()
	w.mu.Unlock()
}

// failedCall notes a call below Watch that failed with err: a connection
// error while admissions wait marks Redis down and makes them hold their
// keys' calls off. (The call's failure mode decides whether this process
// enforces locally: see Fallback.DecideAfter.) An open breaker does not: it
// opened on connection errors seen already, or on a slow Redis, which is
// not down; and a breaker still open after the settle lets its probe
// through while it refuses the other calls.
func (w *writeBack) failedCall(err error) {
	if w.keys.Load() == 0 || window.Classify(err) != window.KindConnection {
		return
	}
	if w.markDown() {
		w.poke()
	}
}

// answeredCall notes a call below Watch that Redis answered: a scheduled
// retry starts now. It does not end an outage: while Redis is down no call
// goes on, so a call answered then was sent before the outage began, and
// only a round sent since tells that Redis is back.
func (w *writeBack) answeredCall() {
	if !w.waiting.Load() {
		return
	}
	w.mu.Lock()
	w.retryNowLocked()
	w.mu.Unlock()
}

// retryNowLocked starts a scheduled retry now.
func (w *writeBack) retryNowLocked() {
	if w.timer != nil && w.timer.Stop() {
		w.timer = nil
		w.waiting.Store(false)
		w.rounds.Done()
	}
	w.startLocked()
}

// markHeld makes the admissions waiting hold their keys' calls off.
func (w *writeBack) markHeld() {
	if !w.outage.Load() {
		w.outage.Store(true)
	}
}

// markDown notes an outage: Redis cannot be reached. The admissions
// waiting hold their keys' calls off, and every call is held off until a
// round finds Redis back. It reports whether the outage is a new one: then
// the caller pokes (or is the round, which schedules its retry).
func (w *writeBack) markDown() bool {
	if w.keys.Load() > 0 {
		w.markHeld()
	}
	if w.down.Load() == 0 && w.down.CompareAndSwap(0, w.outages.Add(1)) {
		w.alsoDue.Store(true)
		return true
	}
	return false
}

// settleIfDown begins the settle if outage (a number markDown gave, or 0
// for none) is still the one under way: Redis answered a round that began
// during it. An answer to a round that began before cannot end a later
// outage. The settle is in place before the outage ends, so that no call
// passes the gate in between.
func (w *writeBack) settleIfDown(outage uint64) {
	if outage == 0 || w.down.Load() != outage {
		return
	}
	w.startSettle()
	if w.down.CompareAndSwap(outage, 0) {
		w.noteReturn()
	}
}

// startSettle begins the settle now, on this sidecar's clock.
func (w *writeBack) startSettle() {
	if w.settle <= 0 {
		return
	}
	now := w.now()
	w.settleBegan.Store(now.UnixNano())
	w.settleUntil.Store(now.Add(w.settle).UnixNano())
}

// noteReturn notes a return of the store once the settle is in place: the
// breaker below is told, and the fleet's end agreed (see agree).
func (w *writeBack) noteReturn() {
	w.returns.Add(1)
	if w.onReturn != nil {
		w.onReturn()
	}
	if w.settle > 0 {
		w.agree(w.settle)
	}
}

// agree proposes an end d from now (0 only reads) as the end of the
// fleet's settle and, while this sidecar settles, takes the fleet's end if
// later, up to 2 × Settle from the settle's beginning. The end is agreed on
// the store's clock and taken as a span from this sidecar's now. A failed
// call changes nothing: the round's next call meets the failure.
func (w *writeBack) agree(d time.Duration) {
	if w.settles == nil {
		return
	}
	ctx, cancel := context.WithTimeout(w.ctx, w.timeout)
	defer cancel()
	rem, err := w.settles.SettleEnd(ctx, d)
	if err != nil || rem <= 0 {
		return
	}
	e := min(w.now().Add(rem).UnixNano(), w.settleBegan.Load()+int64(2*w.settle))
	for {
		cur := w.settleUntil.Load()
		if cur == 0 || e <= cur || w.settleUntil.CompareAndSwap(cur, e) {
			return
		}
	}
}

// closing reports whether the settle ends within settleTail: a local
// decision then admits nothing, so that what the fleet admitted is written
// back before it turns to the store.
func (w *writeBack) closing() bool {
	u := w.settleUntil.Load()
	if u == 0 {
		return false
	}
	now := w.now().UnixNano()
	return now < u && u-now <= int64(min(settleTail, w.settle/4))
}

// startLocked starts a round unless one is in flight or scheduled, or
// nothing waits and the rounds do not watch Redis.
func (w *writeBack) startLocked() {
	if w.running || w.timer != nil || (w.keys.Load() == 0 && !w.watching()) || w.closed.Load() {
		return
	}
	w.running = true
	w.rounds.Add(1)
	go func() {
		defer w.rounds.Done()
		w.round()
	}()
}

// round writes everything back once, then starts the next round (more
// admissions came meanwhile) or schedules a retry. While it watches Redis
// (down, or the fleet settling) it asks Redis's run id first, and again
// every restoreRetryMax while settling: a Redis that restarted meanwhile,
// unseen by any call (they are held off), begins the settle anew.
func (w *writeBack) round() {
	outage, watch := w.down.Load(), w.watching()
	var (
		id   string
		sent bool
		err  error
	)
	if watch {
		id, err = w.ping()
	}
	if err == nil && w.alsoDue.Load() {
		err = w.writeAlso()
	}
	if err == nil {
		sent, err = w.writeAll(outage)
	}
	if err == nil && watch {
		w.returned(outage, id)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.running = false
	if w.closed.Load() {
		return
	}
	if err == nil {
		if sent {
			w.landed.Add(1)
		}
		w.backoff = 0
		if w.keys.Load() > 0 {
			w.startLocked() // more admissions came meanwhile
		} else if w.watching() {
			w.scheduleLocked(restoreRetryMax) // the next look at Redis while the fleet settles
		}
		return
	}
	w.failed.Add(1)
	switch window.Classify(err) {
	case window.KindClosed:
		w.closed.Store(true) // the store is closed: shutdown
		return
	case window.KindConnection:
		w.markDown() // the retry below is its round
	}
	w.backoff = min(max(2*w.backoff, restoreRetryMin), restoreRetryMax)
	w.scheduleLocked(w.backoff)
}

// retry is a failed round's timer.
func (w *writeBack) retry() {
	defer w.rounds.Done()
	w.mu.Lock()
	defer w.mu.Unlock()
	w.timer = nil
	w.waiting.Store(false)
	w.startLocked()
}

// wbSent is one key's admissions as a round read them.
type wbSent struct {
	key   string
	limit window.Limit
	adm   []wbAdmission
}

// ping asks Redis whether it answers, and its run id.
func (w *writeBack) ping() (string, error) {
	ctx, cancel := context.WithTimeout(w.ctx, w.timeout)
	defer cancel()
	id, err := w.to.RunID(ctx)
	if err != nil {
		return "", fmt.Errorf("fallback write-back: %w", err)
	}
	return id, nil
}

// returned notes that Redis answered a round of outage (0 for none) as
// run id id: the outage ends, and the settle begins (unless a write-back
// call of the round saw to it); during a settle, a run id other than the
// last one seen means Redis restarted since, unseen, and the settle begins
// anew.
func (w *writeBack) returned(outage uint64, id string) {
	if outage != 0 {
		w.settleIfDown(outage)
		if id != "" {
			w.runID.Store(&id)
		}
		return
	}
	if id != "" {
		if prev := w.runID.Swap(&id); prev != nil && *prev != id {
			w.alsoDue.Store(true)
			w.startSettle()
			w.noteReturn()
			return
		}
	}
	w.agree(0) // a later return elsewhere in the fleet moves the end
}

// writeAlso writes WriteBackAlso's entries back, in calls of about
// restoreChunkEntries admissions; a failure leaves them due.
func (w *writeBack) writeAlso() error {
	o := w.also.Load()
	if o == nil || !w.alsoDue.CompareAndSwap(true, false) {
		return nil
	}
	batch := (*o).Outstanding()
	for len(batch) > 0 {
		n, e := 0, 0
		for n < len(batch) && e < restoreChunkEntries {
			e += len(batch[n].Entries)
			n++
		}
		ctx, cancel := context.WithTimeout(w.ctx, w.timeout)
		err := w.to.Restore(ctx, batch[:n])
		cancel()
		if err != nil {
			w.alsoDue.Store(true)
			return fmt.Errorf("fallback write-back of outstanding entries: %w", err)
		}
		w.alsoWritten.Add(uint64(e))
		batch = batch[n:]
	}
	return nil
}

// writeAll writes every remembered admission still in its window back, in
// calls of restoreChunkKeys keys or about restoreChunkEntries admissions,
// forgetting each call's admissions once it landed, and reports whether it
// sent any. A call that lands during outage (0 for none) ends it (see
// settleIfDown). It stops at the first call that fails.
func (w *writeBack) writeAll(outage uint64) (sent bool, err error) {
	var chunk []wbSent
	entries := 0
	for i := range w.shards {
		s := &w.shards[i]
		now := w.now().UnixNano()
		s.mu.Lock()
		for key, k := range s.keys {
			k.trim(now)
			if len(k.adm) == 0 {
				delete(s.keys, key)
				if w.keys.Add(-1) == 0 {
					w.outage.Store(false)
				}
				continue
			}
			chunk = append(chunk, wbSent{key: key, limit: k.limit, adm: slices.Clone(k.adm)})
			entries += len(k.adm)
		}
		s.mu.Unlock()
		for len(chunk) >= restoreChunkKeys || entries >= restoreChunkEntries || (i == len(w.shards)-1 && len(chunk) > 0) {
			n, e := 0, 0
			for n < len(chunk) && n < restoreChunkKeys && e < restoreChunkEntries {
				e += len(chunk[n].adm)
				n++
			}
			if err := w.send(outage, chunk[:n]); err != nil {
				return sent, err
			}
			sent = true
			chunk, entries = chunk[n:], entries-e
		}
	}
	return sent, nil
}

// send writes sent back in one call and forgets what landed; landing, it
// ends outage (0 for none) if that is still under way.
func (w *writeBack) send(outage uint64, sent []wbSent) error {
	now := w.now()
	batch := make([]window.Admitted, len(sent))
	for i, s := range sent {
		es := make([]window.AdmittedEntry, len(s.adm))
		for j, a := range s.adm {
			es[j] = window.AdmittedEntry{Age: max(now.Sub(time.Unix(0, a.at)), 0), Cost: a.cost, ID: w.id(a.seq)}
		}
		batch[i] = window.Admitted{Key: s.key, Limit: s.limit, Entries: es}
	}
	ctx, cancel := context.WithTimeout(w.ctx, w.timeout)
	defer cancel()
	if err := w.to.Restore(ctx, batch); err != nil {
		return fmt.Errorf("fallback write-back: %w", err)
	}
	w.settleIfDown(outage) // before a call can find its key's admissions gone
	for _, s := range sent {
		last := s.adm[len(s.adm)-1].seq
		sh := w.shard(s.key)
		sh.mu.Lock()
		if k := sh.keys[s.key]; k != nil {
			i := 0
			for i < len(k.adm) && k.adm[i].seq <= last {
				i++
			}
			k.adm = append(k.adm[:0], k.adm[i:]...)
			if len(k.adm) == 0 {
				delete(sh.keys, s.key)
				if w.keys.Add(-1) == 0 {
					w.outage.Store(false)
				}
			}
		}
		sh.mu.Unlock()
		for _, a := range s.adm {
			w.written.Add(uint64(a.cost))
		}
	}
	return nil
}

func (w *writeBack) stats() WriteBackStats {
	st := WriteBackStats{
		Landed: w.landed.Load(), Failed: w.failed.Load(), Written: w.written.Load(),
		Unremembered: w.lost.Load(), Pending: int(w.keys.Load()), Returns: w.returns.Load(),
		Down: w.down.Load() != 0, Outstanding: w.alsoWritten.Load(),
	}
	if u := w.settleUntil.Load(); u != 0 {
		st.SettleEnd = time.Unix(0, u)
	}
	return st
}
