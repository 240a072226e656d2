package redisstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashgate/flashgate/window/overrides"
)

// DefaultOverrideResync is the default of FollowerOptions.Resync.
const DefaultOverrideResync = 10 * time.Second

// OverrideEvents hears of the changes a [Follower] applies, for metrics.
type OverrideEvents interface {
	// Set: an override took effect (new, or replacing its rule's).
	Set(o *overrides.Override)
	// Cleared: an override in force went before its end.
	Cleared(o *overrides.Override)
}

// FollowerOptions configures [Overrides.NewFollower]. The zero value is
// valid.
type FollowerOptions struct {
	// Resync is how often the follower reads the fleet's overrides while
	// nothing is published (to find Redis lost them: a flush); 0 means
	// DefaultOverrideResync.
	Resync time.Duration
	// Events, if not nil, hears of overrides set and cleared.
	Events OverrideEvents
	// OnError, if not nil, is told why Redis could not be reached or
	// read; the follower retries with backoff.
	OnError func(error)
}

// Follower keeps a sidecar's overrides.Book in step with the fleet's
// overrides: it subscribes to their channel and reads the hash whole after
// every (re)subscription, every message and every Resync, so that a
// sidecar that starts or reconnects learns what it missed;
// [Follower.Synced] is closed after the first read. At each read it
// writes back the entries (overrides and clears' tombstones) its Book
// holds that outrank Redis's for their rule (a failover to a replica that
// missed the newest), and the ones Redis lacks (a failover to a replica
// that missed a rule's first set; or, when the hash's epoch tells it Redis
// lost the overrides, a restart without persistence, a flush): one merge
// script, the highest revision winning (overrides.Book.Reconcile). While Redis is down the Book keeps its
// overrides, each until its end.
//
// Each read also takes Redis's TIME, on the node that holds the hash: the
// Book learns the offset of the sidecar's clock to Redis's, and ends
// overrides on Redis's clock. Every entry read is checked like the ones
// Set writes (overrides.Override.Verify); one that breaks the bounds is
// skipped and reported to the Book (overrides.Book.Skipped) once per
// value.
type Follower struct {
	s       *Overrides
	book    *overrides.Book
	resync  time.Duration
	events  OverrideEvents
	onError func(error)
	synced  chan struct{}
	// Only Run's goroutine uses these: the hash's epoch last seen, and
	// the entries skipped at the last read (their field's value's sum).
	epoch   string
	skipped map[string]uint64
}

// NewFollower returns a Follower keeping book in step; call Run.
func (s *Overrides) NewFollower(book *overrides.Book, opts FollowerOptions) (*Follower, error) {
	if book == nil {
		return nil, errors.New("overrides follower: no book to keep")
	}
	if opts.Resync <= 0 {
		opts.Resync = DefaultOverrideResync
	}
	return &Follower{s: s, book: book, resync: opts.Resync, events: opts.Events, onError: opts.OnError, synced: make(chan struct{})}, nil
}

// Synced is closed when the first read of the fleet's overrides is
// applied: from then on the sidecar enforces every override in force.
func (f *Follower) Synced() <-chan struct{} { return f.synced }

// Run follows the fleet's overrides until ctx ends, reconnecting with
// backoff.
func (f *Follower) Run(ctx context.Context) {
	ps, stop := subscribeTo(ctx, f.s.client, f.s.channel)
	defer stop()
	var (
		pause      = syncBackoffMin
		last       time.Time // the last successful read
		subscribed bool      // on the current connection
		dirty      bool      // a read is due: subscribed or nudged since the last
	)
	for ctx.Err() == nil {
		if subscribed && (dirty || time.Since(last) >= f.resync) {
			sctx, cancel := context.WithTimeout(ctx, banCallTimeout)
			err := f.sync(sctx)
			cancel()
			if ctx.Err() != nil {
				return
			}
			if err != nil {
				f.fail(err)
				dirty, pause = true, min(2*pause, syncBackoffMax)
			} else {
				dirty, last, pause = false, time.Now(), syncBackoffMin
				select {
				case <-f.synced:
				default:
					close(f.synced)
				}
			}
		}
		wait := pause // not subscribed yet, or a read to retry
		if !dirty && !last.IsZero() {
			wait = max(min(receiveTimeout, time.Until(last.Add(f.resync))), time.Millisecond)
		}
		msg, got := receive(ctx, ps, wait, &pause, f.fail, "overrides")
		switch got {
		case recvDone:
			return
		case recvLost:
			subscribed = false
		case recvTimeout:
			if subscribed && !dirty && time.Since(last) < f.resync {
				// Quiet: make sure the subscription's connection lives
				// (the pong comes as a message).
				if err := ps.Ping(ctx); err != nil {
					f.fail(fmt.Errorf("overrides: ping: %w", err))
				}
			}
		}
		switch m := msg.(type) {
		case *redis.Subscription:
			if m.Kind == "subscribe" {
				subscribed, dirty = true, true
			}
		case *redis.Message:
			dirty = true
		}
	}
}

func (f *Follower) fail(err error) {
	if f.onError != nil {
		f.onError(err)
	}
}

// sync reads the hash (creating its epoch if Redis lost it) and applies
// it to the Book, writing back what Redis lost.
func (f *Follower) sync(ctx context.Context) error {
	epoch, err := newEpoch()
	if err != nil {
		return fmt.Errorf("overrides: sync: %w", err)
	}
	sent := f.book.Local()
	m, now, err := f.s.readHash(ctx, epoch)
	if err != nil {
		return err
	}
	got := f.book.Local()
	// Redis read its clock between sent and got: take the middle.
	f.book.SetOffset(now.Sub(sent.Add(got.Sub(sent) / 2)))
	r := parse(m, now)
	restore, set, gone, over := f.book.Reconcile(r.entries, r.held, f.epoch != "" && r.epoch != f.epoch)
	f.report(r.skipped, over)
	if len(restore) > 0 {
		if err := f.s.restore(ctx, r.epoch, restore); err != nil {
			return err // the epoch is kept: the next read writes back again
		}
	}
	f.epoch = r.epoch
	if f.events != nil {
		for _, o := range set {
			f.events.Set(o)
		}
		for _, o := range gone {
			f.events.Cleared(o)
		}
	}
	return nil
}

// report tells the Book of the entries skipped that the last read did not
// skip already: the ones that break the bounds, and the overrides in force
// beyond overrides.MaxInForce.
func (f *Follower) report(skips []skipped, over []*overrides.Override) {
	for _, o := range over {
		skips = append(skips, skipped{key: "\x01" + field(o.Target), sum: uint64(o.Rev), skip: overrides.Skip{
			What: describeField(field(o.Target)), Reason: overrides.SkipBound,
			Err: fmt.Errorf("more than %d overrides in force: the ones that end last are not applied", overrides.MaxInForce)}})
	}
	next := make(map[string]uint64, len(skips))
	for _, s := range skips {
		next[s.key] = s.sum
		if sum, ok := f.skipped[s.key]; !ok || sum != s.sum {
			f.book.Skipped(s.skip)
		}
	}
	f.skipped = next
}
