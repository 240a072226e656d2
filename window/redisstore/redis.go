package redisstore

import (
	"context"
	"crypto/rand"
	_ "embed"
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashgate/flashgate/window"
)

//go:embed redis.lua
var slidingLua string

// Clock chooses where a [Redis] store takes the time of a decision.
type Clock uint8

const (
	// ClockRedis takes the time from Redis TIME inside the script, so that
	// sidecars' clocks cannot skew the window. The default.
	ClockRedis Clock = iota
	// ClockLocal takes the time from Options.Now and passes it to the
	// script, for a Redis that forbids TIME in scripts. Stores sharing a
	// Redis must then have synchronised clocks: a skewed clock can over-admit.
	ClockLocal
)

// String returns "redis" or "local".
func (c Clock) String() string {
	if c == ClockLocal {
		return "local"
	}
	return "redis"
}

// IdempotencyHorizon is how long a bucketed key remembers the member ids of
// the requests it admitted (redis.lua's HORIZON): a retried script call
// within it is not counted twice.
const IdempotencyHorizon = 5 * time.Second

// compensateTimeout bounds the ZREM that undoes a partial admission on a
// Redis Cluster; it runs even when the request's context is done.
const compensateTimeout = time.Second

// Options configures [New]. The zero value is valid: Redis clock, no
// auto-pipeline.
type Options struct {
	// Clock: ClockRedis (default) or ClockLocal.
	Clock Clock
	// Now is the local clock for ClockLocal; nil means time.Now. It is
	// ignored on ClockRedis.
	Now func() time.Time
	// AutoPipeline decides concurrent decisions together on standalone and
	// Sentinel Redis: the decisions that queued while a round trip was in
	// flight go out as one script call, which decides each all or nothing
	// with its own member id (see doc.go). On a Cluster each master has its
	// own, and a request's keys on one master are decided in one call (it
	// needs Redis 7.0; an older Cluster is decided per key). It starts
	// goroutines: call [Redis.Close]. Ignored on a Ring.
	AutoPipeline bool
	// BatchWindow, with AutoPipeline, holds a decision that finds its
	// pipeline idle (no call in flight, none queued) for up to this long,
	// at most [MaxBatchWindow], so that the ones arriving meanwhile share
	// its call: latency for fewer script calls where a sidecar sends too
	// few decisions at a time to batch. A hold still running after a batch
	// (see doc.go) ends the window no earlier. 0 (the default) sends such
	// a decision at once. Ignored without AutoPipeline and on a Ring.
	BatchWindow time.Duration
}

// MaxBatchWindow bounds [Options.BatchWindow].
const MaxBatchWindow = 5 * time.Millisecond

// Client is what a [Redis] store needs of a go-redis client:
// *redis.Client, *redis.ClusterClient, *redis.Ring and every
// redis.UniversalClient fit.
type Client interface {
	redis.Scripter
	Pipeline() redis.Pipeliner
	Ping(ctx context.Context) *redis.StatusCmd
}

// Redis is a [window.Limiter] on Redis sorted sets: one per key, one entry
// per admitted request scored by its admission time in microseconds. A
// decision is one script call over all keys on standalone and Sentinel
// Redis; on a Cluster one per master holding its keys when auto-pipelined,
// else one per key, with compensation across calls (see doc.go for the
// guarantees of each). Redis is safe for concurrent use.
// Close it when done; it does not close the client.
type Redis struct {
	client  Client
	script  *script          // the decision's (redis.lua)
	restore *script          // the write-back's (restoreLua)
	lease   *script          // the leases' (lease.lua)
	perKey  bool             // one script per key, pipelined (Cluster, Ring)
	local   bool             // ClockLocal: now is passed to the script
	now     func() time.Time // the local clock
	pipe    *autoPipeline    // nil unless auto-pipelining standalone or Sentinel
	nodes   *nodePipes       // nil unless auto-pipelining a Cluster
	closed  atomic.Bool      // set by Close

	idPrefix [8]byte       // random, drawn once: the member ids' prefix
	idNext   atomic.Uint64 // the member ids' counter
}

var _ window.Limiter = (*Redis)(nil)

// New returns a store on client. It does not contact Redis; see
// [Redis.Ping] and [Redis.Warm].
func New(client Client, opts Options) (*Redis, error) {
	return newRedis(client, opts, nil)
}

// newRedis is New with the auto-pipeline's tuning, the default for client,
// changed by adjust when it is not nil (tests pass one).
func newRedis(client Client, opts Options, adjust func(*pipelineTuning)) (*Redis, error) {
	if client == nil {
		return nil, errors.New("redis limiter: the client is nil")
	}
	switch opts.Clock {
	case ClockRedis, ClockLocal:
	default:
		return nil, fmt.Errorf("redis limiter: unknown clock %d", opts.Clock)
	}
	if opts.BatchWindow < 0 || opts.BatchWindow > MaxBatchWindow {
		return nil, fmt.Errorf("redis limiter: batch window %s: want 0 to %s", opts.BatchWindow, MaxBatchWindow)
	}
	tune := defaultTuning
	if _, ok := client.(*redis.ClusterClient); ok {
		tune.hold = masterHold
	}
	tune.window = opts.BatchWindow
	if adjust != nil {
		adjust(&tune)
	}
	if tune.workers < 1 {
		return nil, fmt.Errorf("redis limiter: %d pipeline workers: want at least 1", tune.workers)
	}
	r := &Redis{
		client:  client,
		script:  newScript(slidingLua),
		restore: newScript(restoreLua),
		lease:   newScript(leaseLua),
		local:   opts.Clock == ClockLocal,
		now:     opts.Now,
	}
	switch client.(type) {
	case *redis.ClusterClient, *redis.Ring:
		r.perKey = true
	}
	if r.now == nil {
		r.now = time.Now
	}
	var err error
	if _, err = rand.Read(r.idPrefix[:]); err != nil {
		return nil, fmt.Errorf("redis limiter: draw a member id prefix: %w", err)
	}
	r.idPrefix[0] |= 0x80 // never NUL (a bucketed key's counters) nor 0x01 (written-back admissions)
	if opts.AutoPipeline {
		switch cc := client.(type) {
		case *redis.ClusterClient:
			if r.nodes, err = newNodePipes(cc, slidingLua, tune); err != nil {
				return nil, err
			}
		case *redis.Ring:
		default:
			r.pipe = newAutoPipeline(r.client, r.script, tune)
		}
	}
	return r, nil
}

// Close stops the auto-pipeline's goroutines, if any: decisions queued or
// waiting on a batch in flight return window.ErrClosed at once (one in
// flight may still be recorded), and Close returns when the goroutines have
// ended. Decide after Close returns window.ErrClosed. Close does not close
// the client. It is safe to call more than once and concurrently with
// Decide.
func (r *Redis) Close() {
	r.closed.Store(true)
	if r.pipe != nil {
		r.pipe.close()
	}
	if r.nodes != nil {
		r.nodes.close()
	}
}

// truncID is a member id cut to 32 bytes for an error message.
func truncID(m string) string {
	if len(m) > 32 {
		return m[:32] + "…"
	}
	return m
}

// member returns a new request member id: the store's random prefix
// followed by a uvarint counter.
func (r *Redis) member() string {
	var b [8 + binary.MaxVarintLen64]byte
	copy(b[:], r.idPrefix[:])
	n := binary.PutUvarint(b[8:], r.idNext.Add(1))
	return string(b[:8+n])
}

// Ping checks that Redis answers.
func (r *Redis) Ping(ctx context.Context) error {
	if err := r.client.Ping(ctx).Err(); err != nil {
		return fmt.Errorf("redis ping: %w", classified(err))
	}
	return nil
}

// Warm readies the store for a burst before it is put in service: it loads
// the script (best effort: on a Cluster SCRIPT LOAD fails while any node
// does not answer, and a node without the script gets it on the first
// NOSCRIPT) and opens conns connections at once (concurrent PINGs), which
// the client keeps open (ClientConfig.MinIdleConns). Call it with a
// deadline; it returns the first PING's error.
func (r *Redis) Warm(ctx context.Context, conns int) error {
	_ = r.client.ScriptLoad(ctx, slidingLua).Err()
	if r.nodes != nil {
		_ = r.client.ScriptLoad(ctx, r.nodes.script.body).Err()
	}
	errs := make(chan error, max(conns, 1))
	for range max(conns, 1) {
		go func() { errs <- r.client.Ping(ctx).Err() }()
	}
	var first error
	for range max(conns, 1) {
		if err := <-errs; err != nil && first == nil {
			first = fmt.Errorf("redis warm-up: ping: %w", classified(err))
		}
	}
	return first
}

// Decide implements [window.Limiter]: all hits of one request together,
// all or nothing, with a fresh member id.
func (r *Redis) Decide(ctx context.Context, hits []window.Hit) (window.Decision, error) {
	return r.decide(ctx, time.Time{}, hits, r.memberFor(ctx))
}

// DecideBy is Decide with a deadline by besides ctx's (zero: none). With
// an auto-pipeline the pipeline keeps it, without a context or timer per
// call; otherwise it is a deadline in ctx. It implements
// guard.DeadlineLimiter.
func (r *Redis) DecideBy(ctx context.Context, by time.Time, hits []window.Hit) (window.Decision, error) {
	if r.pipe == nil && r.nodes == nil && !by.IsZero() {
		cctx, cancel := context.WithDeadline(ctx, by)
		defer cancel()
		return r.decide(cctx, time.Time{}, hits, r.memberFor(ctx))
	}
	return r.decide(ctx, by, hits, r.memberFor(ctx))
}

// decide decides hits as request member, within by (zero: none) when
// auto-pipelined.
func (r *Redis) decide(ctx context.Context, by time.Time, hits []window.Hit, member string) (window.Decision, error) {
	if err := window.ValidateHits(hits); err != nil {
		return window.Decision{}, err
	}
	if len(hits) == 0 {
		return window.Resolve(nil, nil), nil
	}
	if r.closed.Load() {
		return window.Decision{}, fmt.Errorf("redis decide: %w", window.ErrClosed)
	}
	now := ""
	if r.local {
		now = strconv.FormatInt(r.now().UnixMicro(), 10)
	}
	var buf [8]window.HitState
	st := buf[:0]
	if len(hits) > len(buf) {
		st = make([]window.HitState, 0, len(hits))
	}
	st = st[:len(hits)]
	var err error
	switch {
	case r.nodes != nil:
		err = r.decideNodes(ctx, by, hits, member, now, st)
	case r.perKey && len(hits) > 1:
		err = r.decidePerKey(ctx, hits, member, now, st)
	default:
		err = r.decideOnce(ctx, by, hits, member, now, st)
	}
	if err != nil {
		return window.Decision{}, classified(err)
	}
	return window.Resolve(hits, st), nil
}

// decideOnce runs the script once over every key: one round trip, or a
// share of one when auto-pipelining (within by, if not zero).
func (r *Redis) decideOnce(ctx context.Context, by time.Time, hits []window.Hit, member, now string, st []window.HitState) error {
	keys, args := scriptArgs(hits, member, now)
	var (
		res []any
		err error
	)
	if r.pipe != nil {
		res, err = r.pipe.run(ctx, by, keys, args)
	} else {
		res, err = r.script.eval(ctx, r.client, keys, args)
	}
	if err != nil {
		return fmt.Errorf("redis decide: %w", err)
	}
	return parseReply(res, hits, st)
}

// scriptArgs returns the keys and arguments of one script call deciding
// hits: member, now, the key count, then a spec per hit.
func scriptArgs(hits []window.Hit, member, now string) ([]string, []any) {
	keys := make([]string, len(hits))
	args := make([]any, 0, 3+len(hits))
	args = append(args, member, now, len(hits))
	for i := range hits {
		keys[i] = hits[i].Key
		args = appendHitArgs(args, &hits[i])
	}
	return keys, args
}

// decidePerKey runs the script once per key, pipelined, and undoes partial
// admissions.
func (r *Redis) decidePerKey(ctx context.Context, hits []window.Hit, member, now string, st []window.HitState) error {
	calls := make([]scriptCall, len(hits))
	for i := range hits {
		calls[i] = scriptCall{keys: []string{hits[i].Key}, args: appendHitArgs([]any{member, now, 1}, &hits[i])}
	}
	cmds := r.script.evalEach(ctx, r.client, calls)

	var (
		firstEr error
		deny    bool
	)
	decided := make([]bool, len(hits))
	for i, c := range cmds {
		res, err := c.Slice()
		if err == nil {
			err = parseReply(res, hits[i:i+1], st[i:i+1])
		}
		if err != nil {
			if firstEr == nil {
				firstEr = fmt.Errorf("redis decide key %d: %w", i, err)
			}
			continue
		}
		decided[i] = true
		if st[i].Over && !hits[i].Shadow {
			deny = true
		}
	}
	if firstEr == nil && !deny {
		return nil
	}
	undo := make([]bool, len(hits))
	for i := range hits {
		undo[i] = !decided[i] || !st[i].Over
	}
	r.compensate(ctx, hits, member, st, undo, decided)
	if deny {
		// A key is full: that is the decision, whatever another key's
		// error (a failure mode must not admit it).
		return nil
	}
	return firstEr
}

// compensate removes member from the keys of the hits marked in undo (the
// ones that may hold it: admitted, or failed and so maybe run), and takes
// its cost off the counts of those decided. It runs even if ctx is done. A
// failed removal is not an error of a denial: the entry ages out with its
// window.
func (r *Redis) compensate(ctx context.Context, hits []window.Hit, member string, st []window.HitState, undo, decided []bool) {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), compensateTimeout)
	defer cancel()
	pipe := r.client.Pipeline()
	for i := range hits {
		if !undo[i] {
			continue
		}
		if w := hits[i].Limit.Width(); w > 0 {
			pipe.Eval(cctx, bucketUndoLua, []string{hits[i].Key}, member, w.Microseconds(), hits[i].Counted())
		} else {
			pipe.ZRem(cctx, hits[i].Key, costMembers(member, hits[i].Counted())...)
		}
		if decided[i] {
			st[i].Count = max(st[i].Count-hits[i].Counted(), 0)
		}
	}
	if pipe.Len() > 0 {
		_, _ = pipe.Exec(cctx)
	}
}

// bucketUndoLua takes a request back from a bucketed key (Cluster
// compensation): if the key holds its member id (ARGV[1]), the id is removed
// and its cost (ARGV[3]) taken off the counter of the sub-window (of width
// ARGV[2] µs) it was admitted in, as redis.lua's bremove does.
const bucketUndoLua = `local at = redis.call('ZSCORE', KEYS[1], ARGV[1])
if at and redis.call('ZREM', KEYS[1], ARGV[1]) == 1 then
  local name = '\0' .. string.format('%d', math.floor(at / ARGV[2]))
  if tonumber(redis.call('ZINCRBY', KEYS[1], -ARGV[3], name)) <= 0 then
    redis.call('ZREM', KEYS[1], name)
  end
end
return 0`

// costMembers returns the members a request of cost entries records: its
// member id, then id#2 … id#cost (as redis.lua names them).
func costMembers(member string, cost int) []any {
	ms := make([]any, cost)
	ms[0] = member
	for j := 2; j <= cost; j++ {
		ms[j-1] = member + "#" + strconv.Itoa(j)
	}
	return ms
}

// appendHitArgs appends a hit's spec: its limit, window (µs), cost, shadow
// flag (1/0) and buckets (0: an exact log) as struct.pack('<I4I8I4BI4')
// would write them (21 bytes, little-endian), then an exact key's lifetime
// in ms (the window rounded up) in decimal. A request's arguments are its
// member id, its now ("" for Redis TIME) and its key count, then each hit's
// spec (see redis.lua). The spec is binary because the script parses it
// faster than text, and the lifetime is written as the string PEXPIRE takes.
func appendHitArgs(args []any, h *window.Hit) []any {
	us := h.Limit.Window.Microseconds()
	var buf [specLen + 20]byte
	b := binary.LittleEndian.AppendUint32(buf[:0], uint32(h.Limit.Requests))
	b = binary.LittleEndian.AppendUint64(b, uint64(us))
	b = binary.LittleEndian.AppendUint32(b, uint32(h.Counted()))
	if h.Shadow {
		b = append(b, 1)
	} else {
		b = append(b, 0)
	}
	b = binary.LittleEndian.AppendUint32(b, uint32(h.Limit.Buckets))
	b = strconv.AppendInt(b, (us+999)/1000, 10)
	return append(args, string(b))
}

// specLen is the length of a hit spec's binary part.
const specLen = 21

// replyLen is the length of the script's reply to one request of n keys:
// its time, then a count and a retry-after or reset per key.
func replyLen(n int) int { return 1 + 2*n }

// parseReply reads the script's reply to one request of hits into st.
func parseReply(res []any, hits []window.Hit, st []window.HitState) error {
	if len(res) != replyLen(len(st)) {
		return fmt.Errorf("redis decide: script replied %d values for %d keys", len(res), len(st))
	}
	if s, ok := res[0].(string); !ok {
		return fmt.Errorf("redis decide: script replied time %T, want a decimal string", res[0])
	} else if _, err := strconv.ParseInt(s, 10, 64); err != nil {
		return fmt.Errorf("redis decide: script replied time %q: %w", s, err)
	}
	for i := range st {
		count, ok1 := res[1+2*i].(int64)
		wait, ok2 := res[2+2*i].(int64)
		if !ok1 || !ok2 {
			return fmt.Errorf("redis decide: script replied %T, %T for key %d, want integers", res[1+2*i], res[2+2*i], i)
		}
		// A retry-after is at least 1 µs for a window without room; a window
		// with room has minus its reset, or 0 for the whole window.
		st[i] = window.HitState{Count: int(count)}
		switch {
		case wait > 0:
			st[i].Over, st[i].RetryAfter = true, time.Duration(wait)*time.Microsecond
		case wait < 0:
			l := keyLimit(hits, i)
			st[i].Reset = min(time.Duration(-wait)*time.Microsecond, l.Window+l.Width())
		default:
			st[i].Reset = keyLimit(hits, i).Window
		}
	}
	return nil
}

// keyLimit returns the limit of the first of hits with hits[i]'s key: the
// script counts a key by its first hit's window (see redis.lua).
func keyLimit(hits []window.Hit, i int) window.Limit {
	for j := range i {
		if hits[j].Key == hits[i].Key {
			return hits[j].Limit
		}
	}
	return hits[i].Limit
}
