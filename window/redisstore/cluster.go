package redisstore

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashgate/flashgate/window"
)

// crossSlotLua returns body (redis.lua) as a script that may touch keys of
// several slots of the node it runs on (Redis 7.0's allow-cross-slot-keys):
// a Redis Cluster refuses declared KEYS of different slots (CROSSSLOT), so
// the call declares one key, the first, for the node's slot check, and
// passes all of them at the head of ARGV: ARGV[1] is their count n,
// ARGV[2..n+1] the keys, the rest the arguments redis.lua takes. See
// clusterCall.
func crossSlotLua(body string) (string, error) {
	const (
		globals = "local call, argv, keys = redis.call, ARGV, KEYS\n"
		start   = "local a, k = 1, 0\n"
	)
	if strings.Count(body, globals) != 1 || strings.Count(body, start) != 1 {
		return "", errors.New("redis limiter: the script does not read KEYS and ARGV where the cross-slot variant expects")
	}
	body = strings.Replace(body, globals,
		"local call, argv = redis.call, ARGV\nlocal keys = { unpack(argv, 2, tonumber(argv[1]) + 1) }\n", 1)
	body = strings.Replace(body, start, "local a, k = #keys + 2, 0\n", 1)
	return "#!lua flags=allow-cross-slot-keys\n" + body, nil
}

// clusterCall maps a call of redis.lua's keys and args to the cross-slot
// variant's: one declared key, then ARGV = n, the n keys, args.
func clusterCall(keys []string, args []any) ([]string, []any) {
	a := make([]any, 0, 1+len(keys)+len(args))
	a = append(a, len(keys))
	for _, k := range keys {
		a = append(a, k)
	}
	return keys[:1], append(a, args...)
}

// nodePipes is a Cluster's auto-pipeline: one [autoPipeline] per master,
// each running the cross-slot script on that master's own connection pool,
// so that checks queued behind one master's call share its next call and a
// slow master holds up only the checks whose keys it serves. It is safe for
// concurrent use.
type nodePipes struct {
	cc     *redis.ClusterClient
	script *script // the cross-slot variant of redis.lua
	tune   pipelineTuning
	// off is set once a master refused the cross-slot script (Redis before
	// 7.0): decisions then go one script per key through cc.
	off atomic.Bool

	// byAddr holds each master's pipeline and the go-redis node client it
	// runs on (a node client go-redis replaced gets a new pipeline). Checks
	// read it without a lock; it is replaced whole, under mu, never changed.
	byAddr atomic.Pointer[map[string]nodePipe]
	// mu serializes the replacements of byAddr and guards closed.
	mu     sync.Mutex
	closed bool
	// replaced counts the closes of replaced pipelines under way; close
	// waits for them.
	replaced sync.WaitGroup

	// stop ends the pruning loop, done is closed when it has returned.
	stop context.CancelFunc
	done chan struct{}
}

type nodePipe struct {
	client *redis.Client
	pipe   *autoPipeline
}

// masterHold is the hold of a Cluster master's auto-pipeline: a master
// sees only its share of the checks, so the batch that starts a hold takes
// longer to queue again than on a standalone Redis (see doc.go).
const masterHold = 2 * time.Millisecond

// prunePeriod is how often the pipelines of addresses that left the slot
// map are closed (see prune).
const prunePeriod = 30 * time.Second

func newNodePipes(cc *redis.ClusterClient, body string, tune pipelineTuning) (*nodePipes, error) {
	s, err := newCrossSlotScript(body)
	if err != nil {
		return nil, err
	}
	ctx, stop := context.WithCancel(context.Background())
	n := &nodePipes{cc: cc, script: s, tune: tune, stop: stop, done: make(chan struct{})}
	n.byAddr.Store(&map[string]nodePipe{})
	go func() {
		defer close(n.done)
		every(ctx, prunePeriod, prunePeriod/2, func(ctx context.Context) {
			_ = n.prune(ctx) // the slot map could not be read: the next tick tries again
		})
	}()
	return n, nil
}

// prune closes the pipelines of the addresses that no longer serve slots as
// masters in the ClusterClient's slot map, which it reloads (a failover
// promoted another node, a master was emptied or removed), so that masters
// counts the live ones and no dispatcher outlives its master. A check still
// queued on a closed pipeline is decided again per key (misrouted).
func (n *nodePipes) prune(ctx context.Context) error {
	var (
		liveMu sync.Mutex
		live   = make(map[string]bool)
	)
	err := n.cc.ForEachMaster(ctx, func(_ context.Context, c *redis.Client) error {
		liveMu.Lock()
		live[c.Options().Addr] = true
		liveMu.Unlock()
		return nil
	})
	if err != nil {
		return fmt.Errorf("redis cluster masters: %w", err)
	}
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return nil
	}
	var gone []nodePipe
	kept := maps.Clone(*n.byAddr.Load())
	maps.DeleteFunc(kept, func(addr string, np nodePipe) bool {
		if !live[addr] {
			gone = append(gone, np)
		}
		return !live[addr]
	})
	if len(gone) > 0 {
		n.byAddr.Store(&kept)
	}
	n.mu.Unlock()
	for _, np := range gone {
		np.pipe.close()
	}
	return nil
}

// pipe returns the pipeline of key's master, as go-redis's slot map has it,
// and the master's address.
func (n *nodePipes) pipe(ctx context.Context, key string) (*autoPipeline, string, error) {
	c, err := n.cc.MasterForKey(ctx, key)
	if err != nil {
		return nil, "", fmt.Errorf("master of a key: %w", err)
	}
	addr := c.Options().Addr
	if np, ok := (*n.byAddr.Load())[addr]; ok && np.client == c {
		return np.pipe, addr, nil
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return nil, "", window.ErrClosed
	}
	pipes := *n.byAddr.Load()
	np, ok := pipes[addr]
	if ok && np.client == c {
		return np.pipe, addr, nil
	}
	if ok {
		n.replaced.Add(1)
		go func() { // its callers get ErrClosed and go per key
			defer n.replaced.Done()
			np.pipe.close()
		}()
	}
	np = nodePipe{client: c, pipe: newAutoPipeline(c, n.script, n.tune)}
	pipes = maps.Clone(pipes)
	pipes[addr] = np
	n.byAddr.Store(&pipes)
	return np.pipe, addr, nil
}

// masters returns how many masters have a pipeline: every address a check
// was sent to, less those prune found gone from the slot map.
func (n *nodePipes) masters() int {
	return len(*n.byAddr.Load())
}

// close stops the pruning and closes every master's pipeline, and waits
// for the pipelines replaced before to close.
func (n *nodePipes) close() {
	n.stop()
	<-n.done
	n.mu.Lock()
	n.closed = true
	pipes := *n.byAddr.Load()
	n.byAddr.Store(&map[string]nodePipe{})
	n.mu.Unlock()
	for _, np := range pipes {
		np.pipe.close()
	}
	n.replaced.Wait()
}

// misrouted reports whether err means that a call reached a master that
// does not (or no longer) serve one of its keys, or the script could not
// run there: the request is then decided again one key per script call
// through the ClusterClient, which follows MOVED and ASK. A closed node
// client (go-redis dropped the node) counts too; ErrClosed of a pipeline
// replaced by pipe does as well.
func misrouted(err error) bool {
	if errors.Is(err, redis.ErrClosed) || errors.Is(err, window.ErrClosed) {
		return true
	}
	var rerr redis.Error
	if !errors.As(err, &rerr) {
		return false
	}
	msg := rerr.Error()
	for _, p := range []string{"MOVED ", "ASK ", "TRYAGAIN", "CROSSSLOT"} {
		if strings.HasPrefix(msg, p) {
			return true
		}
	}
	return strings.Contains(msg, "non local key") || strings.Contains(msg, "same slot") || noCrossSlot(err)
}

// noCrossSlot reports whether err is a Redis before 7.0 refusing the
// cross-slot script's flags.
func noCrossSlot(err error) bool {
	var rerr redis.Error
	return errors.As(err, &rerr) && (strings.Contains(rerr.Error(), "compiling script") || strings.Contains(rerr.Error(), "Unexpected flag"))
}

// nodeGroup is the hits of one request that one master decides.
type nodeGroup struct {
	pipe *autoPipeline
	addr string // the master's
	idx  []int  // into the request's hits
	res  []any
	err  error
}

// decideNodes decides hits on a Cluster through the masters' pipelines:
// each master decides the hits whose keys it serves in one script call (a
// share of one), all or nothing; when one master denies or fails, the
// masters that admitted have the request's member removed (see doc.go). A
// request some master refuses as misrouted is decided again per key.
func (r *Redis) decideNodes(ctx context.Context, by time.Time, hits []window.Hit, member, now string, st []window.HitState) error {
	if r.nodes.off.Load() {
		return r.decidePerKeyBy(ctx, by, hits, member, now, st)
	}
	p, addr, err := r.nodes.pipe(ctx, hits[0].Key)
	if err != nil {
		if errors.Is(err, window.ErrClosed) {
			return fmt.Errorf("redis decide: %w", err)
		}
		return r.decidePerKeyBy(ctx, by, hits, member, now, st)
	}
	same := 1 // hits[:same] are on p's master
	for same < len(hits) {
		q, _, err := r.nodes.pipe(ctx, hits[same].Key)
		if err != nil || q != p {
			break
		}
		same++
	}
	if same == len(hits) {
		return r.decideOnMaster(ctx, by, p, addr, hits, member, now, st)
	}
	var gbuf [4]nodeGroup
	groups := append(gbuf[:0], nodeGroup{pipe: p, addr: addr, idx: make([]int, same, len(hits))})
	for i := range same {
		groups[0].idx[i] = i
	}
	for i := same; i < len(hits); i++ {
		p, addr, err := r.nodes.pipe(ctx, hits[i].Key)
		if err != nil {
			if errors.Is(err, window.ErrClosed) {
				return fmt.Errorf("redis decide: %w", err)
			}
			return r.decidePerKeyBy(ctx, by, hits, member, now, st)
		}
		g := 0
		for g < len(groups) && groups[g].pipe != p {
			g++
		}
		if g == len(groups) {
			groups = append(groups, nodeGroup{pipe: p, addr: addr})
		}
		groups[g].idx = append(groups[g].idx, i)
	}
	run := func(g *nodeGroup) {
		keys := make([]string, len(g.idx))
		args := make([]any, 0, 3+len(g.idx))
		args = append(args, member, now, len(g.idx))
		for j, i := range g.idx {
			keys[j] = hits[i].Key
			args = appendHitArgs(args, &hits[i])
		}
		g.res, g.err = g.pipe.run(ctx, by, keys, args)
	}
	if len(groups) == 1 {
		run(&groups[0])
	} else {
		var wg sync.WaitGroup
		for g := 1; g < len(groups); g++ {
			wg.Go(func() { run(&groups[g]) })
		}
		run(&groups[0])
		wg.Wait()
	}

	var (
		firstErr  error
		redo      bool
		deny      bool
		sub       [8]window.HitState
		subHits   [8]window.Hit
		admitted  = make([]bool, len(groups))
		groupHits []window.Hit
	)
	for gi := range groups {
		g := &groups[gi]
		err := g.err
		if err == nil {
			groupHits = subHits[:0]
			if len(g.idx) > len(subHits) {
				groupHits = make([]window.Hit, 0, len(g.idx))
			}
			for _, i := range g.idx {
				groupHits = append(groupHits, hits[i])
			}
			gst := sub[:0]
			if len(g.idx) > len(sub) {
				gst = make([]window.HitState, 0, len(g.idx))
			}
			gst = gst[:len(g.idx)]
			if err = parseReply(g.res, groupHits, gst); err != nil {
				g.err = err
			} else {
				admitted[gi] = true
				for j, i := range g.idx {
					st[i] = gst[j]
					if st[i].Over && !hits[i].Shadow {
						deny, admitted[gi] = true, false
					}
				}
				continue
			}
		}
		if misrouted(err) {
			redo = true
			if noCrossSlot(err) {
				r.nodes.off.Store(true)
			}
		}
		if firstErr == nil {
			firstErr = fmt.Errorf("redis decide: master %s: %w", g.addr, r.masterDown(err))
		}
	}
	if redo && !r.closed.Load() {
		// Another pass, per key: the masters that ran their part find the
		// member already recorded (member ids make it idempotent).
		r.nodes.cc.ReloadState(ctx)
		return r.decidePerKeyBy(ctx, by, hits, member, now, st)
	}
	if len(groups) == 1 || firstErr == nil && !deny {
		return firstErr
	}
	undo := make([]bool, len(hits))
	decided := make([]bool, len(hits))
	for gi := range groups {
		for _, i := range groups[gi].idx {
			decided[i] = groups[gi].err == nil
			undo[i] = groups[gi].err != nil || admitted[gi] && !st[i].Over
		}
	}
	r.compensate(ctx, hits, member, st, undo, decided)
	if deny {
		// A master said a key is full: that is the decision, whatever
		// another master's error (a failure mode must not admit it).
		return nil
	}
	return firstErr
}

// decideOnMaster is decideNodes for a request whose keys are all on one
// master, p (at addr): one call decides it, all or nothing, with nothing to
// remove unless the master refuses it as misrouted and it is decided again
// per key.
func (r *Redis) decideOnMaster(ctx context.Context, by time.Time, p *autoPipeline, addr string, hits []window.Hit, member, now string, st []window.HitState) error {
	keys, args := scriptArgs(hits, member, now)
	res, err := p.run(ctx, by, keys, args)
	if err == nil {
		if err = parseReply(res, hits, st); err == nil {
			return nil
		}
	}
	if misrouted(err) {
		if noCrossSlot(err) {
			r.nodes.off.Store(true)
		}
		if !r.closed.Load() {
			r.nodes.cc.ReloadState(ctx)
			return r.decidePerKeyBy(ctx, by, hits, member, now, st)
		}
	}
	return fmt.Errorf("redis decide: master %s: %w", addr, r.masterDown(err))
}

// masterDown marks err with ErrMasterDown if it is a connection error of
// one master of an auto-pipelined Cluster whose store knows other masters
// (see doc.go); else it returns err, classified.
func (r *Redis) masterDown(err error) error {
	err = classified(err)
	if r.nodes == nil || window.Classify(err) != window.KindConnection || r.nodes.masters() < 2 {
		return err
	}
	return fmt.Errorf("%w: %w", ErrMasterDown, err)
}

// decidePerKeyBy is decidePerKey within by (zero: none).
func (r *Redis) decidePerKeyBy(ctx context.Context, by time.Time, hits []window.Hit, member, now string, st []window.HitState) error {
	if !by.IsZero() {
		cctx, cancel := context.WithDeadline(ctx, by)
		defer cancel()
		ctx = cctx
	}
	return r.decidePerKey(ctx, hits, member, now, st)
}
