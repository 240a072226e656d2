package redisstore

import (
	"context"
	"fmt"
	"hash/maphash"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashgate/flashgate/window"
	"github.com/flashgate/flashgate/window/bans"
)

// DefaultReportInterval is how often a [Reporter] flushes its denials.
const DefaultReportInterval = 100 * time.Millisecond

// DefaultReportKeys is the default of ReporterOptions.MaxKeys.
const DefaultReportKeys = 10_000

// reportShards spreads the Reporter's pending denials over locks, so that
// the check path's Denied calls of different keys rarely meet.
const reportShards = 16

// ReporterOptions configures [FleetBans.NewReporter]. The zero value is
// valid.
type ReporterOptions struct {
	// Interval between flushes; 0 means DefaultReportInterval.
	Interval time.Duration
	// MaxKeys bounds the keys whose denials wait for a flush (and banned
	// keys waiting out their renewal second); a denial of a new key beyond
	// it is dropped and counted. 0 means DefaultReportKeys.
	MaxKeys int
}

// ReporterStats counts what a [Reporter] did since it was made.
type ReporterStats struct {
	// Sent: denials counted on Redis.
	Sent uint64
	// Dropped: denials not reported because MaxKeys keys were pending.
	Dropped uint64
	// Failed: denials lost to a failed flush (Redis down or slow).
	Failed uint64
	// Raised and Renewed: bans this reporter's flushes raised or renewed.
	Raised, Renewed uint64
}

// Reporter counts the sidecar's denials toward fleet-wide bans: it
// implements guard.BanReporter. Denied only adds to a pending count in
// memory; Run flushes the counts every Interval (while any are pending) in one pipeline, one
// reportLua call per key (K!bc, K!ban), and for each ban a call raised or
// renewed indexes it and publishes it, in a second pipeline, so that every
// sidecar's Subscriber applies it. A key found banned is reported again
// only after a second (so a hammered ban costs Redis one call per second
// per sidecar). Memory is bounded by MaxKeys; while Redis fails the counts
// of a flush are lost (counted), and the sidecar's Guard bans by its own
// count meanwhile. Reporter is safe for concurrent use.
type Reporter struct {
	fleet    *FleetBans
	interval time.Duration
	perShard int
	seed     maphash.Seed
	shards   [reportShards]reportShard

	// unsent holds the bans a flush raised but could not index and
	// publish; the next flush tries again. Only Run's goroutine uses it.
	unsent []bans.Entry

	sent, dropped, failed, raised, renewed atomic.Uint64

	// idle is set while Run waits for a denial with nothing pending; the
	// Denied that finds it set clears it and wakes Run (wake, capacity 1).
	idle atomic.Bool
	wake chan struct{}
}

type reportShard struct {
	// mu guards pending.
	mu      sync.Mutex
	pending map[string]*pendingDenials
	_       [48]byte // keeps shards on separate cache lines
}

// pendingDenials is one key's denials since its last report.
type pendingDenials struct {
	n    int
	ban  window.Ban
	hold time.Time // not reported before this: a banned key waits out bans.RenewEvery
}

// NewReporter returns a Reporter flushing to b; call Run to flush.
func (b *FleetBans) NewReporter(opts ReporterOptions) (*Reporter, error) {
	if opts.Interval < 0 || opts.MaxKeys < 0 {
		return nil, fmt.Errorf("fleet bans reporter: negative interval %s or key bound %d", opts.Interval, opts.MaxKeys)
	}
	if opts.Interval == 0 {
		opts.Interval = DefaultReportInterval
	}
	if opts.MaxKeys == 0 {
		opts.MaxKeys = DefaultReportKeys
	}
	r := &Reporter{fleet: b, interval: opts.Interval, perShard: max(opts.MaxKeys/reportShards, 1), seed: maphash.MakeSeed(),
		wake: make(chan struct{}, 1)}
	for i := range r.shards {
		r.shards[i].pending = make(map[string]*pendingDenials)
	}
	return r, nil
}

// Denied counts one denial of key toward ban; it never blocks on Redis.
func (r *Reporter) Denied(key string, ban window.Ban) {
	sh := &r.shards[maphash.String(r.seed, key)%reportShards]
	sh.mu.Lock()
	p := sh.pending[key]
	if p == nil {
		if len(sh.pending) >= r.perShard {
			sh.mu.Unlock()
			r.dropped.Add(1)
			return
		}
		p = &pendingDenials{}
		sh.pending[key] = p
	}
	p.n++
	p.ban = ban
	sh.mu.Unlock()
	if r.idle.Load() && r.idle.CompareAndSwap(true, false) {
		select {
		case r.wake <- struct{}{}:
		default:
		}
	}
}

// Stats returns the reporter's counts.
func (r *Reporter) Stats() ReporterStats {
	return ReporterStats{Sent: r.sent.Load(), Dropped: r.dropped.Load(), Failed: r.failed.Load(),
		Raised: r.raised.Load(), Renewed: r.renewed.Load()}
}

// Run flushes every Interval until ctx ends, while anything is pending (a
// denial, a banned key waiting out its renewal second, a ban to announce
// again); with nothing pending it sleeps until the next denial, and
// flushes Interval after it: an idle sidecar has no timer of the
// reporter's running.
func (r *Reporter) Run(ctx context.Context) {
	t := time.NewTimer(r.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		fctx, cancel := context.WithTimeout(ctx, banCallTimeout)
		r.Flush(fctx)
		cancel()
		if r.quiet() {
			r.idle.Store(true)
			// A denial counted before idle was set is seen here; one
			// counted after it wakes the wait below.
			if r.quiet() {
				select {
				case <-ctx.Done():
					return
				case <-r.wake:
				}
			}
			r.idle.Store(false)
		}
		t.Reset(r.interval)
	}
}

// quiet reports whether nothing waits for a flush: no key pending in any
// shard and no ban to announce again. Only Run's goroutine calls it.
func (r *Reporter) quiet() bool {
	if len(r.unsent) > 0 {
		return false
	}
	for i := range r.shards {
		sh := &r.shards[i]
		sh.mu.Lock()
		n := len(sh.pending)
		sh.mu.Unlock()
		if n > 0 {
			return false
		}
	}
	return true
}

// every runs f every period, each run within timeout, until ctx ends.
func every(ctx context.Context, period, timeout time.Duration, f func(context.Context)) {
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			fctx, cancel := context.WithTimeout(ctx, timeout)
			f(fctx)
			cancel()
		}
	}
}

// report is one key's denials taken for a flush.
type report struct {
	key string
	n   int
	ban window.Ban
}

// take removes the denials due for a report at now, and forgets keys with
// nothing pending and no renewal second to wait out.
func (r *Reporter) take(now time.Time) []report {
	var out []report
	for i := range r.shards {
		sh := &r.shards[i]
		sh.mu.Lock()
		for k, p := range sh.pending {
			switch {
			case now.Before(p.hold):
			case p.n > 0:
				out = append(out, report{key: k, n: p.n, ban: p.ban})
				p.n = 0
			default:
				delete(sh.pending, k)
			}
		}
		sh.mu.Unlock()
	}
	return out
}

// holdUntil makes key wait until t before its next report.
func (r *Reporter) holdUntil(key string, t time.Time) {
	sh := &r.shards[maphash.String(r.seed, key)%reportShards]
	sh.mu.Lock()
	if p := sh.pending[key]; p != nil {
		p.hold = t
	}
	sh.mu.Unlock()
}

// Flush reports the denials pending now: one pipeline of reportLua calls,
// then one that indexes and publishes the bans they raised or renewed.
// Run calls it; tests call it to flush at once.
func (r *Reporter) Flush(ctx context.Context) {
	now := r.fleet.now()
	batch := r.take(now)
	if len(batch) == 0 && len(r.unsent) == 0 {
		return
	}
	nowArg := ""
	if r.fleet.local {
		nowArg = strconv.FormatInt(now.UnixMilli(), 10)
	}
	calls := make([]scriptCall, len(batch))
	for i, rep := range batch {
		calls[i] = scriptCall{
			keys: []string{rep.key + counterSuffix, rep.key + banSuffix},
			args: []any{rep.n, rep.ban.Threshold, ceilMs(rep.ban.Window), ceilMs(rep.ban.Duration), nowArg, bans.RenewEvery.Milliseconds()},
		}
	}
	var cmds []*redis.Cmd
	if len(calls) > 0 {
		cmds = r.fleet.report.evalEach(ctx, r.fleet.client, calls)
	}
	raised := r.unsent
	r.unsent = nil
	for i, cmd := range cmds {
		until, state, err := parseReport(cmd)
		if err != nil {
			r.failed.Add(uint64(batch[i].n))
			continue
		}
		r.sent.Add(uint64(batch[i].n))
		if until > 0 {
			r.holdUntil(batch[i].key, now.Add(bans.RenewEvery))
		}
		switch state {
		case 1:
			r.raised.Add(1)
		case 2:
			r.renewed.Add(1)
		default:
			continue
		}
		raised = append(raised, bans.Entry{Key: batch[i].key, Until: time.UnixMilli(until)})
	}
	if len(raised) == 0 {
		return
	}
	if err := r.fleet.announce(ctx, raised); err != nil {
		// Tried again by the next flush, the ones still in force, within
		// the key bound.
		for _, b := range raised {
			if b.Until.After(now) && len(r.unsent) < r.perShard*reportShards {
				r.unsent = append(r.unsent, b)
			}
		}
	}
}

// parseReport reads reportLua's reply: the ban's end in Unix ms (0: none)
// and the state (0 unchanged, 1 raised, 2 renewed).
func parseReport(cmd *redis.Cmd) (until int64, state int64, err error) {
	res, err := cmd.Slice()
	if err != nil {
		return 0, 0, err
	}
	if len(res) != 3 {
		return 0, 0, fmt.Errorf("fleet bans: report script replied %d values, want 3", len(res))
	}
	until, ok1 := res[1].(int64)
	state, ok2 := res[2].(int64)
	if !ok1 || !ok2 {
		return 0, 0, fmt.Errorf("fleet bans: report script replied %T, %T, want integers", res[1], res[2])
	}
	return until, state, nil
}

// ceilMs is d in whole milliseconds, rounded up, at least 1.
func ceilMs(d time.Duration) int64 { return int64(max((d+time.Millisecond-1)/time.Millisecond, 1)) }
