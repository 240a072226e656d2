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

// DefaultPipelineWorkers is how many auto-pipelines a [Redis] keeps in flight
// at most when RedisOptions.PipelineWorkers is 0.
const DefaultPipelineWorkers = 2

// maxPipelineBatch caps the script calls sent in one auto-pipelined round
// trip: a batch of 3-key scripts then keeps Redis busy for a few ms at most.
const maxPipelineBatch = 128

// pipelineTimeout bounds an auto-pipelined round trip for the callers whose
// context has no deadline (the client's own read and write timeouts apply
// too). Callers with a deadline bound it by the latest of theirs.
const pipelineTimeout = 2 * time.Second

// autoPipeline batches the script calls of concurrent decisions into shared
// round trips, in the manner of rueidis: callers queue their call; each of a
// few dispatcher goroutines takes everything queued (up to maxPipelineBatch),
// sends it as one go-redis pipeline of EVALSHA commands, and hands each caller
// its own reply. No timer: a batch forms from the calls that arrived while the
// dispatchers were busy, so a lone call goes out at once.
//
// Each call stays one script call of its own (its own member id), so
// exactness, all-or-nothing and idempotency are those of an unbatched call.
// autoPipeline is safe for concurrent use.
type autoPipeline struct {
	client rediser
	src    string        // the script
	hash   string        // its SHA-1
	wake   chan struct{} // capacity 1: tells an idle dispatcher there is work
	stop   chan struct{} // closed by close
	ctx    context.Context
	cancel context.CancelFunc // cancels ctx, the parent of every pipeline's context
	wg     sync.WaitGroup     // the dispatchers

	// mu guards queue and closed.
	mu     sync.Mutex
	queue  []*pipelineCall
	closed bool
}

// pipelineCall is one queued script call and, once done is closed, its reply.
type pipelineCall struct {
	keys     []string
	args     []any
	deadline time.Time     // zero: the caller's context has none
	done     chan struct{} // closed by the dispatcher after it set res and err
	res      []any
	err      error
}

// newAutoPipeline starts workers dispatchers on client.
func newAutoPipeline(client rediser, src, hash string, workers int) *autoPipeline {
	ctx, cancel := context.WithCancel(context.Background())
	p := &autoPipeline{
		client: client,
		src:    src,
		hash:   hash,
		wake:   make(chan struct{}, 1),
		stop:   make(chan struct{}),
		ctx:    ctx,
		cancel: cancel,
	}
	for range workers {
		p.wg.Go(p.dispatch)
	}
	return p
}

// run queues one script call and waits for its reply. It returns ctx's error
// as soon as ctx is done, and ErrClosed when the pipeline closes first; in
// both cases the call may still run on Redis (and be recorded), as any call
// cut by a timeout may.
func (p *autoPipeline) run(ctx context.Context, keys []string, args []any) ([]any, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	c := &pipelineCall{keys: keys, args: args, done: make(chan struct{})}
	c.deadline, _ = ctx.Deadline()
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil, ErrClosed
	}
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

// signal wakes one idle dispatcher, if none has been woken yet.
func (p *autoPipeline) signal() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// dispatch is one dispatcher: it sends the queued calls in batches until
// close.
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
	}
}

// take appends up to maxPipelineBatch queued calls to batch, oldest first,
// and wakes another dispatcher when calls remain. ok is false once closed.
func (p *autoPipeline) take(batch []*pipelineCall) (_ []*pipelineCall, ok bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return batch, false
	}
	n := min(len(p.queue), maxPipelineBatch)
	batch = append(batch, p.queue[:n]...)
	rest := copy(p.queue, p.queue[n:])
	clear(p.queue[rest:])
	p.queue = p.queue[:rest]
	if rest > 0 {
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

// close stops the dispatchers: queued calls and the callers waiting on calls
// in flight get ErrClosed at once; close returns when every dispatcher has
// returned (a pipeline in flight is cancelled, and ends at the latest at its
// deadline). It is safe to call more than once.
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
