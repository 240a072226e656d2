package redisstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashgate/flashgate/window"
)

// DefaultPipelineWorkers is how many round trips an auto-pipelining [Redis]
// keeps in flight at most (the second only while the first is stalled).
const DefaultPipelineWorkers = 2

// maxPipelineBatch caps the script calls sent in one auto-pipelined round
// trip: a batch of 3-key scripts then keeps Redis busy for a few ms at most.
const maxPipelineBatch = 128

// A slot beyond the first opens only while the newest call in flight has
// been out for twice the smoothed round trip, bounded by these.
const (
	minStall = 250 * time.Microsecond
	maxStall = 5 * time.Millisecond
)

// After a call of n ≥ holdMin requests returns, the next call goes out once
// n calls are queued, or hold after that return (see doc.go).
const (
	hold    = 200 * time.Microsecond
	holdMin = 4
)

// pipelineTimeout bounds an auto-pipelined round trip for the callers whose
// context has no deadline (the client's own read and write timeouts apply
// too). Callers with a deadline bound it by the latest of theirs.
const pipelineTimeout = 2 * time.Second

// pipelineTuning is how an auto-pipeline batches: defaultTuning on
// standalone and Sentinel Redis, with masterHold on a Cluster master; a test
// adjusts it through newRedis.
type pipelineTuning struct {
	workers            int           // round trips in flight at most; also the dispatchers
	stallMin, stallMax time.Duration // bounds of the stall that opens another slot
	hold               time.Duration
	window             time.Duration // Options.BatchWindow
	alwaysQueue        bool          // send every call through the dispatchers, never on its own
}

var defaultTuning = pipelineTuning{workers: DefaultPipelineWorkers, stallMin: minStall, stallMax: maxStall, hold: hold}

// autoPipeline batches the decisions of concurrent callers into shared
// script calls (see doc.go). It is safe for concurrent use.
type autoPipeline struct {
	script *script
	client Client
	slots  int           // calls in flight at most; also the dispatchers
	wake   chan struct{} // capacity 1: tells an idle dispatcher there is work
	stop   chan struct{} // closed by close
	ctx    context.Context
	// cancel cancels ctx, the parent of every batch's context.
	cancel context.CancelFunc
	wg     sync.WaitGroup // the dispatchers
	// calls pools the queued calls (see pipelineCall.done).
	calls sync.Pool

	alwaysQueue        bool
	stallMin, stallMax time.Duration
	// window is the batch window, ns: a call queued while none is in
	// flight and none queued goes out window after it was queued, or once
	// maxPipelineBatch are queued.
	window int64

	epoch time.Time // the origin of the monotonic times below

	// mu guards the fields below.
	mu sync.Mutex
	// hold is the hold, ns (a test lengthens it).
	hold  int64
	queue []*pipelineCall
	// ticks holds the calls whose deadline ends at each tick (tickLocked),
	// by tick number; each tick is removed and its calls expired at its end.
	ticks map[int64][]callRef
	// flying holds each dispatcher's batch in flight (close ends them).
	flying [][]*pipelineCall
	// sends holds when each call in flight (batches and calls sent on their
	// own) was sent, ns since epoch: len(sends) calls are in flight.
	sends []int64
	srtt  int64 // smoothed duration of a call, ns; 0 before the first
	// held is when the last call of at least holdMin requests returned:
	// while none is in flight, no call goes out before held+hold unless
	// holdN are queued.
	held int64
	// holdN is the size of that call: the hold ends once as many calls
	// are queued.
	holdN int
	// opened is when the batch window of the queued calls opened (see
	// window); meaningful while calls are queued.
	opened int64
	// lone: the last batch a dispatcher sent carried one call, so holding
	// a call behind the one in flight did not pay; a free slot is then open
	// at once (see openLocked). False before the first batch.
	lone   bool
	closed bool
}

// pipelineCall is one queued request and, once done has received, its
// reply. Its caller waits on done alone (cheaper than a select over its
// context, its tick and the pipeline's stop, which every queued caller
// would lock): the reply, the end of its deadline, the pipeline's close and
// the dispatcher's drop of an abandoned call each finish it there, and the
// first to finish wins.
type pipelineCall struct {
	keys     []string
	args     []any
	deadline time.Time       // the caller's (its context's, or run's by); zero: none
	gone     <-chan struct{} // the caller's ctx.Done(): closed once it gave up
	// gen counts the call's uses (it comes from a pool); state is gen<<1,
	// plus 1 once finished. A finisher names the use it means (callRef), so
	// a late one (a tick of a call that has since been answered and reused)
	// finishes nothing.
	gen   uint64
	state atomic.Uint64
	// done receives one value once res, err and recycle are set; it has
	// room for it, so finishing never blocks.
	done chan struct{}
	res  []any
	err  error
	// recycle: the queue and the batches in flight no longer hold the call
	// (its batch is done, or it left the queue), so the caller gives it
	// back to the pool; else (its tick or close finished it while queued or
	// in flight) it is left to the garbage collector. A tick's callRef may
	// still point at a recycled call: it names an old gen and finishes
	// nothing. So may a dispatcher's flying entry until its release: close,
	// its one reader, then ends the call's current use, itself queued or in
	// flight.
	recycle bool
}

// callRef names one use of a call.
type callRef struct {
	c   *pipelineCall
	gen uint64
}

// finish hands res and err to the caller of use gen of c, unless that use
// is already finished (or over); it reports whether it did.
func (c *pipelineCall) finish(gen uint64, res []any, err error, recycle bool) bool {
	if !c.state.CompareAndSwap(gen<<1, gen<<1|1) {
		return false
	}
	c.res, c.err, c.recycle = res, err, recycle
	c.done <- struct{}{}
	return true
}

// finished reports whether c's current use is finished.
func (c *pipelineCall) finished() bool { return c.state.Load()&1 != 0 }

// newAutoPipeline starts tune.workers dispatchers of script on client.
func newAutoPipeline(client Client, script *script, tune pipelineTuning) *autoPipeline {
	ctx, cancel := context.WithCancel(context.Background())
	p := &autoPipeline{
		script: script,
		client: client,
		slots:  tune.workers,
		wake:   make(chan struct{}, 1),
		stop:   make(chan struct{}),
		ctx:    ctx,
		cancel: cancel,
		epoch:  time.Now(),
		ticks:  make(map[int64][]callRef),
		flying: make([][]*pipelineCall, tune.workers),
		calls: sync.Pool{New: func() any {
			return &pipelineCall{done: make(chan struct{}, 1)}
		}},

		alwaysQueue: tune.alwaysQueue || tune.window > 0,
		window:      int64(tune.window),
		stallMin:    tune.stallMin,
		stallMax:    tune.stallMax,
		hold:        int64(tune.hold),
		held:        -1 << 62, // no hold before the first batch
		opened:      -1 << 62,
	}
	for i := range p.slots {
		p.wg.Go(func() { p.dispatch(i) })
	}
	return p
}

// run makes one script call and returns its reply: at once when a slot is
// open (see openLocked) and nothing is queued, else queued for a
// dispatcher's next batch. A queued call returns context.DeadlineExceeded
// once by (zero: none) has passed, and ErrClosed when its pipeline closes
// first; in each case the call may still run on Redis (and be recorded),
// as any call cut by a timeout may. A queued call without by (or whose ctx
// ends first) returns ctx's error as soon as ctx is done. A queued call
// with by does not watch ctx: a cancellation of ctx before by is seen only
// by the dispatcher, which drops the call if it is still queued (the caller
// gave up; it returns at its reply, the drop or by, whichever is first).
//
// by is a deadline the pipeline keeps without a context or a timer of the
// caller's own (a Budget's, one per check, would cost a timer, a context
// and a registration with the caller's context on every check): the calls
// whose by falls within the same tick (tickRes) are expired together at its
// end, so a caller returns one tick after by at most, plus the timer's own
// lateness. A call sent on its own gets a context with by.
func (p *autoPipeline) run(ctx context.Context, by time.Time, keys []string, args []any) ([]any, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	deadline, _ := ctx.Deadline()
	own := !by.IsZero() && (deadline.IsZero() || by.Before(deadline))
	if own {
		deadline = by
	}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil, window.ErrClosed
	}
	if len(p.queue) == 0 && !p.alwaysQueue {
		if now := p.since(); p.openLocked(now) {
			p.sendLocked(now)
			p.mu.Unlock()
			ectx := ctx
			if own {
				var cancel context.CancelFunc
				ectx, cancel = context.WithDeadline(ctx, by)
				defer cancel()
			}
			res, err := p.script.eval(ectx, p.client, keys, args)
			p.release(now, 1, -1)
			return res, err
		}
	}
	c := p.calls.Get().(*pipelineCall)
	c.gen++
	c.state.Store(c.gen << 1)
	c.keys, c.args, c.deadline, c.gone = keys, args, deadline, ctx.Done()
	if p.window > 0 && len(p.queue) == 0 && len(p.sends) == 0 {
		p.opened = p.since()
	}
	p.queue = append(p.queue, c)
	if own {
		p.tickLocked(by, callRef{c, c.gen})
	}
	// The first queued call wakes a dispatcher; the ones behind it join its
	// batch (a dispatcher takes the whole queue; what maxPipelineBatch
	// leaves wakes another while a slot is free, else the end of a call in
	// flight does), so they need not wake one each. The call that makes
	// holdN (or, in a batch window, maxPipelineBatch) queued wakes one
	// too: it ends the hold or the window.
	first := len(p.queue) == 1 || len(p.queue) == p.holdN || p.window > 0 && len(p.queue) == maxPipelineBatch
	p.mu.Unlock()
	if first {
		p.signal()
	}
	if !own && c.gone != nil {
		// No deadline of the pipeline's own: the caller's context ends the
		// wait (a channel of this caller's, not shared).
		select {
		case <-c.done:
		case <-c.gone:
			return nil, ctx.Err() // c is left to the garbage collector
		}
	} else {
		<-c.done
	}
	res, err := c.res, c.err
	if c.recycle {
		c.keys, c.args, c.deadline, c.gone, c.res, c.err, c.recycle = nil, nil, time.Time{}, nil, nil, nil, false
		p.calls.Put(c)
	}
	if err == errAbandoned {
		return nil, abandoned(ctx, own)
	}
	return res, err
}

// abandoned is the error of a call whose deadline passed before its reply
// (expired at its tick, or taken off the queue unsent):
// context.DeadlineExceeded for the pipeline's own deadline (own), else
// ctx's error. A deadline of ctx's own may have passed
// a moment before ctx's timer fires: abandoned waits for it, so that the
// layers above see the caller's own deadline (ctx.Err() set, which the
// Breaker does not count against Redis) and not a timeout of Redis's.
func abandoned(ctx context.Context, own bool) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if own {
		return context.DeadlineExceeded
	}
	<-ctx.Done() // its deadline has passed: at once
	return ctx.Err()
}

// tickRes is the resolution of the deadlines the pipeline keeps (run's
// by): a caller waiting for a batch returns at most this long after its by
// (plus the timer's lateness). One timer per tick in use replaces one per
// call.
const tickRes = 500 * time.Microsecond

// tickLocked has call expire at the first tick (a multiple of tickRes since
// p.epoch) at or after by, unless it is finished first.
func (p *autoPipeline) tickLocked(by time.Time, call callRef) {
	n := (int64(by.Sub(p.epoch)) + int64(tickRes) - 1) / int64(tickRes)
	refs, ok := p.ticks[n]
	p.ticks[n] = append(refs, call)
	if ok {
		return
	}
	time.AfterFunc(time.Until(p.epoch.Add(time.Duration(n)*tickRes)), func() {
		p.mu.Lock()
		refs := p.ticks[n]
		delete(p.ticks, n)
		p.mu.Unlock()
		for _, r := range refs {
			r.c.finish(r.gen, nil, errAbandoned, false)
		}
	})
}

// errAbandoned finishes a queued call whose deadline passed (at its tick),
// or whose caller gave up, before its reply; run returns the deadline's
// error instead.
var errAbandoned = errors.New("window: abandoned before it was sent")

// isDone reports whether ch (a ctx.Done(); nil for a context that never
// ends) is closed.
func isDone(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// since returns the monotonic time in ns since p.epoch.
func (p *autoPipeline) since() int64 { return int64(time.Since(p.epoch)) }

// stallLocked is how long the newest call in flight must have been out for
// another slot to open: twice the smoothed round trip, within
// [minStall, maxStall].
func (p *autoPipeline) stallLocked() int64 {
	return min(max(2*p.srtt, int64(p.stallMin)), int64(p.stallMax))
}

// newestLocked is when the newest call in flight was sent; one must be.
func (p *autoPipeline) newestLocked() int64 {
	return slices.Max(p.sends)
}

// openLocked reports whether a call may go out at now: none is in flight
// and neither the hold nor the batch window keeps it, or a slot is free and
// either the newest call in flight has stalled or the last batch carried
// one call (queueing behind a call in flight did not batch: it only
// delayed).
func (p *autoPipeline) openLocked(now int64) bool {
	busy := len(p.sends)
	if busy == 0 {
		return !p.holdingLocked(now) && !p.windowingLocked(now)
	}
	return busy < p.slots && (p.lone || now-p.newestLocked() >= p.stallLocked())
}

// holdingLocked reports whether the hold keeps calls at now: it has not
// run its time and fewer than holdN calls are queued.
func (p *autoPipeline) holdingLocked(now int64) bool {
	return now-p.held < p.hold && len(p.queue) < p.holdN
}

// windowingLocked reports whether the batch window keeps calls at now: it
// has not run its time and fewer than maxPipelineBatch calls are queued.
func (p *autoPipeline) windowingLocked(now int64) bool {
	return now-p.opened < p.window && len(p.queue) < maxPipelineBatch
}

// waitLocked is how long from now until openLocked turns true by itself,
// with calls queued and none able to go out: when none is in flight, the
// later end of the hold and the batch window among those that keep calls;
// else the newest call's stall.
func (p *autoPipeline) waitLocked(now int64) time.Duration {
	if len(p.sends) == 0 {
		end := now
		if p.holdingLocked(now) {
			end = p.held + p.hold
		}
		if p.windowingLocked(now) {
			end = max(end, p.opened+p.window)
		}
		return time.Duration(end - now)
	}
	return time.Duration(p.newestLocked() + p.stallLocked() - now)
}

// sendLocked takes a slot for a call sent at now.
func (p *autoPipeline) sendLocked(now int64) {
	p.sends = append(p.sends, now)
}

// unsendLocked gives back the slot of the call sent at sent.
func (p *autoPipeline) unsendLocked(sent int64) {
	if i := slices.Index(p.sends, sent); i >= 0 {
		p.sends = slices.Delete(p.sends, i, i+1)
	}
}

// release frees the slot of a call of n requests sent at sent, folds its
// duration into the smoothed round trip and, for a call of holdMin or more,
// starts the hold. slot is the dispatcher whose batch landed, or -1 for a
// call sent from its caller's goroutine, which wakes a dispatcher if calls
// are queued (a dispatcher's own call needs none: it takes the queue next).
func (p *autoPipeline) release(sent int64, n int, slot int) {
	end := p.since()
	took := end - sent
	p.mu.Lock()
	if slot >= 0 {
		p.flying[slot] = nil
	}
	if n >= holdMin {
		p.held, p.holdN = end, n
	}
	p.unsendLocked(sent)
	if p.srtt == 0 {
		p.srtt = max(took, 1)
	} else {
		p.srtt = max(p.srtt+(took-p.srtt)/8, 1)
	}
	queued := len(p.queue) > 0
	p.mu.Unlock()
	if slot < 0 && queued {
		p.signal()
	}
}

// signal wakes one idle dispatcher, if none has been woken yet.
func (p *autoPipeline) signal() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// dispatch is dispatcher i: it sends the queued calls in batches, each on a
// slot, until close.
func (p *autoPipeline) dispatch(i int) {
	batch := make([]*pipelineCall, 0, maxPipelineBatch)
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	for {
		var (
			ok   bool
			wait time.Duration
			sent int64
		)
		batch, sent, wait, ok = p.take(i, batch[:0])
		if !ok {
			return
		}
		if len(batch) == 0 {
			var stalled <-chan time.Time
			if wait > 0 {
				// Calls are queued behind the hold or a call in flight: a
				// slot opens when the hold ends or the call stalls, unless
				// the call ends first (a wake).
				timer.Reset(wait)
				stalled = timer.C
			}
			select {
			case <-p.wake:
			case <-stalled:
			case <-p.stop:
				return
			}
			timer.Stop()
			continue
		}
		p.send(batch)
		p.release(sent, len(batch), i)
		clear(batch) // let finished calls be collected
	}
}

// take takes a slot and appends up to maxPipelineBatch queued calls to
// batch, oldest first, and wakes another dispatcher when calls remain and
// slots are free; sent is when (p.since). It appends nothing (and takes no
// slot) when nothing is queued or no slot is open; wait is then how long
// until one opens by itself (the hold ends, or the call in flight stalls;
// 0: none will, a call's end wakes the dispatchers). ok is false once closed.
func (p *autoPipeline) take(i int, batch []*pipelineCall) (_ []*pipelineCall, sent int64, wait time.Duration, ok bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return batch, 0, 0, false
	}
	if len(p.queue) == 0 || len(p.sends) >= p.slots {
		return batch, 0, 0, true
	}
	now := p.since()
	if !p.openLocked(now) {
		return batch, 0, p.waitLocked(now), true
	}
	p.sendLocked(now)
	// Calls whose caller already gave up (its deadline passed while queued)
	// are completed here, never sent: sending them would record requests
	// that the failure mode has already answered.
	wall := time.Now()
	n := 0
	for n < len(p.queue) && len(batch) < maxPipelineBatch {
		c := p.queue[n]
		n++
		if c.finished() {
			continue // its tick expired it
		}
		if isDone(c.gone) || !c.deadline.IsZero() && !wall.Before(c.deadline) {
			c.finish(c.gen, nil, errAbandoned, true)
			continue
		}
		batch = append(batch, c)
	}
	rest := copy(p.queue, p.queue[n:])
	clear(p.queue[rest:])
	p.queue = p.queue[:rest]
	p.opened = -1 << 62 // the window closed with this batch
	if len(batch) == 0 {
		// Everything taken was abandoned: give the slot back.
		p.unsendLocked(now)
		return batch, 0, 0, true
	}
	p.lone = len(batch) == 1
	if rest > 0 && len(p.sends) < p.slots {
		p.signal()
	}
	p.flying[i] = batch
	return batch, now, 0, true
}

// send runs batch as one script call and completes every call with its
// share of the reply. A connection error or timeout is every call's error.
// An error reply of the script (a key of another type, say, or Redis out
// of memory) is retried as one call per request, so that each request gets
// its own outcome: member ids make the repeat of a request the failed call
// had decided harmless.
func (p *autoPipeline) send(batch []*pipelineCall) {
	deadline := time.Now().Add(pipelineTimeout)
	if d := latestDeadline(batch); !d.IsZero() {
		deadline = d
	}
	ctx, cancel := context.WithDeadline(p.ctx, deadline)
	defer cancel()

	if len(batch) == 1 {
		c := batch[0]
		res, err := p.script.eval(ctx, p.client, c.keys, c.args)
		c.finish(c.gen, res, err, true)
		return
	}
	nkeys, nargs := 0, 0
	for _, c := range batch {
		nkeys += len(c.keys)
		nargs += len(c.args)
	}
	keys, args := make([]string, 0, nkeys), make([]any, 0, nargs)
	for _, c := range batch {
		keys = append(keys, c.keys...)
		args = append(args, c.args...)
	}
	res, err := p.script.eval(ctx, p.client, keys, args)
	var rerr redis.Error
	if errors.As(err, &rerr) {
		p.sendEach(ctx, batch)
		return
	}
	off := 0
	for _, c := range batch {
		n := replyLen(len(c.keys))
		switch {
		case err != nil:
			c.finish(c.gen, nil, err, true)
		case off+n > len(res):
			c.finish(c.gen, nil, fmt.Errorf("redis pipeline: the script replied %d values for a batch needing more", len(res)), true)
		default:
			c.finish(c.gen, res[off:off+n:off+n], nil, true)
		}
		off += n
	}
}

// sendEach runs every call of batch as a script call of its own, together
// in one go-redis pipeline, and completes them.
func (p *autoPipeline) sendEach(ctx context.Context, batch []*pipelineCall) {
	calls := make([]scriptCall, len(batch))
	for i, c := range batch {
		calls[i] = scriptCall{keys: c.keys, args: c.args}
	}
	for i, cmd := range p.script.evalEach(ctx, p.client, calls) {
		res, err := cmd.Slice()
		batch[i].finish(batch[i].gen, res, err, true)
	}
}

// latestDeadline returns the latest deadline of the calls, or zero when some
// call has none.
func latestDeadline(batch []*pipelineCall) time.Time {
	var latest time.Time
	for _, c := range batch {
		if c.deadline.IsZero() {
			return time.Time{}
		}
		if c.deadline.After(latest) {
			latest = c.deadline
		}
	}
	return latest
}

// close stops the dispatchers: queued calls and the callers waiting on
// batches in flight get ErrClosed at once; calls sent on their own finish as
// they would without auto-pipelining. close returns when every dispatcher
// has returned (a batch in flight is cancelled, and ends at the latest at
// its deadline). It is safe to call more than once.
func (p *autoPipeline) close() {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		p.wg.Wait()
		return
	}
	p.closed = true
	queued := p.queue
	p.queue = nil
	var flying []callRef
	for _, b := range p.flying {
		for _, c := range b {
			flying = append(flying, callRef{c, c.gen})
		}
	}
	p.mu.Unlock()
	close(p.stop)
	p.cancel()
	for _, c := range queued {
		c.finish(c.gen, nil, window.ErrClosed, true)
	}
	for _, r := range flying {
		r.c.finish(r.gen, nil, window.ErrClosed, false)
	}
	p.wg.Wait()
}
