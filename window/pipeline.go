package window

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// ErrClosed is returned by [Redis.Decide] after [Redis.Close], and to callers
// whose decision was queued or in flight on an auto-pipeline when it closed.
var ErrClosed = errors.New("window: the limiter is closed")

// DefaultPipelineWorkers is how many round trips an auto-pipelining [Redis]
// keeps in flight at most when RedisOptions.PipelineWorkers is 0.
const DefaultPipelineWorkers = 2

// maxPipelineBatch caps the script calls sent in one auto-pipelined round
// trip: a batch of 3-key scripts then keeps Redis busy for a few ms at most.
const maxPipelineBatch = 128

// pipelineTimeout bounds an auto-pipelined round trip for the callers whose
// context has no deadline (the client's own read and write timeouts apply
// too). Callers with a deadline bound it by the latest of theirs.
const pipelineTimeout = 2 * time.Second

// autoPipeline batches the script calls of concurrent decisions into shared
// round trips, in the manner of rueidis. At most slots round trips are in
// flight. A call that finds a free slot and nothing queued goes out at once
// from its caller's goroutine, exactly as without auto-pipelining (so a lone
// call pays nothing). Otherwise it is queued, and each of slots dispatcher
// goroutines, when a slot frees, takes everything queued (up to
// maxPipelineBatch), sends it as one go-redis pipeline of EVALSHA commands,
// and hands each caller its own reply. No timer: a batch forms from the calls
// that arrived while all slots were busy.
//
// Each call stays one script call of its own (its own member id), so
// exactness, all-or-nothing and idempotency are those of an unbatched call.
// autoPipeline is safe for concurrent use.
type autoPipeline struct {
	client rediser
	script *redis.Script // for calls sent on their own
	src    string        // the script
	hash   string        // its SHA-1
	slots  int           // round trips in flight at most; also the dispatchers
	wake   chan struct{} // capacity 1: tells an idle dispatcher there is work
	stop   chan struct{} // closed by close
	ctx    context.Context
	cancel context.CancelFunc // cancels ctx, the parent of every pipeline's context
	wg     sync.WaitGroup     // the dispatchers

	// alwaysQueue sends every call through the dispatchers, never on its
	// own; set only by tests, before the first call, so that sequential
	// tests exercise the batching path.
	alwaysQueue bool

	// mu guards the fields below.
	mu     sync.Mutex
	queue  []*pipelineCall
	busy   int // round trips in flight (batches and calls sent on their own)
	closed bool
}

// pipelineCall is one queued script call and, once done is closed, its reply.
type pipelineCall struct {
	keys     []string
	args     []any
	deadline time.Time       // zero: the caller's context has none
	gone     <-chan struct{} // the caller's ctx.Done(): closed once it gave up
	done     chan struct{}   // closed by the dispatcher after it set res and err
	res      []any
	err      error
}

// newAutoPipeline starts slots dispatchers of the script src on client.
func newAutoPipeline(client rediser, src string, slots int) *autoPipeline {
	ctx, cancel := context.WithCancel(context.Background())
	p := &autoPipeline{
		client: client,
		script: redis.NewScript(src),
		src:    src,
		slots:  slots,
		wake:   make(chan struct{}, 1),
		stop:   make(chan struct{}),
		ctx:    ctx,
		cancel: cancel,
	}
	p.hash = p.script.Hash()
	for range slots {
		p.wg.Go(p.dispatch)
	}
	return p
}

// run makes one script call and returns its reply: at once when a slot is
// free and nothing is queued, else queued for a dispatcher's next batch. It
// returns ctx's error as soon as ctx is done, and ErrClosed when a queued
// call's pipeline closes first; in both cases the call may still run on
// Redis (and be recorded), as any call cut by a timeout may.
func (p *autoPipeline) run(ctx context.Context, keys []string, args []any) ([]any, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil, ErrClosed
	}
	if p.busy < p.slots && len(p.queue) == 0 && !p.alwaysQueue {
		p.busy++
		p.mu.Unlock()
		res, err := p.script.Run(ctx, p.client, keys, args...).Slice()
		p.release()
		return res, err
	}
	c := &pipelineCall{keys: keys, args: args, gone: ctx.Done(), done: make(chan struct{})}
	c.deadline, _ = ctx.Deadline()
	p.queue = append(p.queue, c)
	p.mu.Unlock()
	p.signal()
	select {
	case <-c.done:
		return c.res, c.err
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-p.stop:
		select {
		case <-c.done: // a reply that arrived together with close wins
			return c.res, c.err
		default:
			return nil, ErrClosed
		}
	}
}

// errAbandoned completes a queued call whose caller gave up before it was
// sent; nobody reads it.
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

// release frees a slot and wakes a dispatcher if calls are queued.
func (p *autoPipeline) release() {
	p.mu.Lock()
	p.busy--
	queued := len(p.queue) > 0
	p.mu.Unlock()
	if queued {
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

// dispatch is one dispatcher: it sends the queued calls in batches, each
// on a slot, until close.
func (p *autoPipeline) dispatch() {
	batch := make([]*pipelineCall, 0, maxPipelineBatch)
	for {
		var ok bool
		batch, ok = p.take(batch[:0])
		if !ok {
			return
		}
		if len(batch) == 0 {
			select {
			case <-p.wake:
			case <-p.stop:
				return
			}
			continue
		}
		p.send(batch)
		clear(batch) // let finished calls be collected
		p.release()
	}
}

// take takes a slot and appends up to maxPipelineBatch queued calls to
// batch, oldest first, and wakes another dispatcher when calls remain and
// slots are free. It appends nothing (and takes no slot) when nothing is
// queued or no slot is free. ok is false once closed.
func (p *autoPipeline) take(batch []*pipelineCall) (_ []*pipelineCall, ok bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return batch, false
	}
	if len(p.queue) == 0 || p.busy >= p.slots {
		return batch, true
	}
	p.busy++
	// Calls whose caller already gave up (its deadline passed while queued)
	// are completed here, never sent: sending them would record requests
	// that the failure mode has already answered.
	n := 0
	for n < len(p.queue) && len(batch) < maxPipelineBatch {
		c := p.queue[n]
		n++
		if isDone(c.gone) {
			c.err = errAbandoned
			close(c.done)
			continue
		}
		batch = append(batch, c)
	}
	rest := copy(p.queue, p.queue[n:])
	clear(p.queue[rest:])
	p.queue = p.queue[:rest]
	if len(batch) == 0 {
		// Everything taken was abandoned: give the slot back.
		p.busy--
		return batch, true
	}
	if rest > 0 && p.busy < p.slots {
		p.signal()
	}
	return batch, true
}

// send runs batch as one pipeline of EVALSHA commands and completes every
// call. Calls that met NOSCRIPT (an empty script cache after a restart or
// failover) run again after SCRIPT LOAD in a second pipeline: their member
// ids make a repeat harmless. An error of the whole pipeline (connection,
// timeout) is every call's error.
func (p *autoPipeline) send(batch []*pipelineCall) {
	deadline := time.Now().Add(pipelineTimeout)
	if d := latestDeadline(batch); !d.IsZero() {
		deadline = d
	}
	ctx, cancel := context.WithDeadline(p.ctx, deadline)
	defer cancel()

	hash := p.hash
	cmds := make([]*redis.Cmd, len(batch))
	pipe := p.client.Pipeline()
	for i, c := range batch {
		cmds[i] = pipe.EvalSha(ctx, hash, c.keys, c.args...)
	}
	_, execErr := pipe.Exec(ctx)

	var retry redis.Pipeliner
	for i, cmd := range cmds {
		if !isNoScript(cmd.Err()) {
			continue
		}
		if retry == nil {
			retry = p.client.Pipeline()
			// Not redis.Script.Load: on a pipeline it would store the
			// empty reply it holds before Exec as the script's hash.
			retry.ScriptLoad(ctx, p.src)
		}
		cmds[i] = retry.EvalSha(ctx, hash, batch[i].keys, batch[i].args...)
	}
	if retry != nil {
		_, execErr = retry.Exec(ctx)
		// Where the load failed (an ACL that forbids SCRIPT LOAD, say), EVAL.
		var again redis.Pipeliner
		for i, cmd := range cmds {
			if isNoScript(cmd.Err()) {
				if again == nil {
					again = p.client.Pipeline()
				}
				cmds[i] = again.Eval(ctx, p.src, batch[i].keys, batch[i].args...)
			}
		}
		if again != nil {
			_, execErr = again.Exec(ctx)
		}
	}

	for i, c := range batch {
		c.res, c.err = cmds[i].Slice()
		if c.err == nil && c.res == nil {
			// Not expected from go-redis (it stamps a pipeline's error on
			// every command), but a caller must never see a reply of nothing.
			c.err = execErr
			if c.err == nil {
				c.err = errors.New("redis pipeline: no reply")
			}
		}
		close(c.done)
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
	p.mu.Unlock()
	close(p.stop)
	p.cancel()
	for _, c := range queued {
		c.err = ErrClosed
		close(c.done)
	}
	p.wg.Wait()
}
