package window

import (
	"context"
	"crypto/rand"
	_ "embed"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

//go:embed redis.lua
var slidingLua string

// Clock chooses where a [Redis] limiter takes the time of a decision.
type Clock uint8

const (
	// ClockRedis takes the time from Redis TIME inside the script, so that
	// sidecars' clocks cannot skew the window. The default.
	ClockRedis Clock = iota
	// ClockLocal takes the time from RedisOptions.Now and passes it to the
	// script, for a Redis that forbids TIME in scripts. Limiters sharing a
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
// within it is not counted twice. go-redis retries at once after a timeout,
// and a call's budget is at most 90% of the check deadline (or
// pipelineTimeout, 2 s, for a context without one), so a retry runs well
// within it.
const IdempotencyHorizon = 5 * time.Second

// compensateTimeout bounds the ZREM that undoes a partial admission on a
// Redis Cluster; it runs even when the request's context is done.
const compensateTimeout = time.Second

// RedisOptions configures [NewRedis]. The zero value is valid: Redis clock,
// per-slot mode only for a *redis.ClusterClient or *redis.Ring, random member
// ids.
type RedisOptions struct {
	// Cluster decides each key on its own (per-slot check-and-add,
	// pipelined, with ZREM compensation) instead of all keys in one script.
	// It is implied when the client is a *redis.ClusterClient or *redis.Ring;
	// set it for any other client whose keys may live on different nodes.
	Cluster bool
	// Clock: ClockRedis (default) or ClockLocal.
	Clock Clock
	// Now is the local clock for ClockLocal; nil means time.Now. It is
	// ignored on ClockRedis.
	Now func() time.Time
	// Member returns a new member id for each request. Ids must be unique
	// among all limiters sharing a Redis for at least the longest window,
	// and must not be empty or begin with a NUL byte: a key's members that
	// begin with one are a bucketed key's counters and width, which the
	// script tells apart by that byte (Decide refuses such an id with an
	// error); ids beginning with the byte 0x01 are a [Fallback]'s written
	// back admissions (see [Redis.Restore]). nil means 8 random bytes drawn
	// once per limiter, the first at least 0x80, followed by a varint
	// counter (9 to 17 bytes per entry). It must be safe for concurrent use.
	Member func() string
	// AutoPipeline decides concurrent decisions together on standalone and
	// Sentinel Redis: the decisions that queued while round trips were in
	// flight go out as ONE script call, which decides them in order, each
	// all or nothing over its own keys with its own member id, so the
	// guarantees are unchanged (one script call is atomic). One call is in
	// flight, and up to PipelineWorkers while the newest call in flight is
	// stalled (out for twice the smoothed round trip, 250 µs to 5 ms): a
	// decision that finds a slot open and nothing queued is sent at once
	// from its own goroutine (a lone decision is not delayed); the others
	// queue and go out together when a call ends or stalls. It starts
	// PipelineWorkers goroutines: call [Redis.Close]. Ignored in per-slot
	// (Cluster) mode.
	AutoPipeline bool
	// PipelineWorkers bounds the round trips in flight with AutoPipeline
	// (each on its own pooled connection); 0 means DefaultPipelineWorkers.
	PipelineWorkers int
}

// rediser is what Redis needs of a go-redis client: *redis.Client,
// *redis.ClusterClient, *redis.Ring and every redis.UniversalClient fit.
type rediser interface {
	redis.Scripter
	Pipeline() redis.Pipeliner
	Ping(ctx context.Context) *redis.StatusCmd
}

// Redis is a [Limiter] on Redis sorted sets: one per key, one entry per
// admitted request scored by its admission time in microseconds.
//
// On a standalone Redis or Sentinel every decision is one script over all
// keys, one round trip (EVALSHA; after NOSCRIPT a SCRIPT LOAD shared by every
// caller that met it, then EVALSHA again, or EVAL where the load failed), exact and
// all or nothing. In per-slot mode (Redis Cluster) each key is checked and
// added by the same script on its own node, all keys pipelined; when some
// enforcing key denies, the request's member is removed (ZREM) from the keys
// that admitted it. Between the add and the removal other requests may see
// those entries, so a key may deny up to one request too many per request in
// flight that was denied elsewhere, and a failed removal leaves an entry that
// ages out with its window. Admissions are never over the limit.
//
// With RedisOptions.AutoPipeline concurrent decisions share script calls
// (see [RedisOptions]); each caller still returns at its
// context's deadline, and a call cut that way may still be recorded, as any
// timed-out call may.
//
// Each request gets a fresh member id; a script retried by the client (after
// a timeout, say) finds its member already present and does not count it
// twice. Keys expire one window after the last admission (PEXPIRE).
//
// A bucketed limit (Limit.Buckets > 0) keeps its key bounded: the same sorted
// set holds one counter per live sub-window (at most Buckets+1), the
// sub-window width, and, for idempotency, the member ids of the requests it
// admitted in the last IdempotencyHorizon (or window, if shorter); a retry
// within that horizon is counted once, as on an exact key, and a denied
// retry takes back its first attempt's count. Such a key expires one window
// and one sub-window after its last admission. A reload that makes an exact
// rule bucketed converts its keys' entries into counters, and one that
// changes the window or bucket count moves each counter to the new
// sub-window that holds its old one's last instant (never earlier, so never
// an over-admission); an exact hit on a bucketed key (a reload, a rollout,
// another rule on the same key) turns each counter back into entries at its
// sub-window's end, the newest Requests of them, its member ids among them.
// A key hit twice in one request is loaded once, by its first hit, whose
// kind, width and window then hold for the request.
//
// Redis is safe for concurrent use. Close it when done (it stops the
// auto-pipeline's goroutines); it does not close the client.
type Redis struct {
	client rediser
	script *redis.Script
	perKey bool             // one script per key, pipelined (Cluster, Ring)
	local  bool             // ClockLocal: now is passed to the script
	now    func() time.Time // the local clock
	member func() string    // a new member id per request
	pipe   *autoPipeline    // nil unless auto-pipelining
	closed atomic.Bool      // set by Close

	idPrefix [8]byte       // random, drawn once: the default member ids' prefix
	idNext   atomic.Uint64 // the default member ids' counter

	// loading (capacity 1) is held by the one caller reloading the script
	// after NOSCRIPT; loads counts the loads that succeeded.
	loading chan struct{}
	loads   atomic.Uint64
}

// reload loads the script after a NOSCRIPT (Redis restarted, failed over, or
// SCRIPT FLUSH): once for all the callers that met it together, not once per
// check. seen is r.loads as the caller read it before its EVALSHA: if a load
// completed since, the caller just tries again.
//
// The load is best effort: on a Cluster SCRIPT LOAD goes to every node and
// fails if one is down or loading, on a Ring it reaches one shard. Callers
// whose EVALSHA still meets NOSCRIPT after it send EVAL, which caches the
// script on exactly the node the key lives on.
func (r *Redis) reload(ctx context.Context, seen uint64) error {
	select {
	case r.loading <- struct{}{}:
	case <-ctx.Done():
		return fmt.Errorf("script load after NOSCRIPT: %w", ctx.Err())
	}
	defer func() { <-r.loading }()
	if r.loads.Load() != seen {
		return nil
	}
	if err := r.client.ScriptLoad(ctx, slidingLua).Err(); err != nil {
		return fmt.Errorf("script load after NOSCRIPT: %w", err)
	}
	r.loads.Add(1)
	return nil
}

// evalSha runs the script by its hash; after NOSCRIPT it reloads it (once
// for every caller that met it) and runs EVALSHA again, or EVAL where the
// load failed or did not reach the key's node.
func (r *Redis) evalSha(ctx context.Context, keys []string, args []any) ([]any, error) {
	seen := r.loads.Load()
	res, err := r.client.EvalSha(ctx, r.script.Hash(), keys, args...).Slice()
	if !isNoScript(err) {
		return res, err
	}
	if r.reload(ctx, seen) == nil {
		res, err = r.client.EvalSha(ctx, r.script.Hash(), keys, args...).Slice()
		if !isNoScript(err) {
			return res, err
		}
	}
	if ctx.Err() != nil {
		return nil, fmt.Errorf("script after NOSCRIPT: %w", ctx.Err())
	}
	return r.client.Eval(ctx, slidingLua, keys, args...).Slice()
}

var _ Limiter = (*Redis)(nil)

// NewRedis returns a limiter on client. It does not contact Redis; see
// [Redis.Ping].
func NewRedis(client rediser, opts RedisOptions) (*Redis, error) {
	if client == nil {
		return nil, errors.New("redis limiter: the client is nil")
	}
	switch opts.Clock {
	case ClockRedis, ClockLocal:
	default:
		return nil, fmt.Errorf("redis limiter: unknown clock %d", opts.Clock)
	}
	if opts.PipelineWorkers < 0 {
		return nil, fmt.Errorf("redis limiter: %d pipeline workers: must not be negative", opts.PipelineWorkers)
	}
	r := &Redis{
		client:  client,
		script:  redis.NewScript(slidingLua),
		perKey:  opts.Cluster,
		local:   opts.Clock == ClockLocal,
		now:     opts.Now,
		member:  opts.Member,
		loading: make(chan struct{}, 1),
	}
	switch client.(type) {
	case *redis.ClusterClient, *redis.Ring:
		r.perKey = true
	}
	if r.now == nil {
		r.now = time.Now
	}
	if r.member == nil {
		if _, err := rand.Read(r.idPrefix[:]); err != nil {
			return nil, fmt.Errorf("redis limiter: draw a member id prefix: %w", err)
		}
		r.idPrefix[0] |= 0x80 // never NUL: see RedisOptions.Member
		r.member = r.nextMember
	}
	if opts.AutoPipeline && !r.perKey {
		workers := opts.PipelineWorkers
		if workers == 0 {
			workers = DefaultPipelineWorkers
		}
		r.pipe = newAutoPipeline(r, workers)
	}
	return r, nil
}

// Close stops the auto-pipeline's goroutines, if any: decisions queued or
// waiting on a batch in flight return ErrClosed at once (one in flight may
// still be recorded), decisions sent on their own finish, and Close returns
// when the goroutines have ended. Decide after Close returns
// ErrClosed. Close does not close the client. It is safe to call more than
// once and concurrently with Decide.
func (r *Redis) Close() {
	r.closed.Store(true)
	if r.pipe != nil {
		r.pipe.close()
	}
}

// truncID is a member id cut to 32 bytes for an error message: a custom
// Member may return anything.
func truncID(m string) string {
	if len(m) > 32 {
		return m[:32] + "…"
	}
	return m
}

// nextMember returns the limiter's random prefix followed by a uvarint
// counter.
func (r *Redis) nextMember() string {
	var b [8 + binary.MaxVarintLen64]byte
	copy(b[:], r.idPrefix[:])
	n := binary.PutUvarint(b[8:], r.idNext.Add(1))
	return string(b[:8+n])
}

// Ping checks that Redis answers.
func (r *Redis) Ping(ctx context.Context) error {
	if err := r.client.Ping(ctx).Err(); err != nil {
		return fmt.Errorf("redis ping: %w", err)
	}
	return nil
}

// Warm readies the limiter for a burst before it is put in service: it
// loads the script (SCRIPT LOAD, on every node of a Cluster; best effort,
// see reload), so that the first checks do not meet NOSCRIPT, and opens
// conns connections at once (concurrent PINGs; on a Cluster, to the node
// PING goes to), so that the first checks do not wait on dials. The client
// keeps them open (ClientConfig.MinIdleConns). Call it with a deadline; it
// returns the first PING's error.
func (r *Redis) Warm(ctx context.Context, conns int) error {
	// Best effort: on a Cluster SCRIPT LOAD fails while any node (a replica
	// resyncing, say) does not answer, and readiness must not wait on a
	// replica; a node without the script gets it on the first NOSCRIPT.
	_ = r.client.ScriptLoad(ctx, slidingLua).Err()
	errs := make(chan error, max(conns, 1))
	for range max(conns, 1) {
		go func() { errs <- r.client.Ping(ctx).Err() }()
	}
	var first error
	for range max(conns, 1) {
		if err := <-errs; err != nil && first == nil {
			first = fmt.Errorf("redis warm-up: ping: %w", err)
		}
	}
	return first
}

// Decide implements [Limiter]: all hits of one request together, all or
// nothing, with a fresh member id. See [Redis] for Cluster's guarantees.
func (r *Redis) Decide(ctx context.Context, hits []Hit) (Decision, error) {
	d, _, err := r.decideMember(ctx, hits, r.member())
	return d, err
}

// decideWithin implements budgeted: Decide within budget from now, how long
// it took, and whether the budget ran out. With an auto-pipeline the budget
// is the pipeline's to keep (no context or timer per call; see
// [autoPipeline.run]); otherwise it is a deadline in ctx.
func (r *Redis) decideWithin(ctx context.Context, hits []Hit, budget time.Duration) (Decision, time.Duration, bool, error) {
	start := time.Now()
	if r.pipe == nil {
		d, spent, err := decideWithTimeout(ctx, r, hits, budget)
		return d, time.Since(start), spent, err
	}
	d, _, err := r.decideBy(ctx, start.Add(budget), hits, r.member())
	took := time.Since(start)
	return d, took, err != nil && ctx.Err() == nil && took >= budget, err
}

// decideMember decides hits as request member and also returns the Redis
// time of the decision in µs (on per-slot mode: of the last key's node).
func (r *Redis) decideMember(ctx context.Context, hits []Hit, member string) (Decision, int64, error) {
	return r.decideBy(ctx, time.Time{}, hits, member)
}

// decideBy is decideMember with a deadline by (zero: none) that the
// auto-pipeline keeps besides ctx's; only auto-pipelined calls take one.
func (r *Redis) decideBy(ctx context.Context, by time.Time, hits []Hit, member string) (Decision, int64, error) {
	if err := validateHits(hits); err != nil {
		return Decision{}, 0, err
	}
	if len(hits) == 0 {
		return decide(nil, nil), 0, nil
	}
	if member == "" || member[0] == 0 {
		return Decision{}, 0, fmt.Errorf("redis limiter: member id %q is empty or begins with a NUL byte (reserved for bucketed keys' counters; see RedisOptions.Member)", truncID(member))
	}
	if r.closed.Load() {
		return Decision{}, 0, fmt.Errorf("redis decide: %w", ErrClosed)
	}
	now := ""
	if r.local {
		now = strconv.FormatInt(r.now().UnixMicro(), 10)
	}
	var buf [8]hitState
	st := buf[:0]
	if len(hits) > len(buf) {
		st = make([]hitState, 0, len(hits))
	}
	st = st[:len(hits)]
	var (
		at  int64
		err error
	)
	if r.perKey && len(hits) > 1 {
		at, err = r.decidePerKey(ctx, hits, member, now, st)
	} else {
		at, err = r.decideOnce(ctx, by, hits, member, now, st)
	}
	if err != nil {
		return Decision{}, 0, err
	}
	return decide(hits, st), at, nil
}

// decideOnce runs the script once over every key: one round trip, or a
// share of one when auto-pipelining (within by, if not zero).
func (r *Redis) decideOnce(ctx context.Context, by time.Time, hits []Hit, member, now string, st []hitState) (int64, error) {
	keys := make([]string, len(hits))
	args := make([]any, 0, 3+len(hits)) // member, now, key count, a spec per hit
	args = append(args, member, now, len(hits))
	for i := range hits {
		keys[i] = hits[i].Key
		args = appendHitArgs(args, &hits[i])
	}
	var (
		res []any
		err error
	)
	if r.pipe != nil {
		res, err = r.pipe.run(ctx, by, keys, args)
	} else {
		res, err = r.evalSha(ctx, keys, args)
	}
	if err != nil {
		return 0, fmt.Errorf("redis decide: %w", err)
	}
	return parseReply(res, st)
}

// decidePerKey runs the script once per key, pipelined, and undoes partial
// admissions.
func (r *Redis) decidePerKey(ctx context.Context, hits []Hit, member, now string, st []hitState) (int64, error) {
	seen := r.loads.Load()
	cmds := make([]*redis.Cmd, len(hits))
	argv := make([][]any, len(hits))
	pipe := r.client.Pipeline()
	hash := r.script.Hash()
	for i := range hits {
		argv[i] = appendHitArgs([]any{member, now, 1}, &hits[i])
		cmds[i] = pipe.EvalSha(ctx, hash, []string{hits[i].Key}, argv[i]...)
	}
	_, _ = pipe.Exec(ctx) // errors are read per command below

	// Keys whose node had no script cached: load it (best effort, once for
	// the callers that met NOSCRIPT together), then EVALSHA again; keys
	// still without it (the load failed, or missed their node) get EVAL,
	// which caches it on exactly their node.
	for pass := 0; pass < 2; pass++ {
		var retry redis.Pipeliner
		loaded := pass == 0 && slices.ContainsFunc(cmds, func(c *redis.Cmd) bool { return isNoScript(c.Err()) }) &&
			r.reload(ctx, seen) == nil
		for i, c := range cmds {
			if !isNoScript(c.Err()) {
				continue
			}
			if retry == nil {
				retry = r.client.Pipeline()
			}
			if loaded {
				cmds[i] = retry.EvalSha(ctx, hash, []string{hits[i].Key}, argv[i]...)
			} else {
				cmds[i] = retry.Eval(ctx, slidingLua, []string{hits[i].Key}, argv[i]...)
			}
		}
		if retry == nil {
			break
		}
		_, _ = retry.Exec(ctx)
	}

	var (
		at      int64
		firstEr error
		deny    bool
	)
	decided := make([]bool, len(hits))
	for i, c := range cmds {
		res, err := c.Slice()
		if err == nil {
			at, err = parseReply(res, st[i:i+1])
		}
		if err != nil {
			if firstEr == nil {
				firstEr = fmt.Errorf("redis decide key %d: %w", i, err)
			}
			continue
		}
		decided[i] = true
		if st[i].over && !hits[i].Shadow {
			deny = true
		}
	}
	if firstEr == nil && !deny {
		return at, nil
	}
	// Undo: remove the member wherever it may have been added (every key
	// not known to be over, failed ones included: they may have run). It
	// runs even if ctx is done. A failed removal is not an error of a
	// denial: the entry ages out with its window.
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), compensateTimeout)
	defer cancel()
	undo := r.client.Pipeline()
	for i := range hits {
		if decided[i] && st[i].over {
			continue
		}
		if w := hits[i].Limit.Width(); w > 0 {
			undo.Eval(cctx, bucketUndoLua, []string{hits[i].Key}, member, w.Microseconds(), hits[i].cost())
		} else {
			undo.ZRem(cctx, hits[i].Key, costMembers(member, hits[i].cost())...)
		}
		if decided[i] {
			st[i].count = max(st[i].count-hits[i].cost(), 0)
		}
	}
	if undo.Len() > 0 {
		_, _ = undo.Exec(cctx)
	}
	return at, firstEr
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

func isNoScript(err error) bool {
	return err != nil && (errors.Is(err, redis.ErrNoScript) || redis.HasErrorPrefix(err, "NOSCRIPT"))
}

// appendHitArgs appends a hit's spec: its limit, window (µs), cost, shadow
// flag (1/0) and buckets (0: an exact log) as struct.pack('<I4I8I4BI4')
// would write them (21 bytes, little-endian), then an exact key's lifetime
// in ms (the window rounded up) in decimal. A request's arguments are its
// member id, its now ("" for Redis TIME) and its key count, then each hit's
// spec (see redis.lua). The spec is binary because parsing text costs the
// script more than a Redis command does (strtod per number; BENCHMARKS.md
// §13), and the lifetime is written here as the string PEXPIRE takes.
func appendHitArgs(args []any, h *Hit) []any {
	us := h.Limit.Window.Microseconds()
	var buf [specLen + 20]byte
	b := binary.LittleEndian.AppendUint32(buf[:0], uint32(h.Limit.Requests))
	b = binary.LittleEndian.AppendUint64(b, uint64(us))
	b = binary.LittleEndian.AppendUint32(b, uint32(h.cost()))
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
// its time, then a count and a retry-after per key.
func replyLen(n int) int { return 1 + 2*n }

// parseReply reads the script's reply to one request into st and returns
// Redis's time in µs.
func parseReply(res []any, st []hitState) (int64, error) {
	if len(res) != replyLen(len(st)) {
		return 0, fmt.Errorf("redis decide: script replied %d values for %d keys", len(res), len(st))
	}
	s, ok := res[0].(string)
	if !ok {
		return 0, fmt.Errorf("redis decide: script replied time %T, want a decimal string", res[0])
	}
	at, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("redis decide: script replied time %q: %w", s, err)
	}
	for i := range st {
		count, ok1 := res[1+2*i].(int64)
		wait, ok2 := res[2+2*i].(int64)
		if !ok1 || !ok2 {
			return 0, fmt.Errorf("redis decide: script replied %T, %T for key %d, want integers", res[1+2*i], res[2+2*i], i)
		}
		// Retry-after is at least 1 µs for a window without room, 0 for one with.
		st[i] = hitState{count: int(count), over: wait > 0, retryAfter: time.Duration(wait) * time.Microsecond}
	}
	return at, nil
}
