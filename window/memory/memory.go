package memory

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/flashgate/flashgate/window"
)

// DefaultMaxKeys is the default bound on keys a [Memory] tracks.
const DefaultMaxKeys = 1 << 21

// shards is the number of independently locked shards of a Memory.
const shards = 64

// Options configures a [Memory]. The zero value is usable.
type Options struct {
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// MaxKeys bounds the keys tracked at once; 0 means DefaultMaxKeys.
	// See [Memory] for what happens when it is reached.
	MaxKeys int
}

// Memory is an exact sliding-window log per key, in process, bounded by
// Options.MaxKeys (see the package doc for how it evicts). It is safe for
// concurrent use; its zero value is not usable: call [New].
type Memory struct {
	now       func() time.Time
	shardKeys int // per-shard key bound
	evictions atomic.Uint64
	shards    [shards]memShard
}

type memShard struct {
	// mu guards the fields below.
	mu sync.Mutex
	// logs maps a key to its admissions inside the window.
	logs map[string]*memLog
	// inserts counts keys added since the last sweep.
	inserts int
	_       [40]byte // keep shards on separate cache lines
}

// memLog is a key's window: a queue of admission times (UnixNano), oldest
// first, or, for a bucketed limit (width > 0), sub-window counters.
type memLog struct {
	ts     []int64
	start  int   // ts[start:] are live
	window int64 // the window of the last decision, for idleness
	// width is the sub-window length (ns) of a bucketed limit, 0 for an
	// exact log; buckets are its live counters, oldest first, and sum their
	// total.
	width   int64
	buckets []memBucket
	sum     int
	// lowUntil (UnixNano) is when the allowance of the last decision stops
	// lowering the window (see [Allowance]); 0 without one.
	lowUntil int64
}

// floorDiv is a/b rounded down (b > 0), as Lua's math.floor(a / b).
func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && a < 0 {
		q--
	}
	return q
}

// memBucket is one sub-window's counter: idx is its start / width.
type memBucket struct {
	idx int64
	n   int
}

// len returns the entries in the window: the exact log's, or the sum of the
// live counters.
func (l *memLog) len() int {
	if l.width > 0 {
		return l.sum
	}
	return len(l.ts) - l.start
}

// add records cost entries at now.
func (l *memLog) add(now int64, cost int) {
	if l.width > 0 {
		// A clock that stepped back adds to the newest counter: later than
		// the truth, so counted longer, never shorter.
		idx := floorDiv(now, l.width)
		if k := len(l.buckets); k > 0 && l.buckets[k-1].idx >= idx {
			l.buckets[k-1].n += cost
		} else {
			l.buckets = append(l.buckets, memBucket{idx: idx, n: cost})
		}
		l.sum += cost
		return
	}
	for range cost {
		l.ts = append(l.ts, now)
	}
}

// setWidth makes l the window of a limit of sub-windows of width ns (0: an
// exact log), converting what a reload left as redis.lua does: exact
// entries still in the window become counters; counters of another width
// move to the sub-window that holds their old one's last instant (at the
// latest now); counters become entries at their sub-window's end (at the
// latest now: never earlier than an admission they count, at the µs
// resolution of Redis too), the newest limit of them.
func (l *memLog) setWidth(width, now, window int64, limit int) {
	if width == l.width {
		return
	}
	old, buckets, ts := l.width, l.buckets, l.ts[l.start:]
	l.width, l.buckets, l.sum, l.ts, l.start = width, nil, 0, nil, 0
	last := func(b memBucket) int64 { return min((b.idx+1)*old-1, now) }
	switch {
	case old == 0:
		for _, t := range ts {
			if t > now-window {
				l.add(t, 1)
			}
		}
	case width > 0:
		for _, b := range buckets {
			l.add(last(b), b.n)
		}
	default:
		skip := -limit
		for _, b := range buckets {
			skip += b.n
		}
		for _, b := range buckets {
			n := b.n
			if skip > 0 {
				d := min(skip, n)
				skip, n = skip-d, n-d
			}
			at := min((b.idx+1)*old, now)
			for range n {
				l.ts = append(l.ts, at)
			}
		}
	}
}

// trim drops the entries at or before now-window, as ZREMRANGEBYSCORE
// -inf (now-window) does in Redis; or the counters of the sub-windows that
// end at or before it.
func (l *memLog) trim(now, window int64) {
	if l.width > 0 {
		cut, i := floorDiv(now-window, l.width), 0
		for i < len(l.buckets) && l.buckets[i].idx < cut {
			l.sum -= l.buckets[i].n
			i++
		}
		if i > 0 {
			l.buckets = append(l.buckets[:0], l.buckets[i:]...)
		}
		return
	}
	cut := now - window
	i := l.start
	for i < len(l.ts) && l.ts[i] <= cut {
		i++
	}
	l.start = i
	if l.start == len(l.ts) {
		l.ts, l.start = l.ts[:0], 0
	} else if l.start > 32 && l.start > len(l.ts)/2 {
		n := copy(l.ts, l.ts[l.start:])
		l.ts, l.start = l.ts[:n], 0
	}
}

// idleAt returns the instant (UnixNano) from which the log holds nothing
// that matters: every entry has left the window and no allowance lowers it.
func (l *memLog) idleAt() int64 {
	at := l.lowUntil
	if k := len(l.buckets); l.width > 0 && k > 0 {
		at = max(at, (l.buckets[k-1].idx+1)*l.width+l.window)
	} else if l.width == 0 && l.len() > 0 {
		at = max(at, l.ts[len(l.ts)-1]+l.window)
	}
	return at
}

// leaveAt returns how long from now until the oldest leave entries have left
// the window (0 < leave ≤ len()): the exact log's leave-th entry's age-out,
// or the end of the sub-window whose counter takes the count past leave.
func (l *memLog) leaveAt(leave int, now int64) int64 {
	if l.width == 0 {
		return l.ts[l.start+leave-1] + l.window - now
	}
	gone := 0
	for _, b := range l.buckets {
		if gone += b.n; gone >= leave {
			return (b.idx+1)*l.width + l.window - now
		}
	}
	return l.window
}

// reset returns how long from now until the log's oldest counted entry
// leaves the window (Decision.Reset): the exact log's oldest entry's
// age-out, or the end of the oldest live sub-window, at most the window and
// one sub-window (a clock that stepped back recorded later instants); the
// whole window for an empty log.
func (l *memLog) reset(now int64) int64 {
	if l.len() == 0 {
		return l.window
	}
	return min(l.leaveAt(1, now), l.window+l.width)
}

// idle reports whether the log holds nothing that matters at now.
func (l *memLog) idle(now int64) bool { return l.idleAt() <= now }

// New returns an empty in-process limiter.
func New(opts Options) (*Memory, error) {
	if opts.MaxKeys < 0 {
		return nil, fmt.Errorf("memory limiter: max keys %d is negative", opts.MaxKeys)
	}
	if opts.MaxKeys == 0 {
		opts.MaxKeys = DefaultMaxKeys
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	m := &Memory{now: opts.Now, shardKeys: max(opts.MaxKeys/shards, 1)}
	for i := range m.shards {
		m.shards[i].logs = make(map[string]*memLog)
	}
	return m, nil
}

// Evictions returns how many live keys were evicted because MaxKeys was
// reached.
func (m *Memory) Evictions() uint64 { return m.evictions.Load() }

// Len returns the number of keys currently held (live or not yet swept).
func (m *Memory) Len() int {
	n := 0
	for i := range m.shards {
		s := &m.shards[i]
		s.mu.Lock()
		n += len(s.logs)
		s.mu.Unlock()
	}
	return n
}

// maxStackHits is how many hits Decide handles without allocating.
const maxStackHits = 8

// Decide implements [window.Limiter]. It fails only for invalid hits or a
// done ctx.
func (m *Memory) Decide(ctx context.Context, hits []window.Hit) (window.Decision, error) {
	return m.DecideWith(ctx, hits, DecideOptions{})
}

// Allowance returns how many entries h's window may hold in one decision,
// in place of h.Limit.Requests (0 refuses), and until when (UnixNano, 0 for
// no bound) that answer lowers the window: a denial's retry-after is then
// at most until - now, the instant the allowance grows. now is the
// decision's time in UnixNano. It is called under the key's lock.
type Allowance func(h *window.Hit, now int64) (allow int, until int64)

// Admitted is told, under the key's lock, of each key an admitted request
// was recorded in: the hit that loaded the key, the entries recorded and
// when (UnixNano).
type Admitted func(h *window.Hit, cost int, now int64)

// DecideOptions extend one decision of a [Memory] (the failure mode's
// fallback is a Memory so extended). The zero value is a plain Decide.
type DecideOptions struct {
	// Allowance, if not nil, replaces each hit's limit.
	Allowance Allowance
	// RecordDenied records a denied request too, in every window still
	// under its hit's own limit (a request that may hold a place elsewhere).
	RecordDenied bool
	// Admitted, if not nil, is told of every admission recorded (not of the
	// denied requests RecordDenied records).
	Admitted Admitted
}

// DecideWith is Decide extended by o: all hits together, all or nothing.
func (m *Memory) DecideWith(ctx context.Context, hits []window.Hit, o DecideOptions) (window.Decision, error) {
	if err := window.ValidateHits(hits); err != nil {
		return window.Decision{}, err
	}
	if err := ctx.Err(); err != nil {
		return window.Decision{}, fmt.Errorf("memory limiter: %w", err)
	}
	if len(hits) == 0 {
		return window.Resolve(nil, nil), nil
	}

	var stIdx [maxStackHits]uint8
	var stState [maxStackHits]window.HitState
	var stLogs [maxStackHits]*memLog
	idx := stIdx[:0]
	var st []window.HitState
	var logs []*memLog
	if len(hits) <= maxStackHits {
		st, logs = stState[:len(hits)], stLogs[:len(hits)]
	} else {
		st, logs = make([]window.HitState, len(hits)), make([]*memLog, len(hits))
	}
	// The distinct shards of this request, sorted: lock order.
	var used [shards]bool
	var stShard [maxStackHits]uint8
	shardIdx := stShard[:0]
	if len(hits) > maxStackHits {
		shardIdx = make([]uint8, 0, len(hits))
	}
	for i := range hits {
		s := shardOf(hits[i].Key)
		used[s] = true
		shardIdx = append(shardIdx, uint8(s))
	}
	for s := range used {
		if used[s] {
			idx = append(idx, uint8(s))
		}
	}
	for _, s := range idx {
		m.shards[s].mu.Lock()
	}
	defer func() {
		for _, s := range idx {
			m.shards[s].mu.Unlock()
		}
	}()

	now := m.now().UnixNano()
	for i := range hits {
		h := &hits[i]
		w := int64(h.Limit.Window)
		if j := firstOf(hits[:i], h.Key); j >= 0 {
			// The same key earlier in this request: its first hit loaded
			// it, and its kind, width and window hold for the request (as
			// in redis.lua); this hit compares its limit and cost with it.
			logs[i], w = logs[j], logs[j].window
		} else {
			sh := &m.shards[shardIdx[i]]
			l := sh.logs[h.Key]
			if l == nil {
				l = m.insertLocked(sh, h.Key, now, hits)
			}
			l.window = w
			l.setWidth(int64(h.Limit.Width()), now, w, h.Limit.Requests)
			l.trim(now, w)
			logs[i] = l
		}
		l := logs[i]
		n := l.len()
		st[i] = window.HitState{Count: n}
		limit := h.Limit.Requests
		if o.Allowance != nil {
			limit, l.lowUntil = o.Allowance(h, now)
			st[i].Allowance, st[i].Scaled = limit, true
		}
		if cost := h.Counted(); n+cost > limit {
			st[i].Over = true
			retry := l.lowUntil - now // the allowance grows then
			switch leave := n + cost - limit; {
			case limit <= 0:
			case leave <= n:
				// The last entry that must leave before the cost fits.
				if at := l.leaveAt(leave, now); retry <= 0 || at < retry {
					retry = at
				}
			case retry <= 0:
				retry = w // more than the window can ever hold
			}
			st[i].RetryAfter = time.Duration(max(retry, 1))
		}
	}
	admit := true
	for i := range hits {
		if st[i].Over && !hits[i].Shadow {
			admit = false
			break
		}
	}
	if admit {
		for i := range hits {
			if dup(hits[:i], hits[i].Key) {
				continue // the same key twice in one request counts once
			}
			cost, over := keyCost(hits, st, i)
			if over {
				continue // a full shadow window is reported, not grown
			}
			logs[i].add(now, cost)
			if o.Admitted != nil {
				o.Admitted(&hits[i], cost, now)
			}
		}
		for i := range hits {
			if !st[i].Over {
				st[i].Count = logs[i].len()
				st[i].Reset = time.Duration(logs[i].reset(now))
			}
		}
	} else if o.RecordDenied {
		for i := range hits {
			if dup(hits[:i], hits[i].Key) {
				continue
			}
			if cost, _ := keyCost(hits, st, i); logs[i].len()+cost <= hits[i].Limit.Requests {
				logs[i].add(now, cost)
			}
		}
	}
	return window.Resolve(hits, st), nil
}

// keyCost returns what hit i's key counts in this request: the largest cost
// of the hits from i on that share its key (a key counts once, at its
// largest cost, whatever the order), and whether any of them is over.
func keyCost(hits []window.Hit, st []window.HitState, i int) (cost int, over bool) {
	cost, over = hits[i].Counted(), st[i].Over
	for j := i + 1; j < len(hits); j++ {
		if hits[j].Key == hits[i].Key {
			cost, over = max(cost, hits[j].Counted()), over || st[j].Over
		}
	}
	return cost, over
}

// dup reports whether key is the key of one of hits.
func dup(hits []window.Hit, key string) bool { return firstOf(hits, key) >= 0 }

// firstOf returns the index of the first of hits with key, -1 for none.
func firstOf(hits []window.Hit, key string) int {
	for i := range hits {
		if hits[i].Key == key {
			return i
		}
	}
	return -1
}

// insertLocked adds an empty log for key to sh. Idle keys are swept once
// every len/2 inserts (amortised O(1)). At the bound, one key among eight
// random probes makes room: an idle one if found, else the one that would go
// idle soonest (newest entry + window), so the keys whose history still
// matters longest (a 1-per-day coupon, an active abuser) are the last to go.
// Keys of the request being decided (hits) are never chosen: their logs are
// in use.
func (m *Memory) insertLocked(sh *memShard, key string, now int64, hits []window.Hit) *memLog {
	sh.inserts++
	if sh.inserts >= max(len(sh.logs)/2, 1024) {
		sh.inserts = 0
		for k, l := range sh.logs {
			if l.idle(now) {
				delete(sh.logs, k)
			}
		}
	}
	if len(sh.logs) >= m.shardKeys {
		victim, last, probes := "", int64(0), 0
		for k, l := range sh.logs { // map order is randomised
			if dup(hits, k) {
				continue
			}
			if l.idle(now) {
				victim = k
				break
			}
			// The cost of evicting a live key is the history it forgets,
			// which matters until its newest entry leaves the window: evict
			// the one that would go idle soonest.
			if t := l.idleAt(); victim == "" || t < last {
				victim, last = k, t
			}
			if probes++; probes == 8 {
				break
			}
		}
		if victim != "" {
			if !sh.logs[victim].idle(now) {
				m.evictions.Add(1)
			}
			delete(sh.logs, victim)
		}
	}
	l := &memLog{}
	sh.logs[key] = l
	return l
}

// shardOf picks a key's shard: FNV-1a of the key.
func shardOf(key string) int {
	const offset, prime = 2166136261, 16777619
	h := uint32(offset)
	h *= prime // an empty rule and its zero separator, as the key's tag
	for i := 0; i < len(key); i++ {
		h = (h ^ uint32(key[i])) * prime
	}
	return int(h % shards)
}
