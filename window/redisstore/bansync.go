package redisstore

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashgate/flashgate/window/bans"
)

// DefaultMaxBans is the default of SubscriberOptions.MaxBans.
const DefaultMaxBans = 100_000

// DefaultResync is the default of SubscriberOptions.Resync.
const DefaultResync = 30 * time.Second

// receiveTimeout is how long the subscriber waits for a message before it
// pings its connection to tell a quiet channel from a dead one.
const receiveTimeout = 15 * time.Second

// Backoff between attempts to reach Redis again.
const (
	syncBackoffMin = 100 * time.Millisecond
	syncBackoffMax = 5 * time.Second
)

// BanApplier is what a [Subscriber] keeps in step with the fleet: a
// sidecar's guard.Guard. Both methods are safe for concurrent use and take
// effect before they return.
type BanApplier interface {
	Ban(key string, until time.Time)
	Lift(key string)
}

// BanEvents hears of the changes a [Subscriber] applies, for metrics: rule
// is the key's rule segment (a rule name from the config, or its hash),
// never a request value.
type BanEvents interface {
	// Raised: a ban the sidecar did not hold took effect, learnt from the
	// channel (a sync applies the bans it missed without counting them).
	Raised(rule string, by bans.Origin)
	// Lifted: a ban in force was lifted.
	Lifted(rule string)
}

// SubscriberOptions configures [FleetBans.NewSubscriber]. The zero value is
// valid.
type SubscriberOptions struct {
	// MaxBans bounds the bans the subscriber remembers (to re-add them if
	// Redis loses them); a ban beyond it is still applied, not remembered.
	// 0 means DefaultMaxBans.
	MaxBans int
	// Resync is how often the subscriber checks, while connected, that
	// Redis still holds the index (its epoch: a FLUSHALL, say), and syncs
	// with it if not; 0 means DefaultResync,
	// negative never.
	Resync time.Duration
	// Events, if not nil, hears of bans raised and lifted.
	Events BanEvents
	// OnError, if not nil, is told why Redis could not be reached or
	// synced; the subscriber retries with backoff.
	OnError func(error)
}

// Subscriber keeps a sidecar's local bans (a [BanApplier]) in step with the
// fleet's: it subscribes to the bans channel and applies every ban and lift
// published, and it syncs with the index (every ban in force) after every
// (re)subscription, so that a sidecar that starts or reconnects learns the
// bans it missed; [Subscriber.Synced] tells when the first sync is done.
// Every Resync it checks the index's epoch (one read) and syncs if it
// changed.
//
// The index carries an epoch, a member that only Redis losing the index
// removes (a restart without persistence, a flush, a failover to a replica
// that had not received it). A sync tells the sidecar's bans.Book whether
// the epoch changed (Redis lost the bans), and writes back or lifts what
// the Book decides (bans.Book.Reconcile). While Redis is down the bans held
// stay in force locally, each until its end.
type Subscriber struct {
	fleet   *FleetBans
	apply   BanApplier
	book    *bans.Book
	resync  time.Duration
	events  BanEvents
	onError func(error)
	synced  chan struct{}
	epoch   string // the index's epoch last seen; only Run's goroutine uses it
}

// NewSubscriber returns a Subscriber applying b's bans to apply; call Run.
func (b *FleetBans) NewSubscriber(apply BanApplier, opts SubscriberOptions) (*Subscriber, error) {
	if apply == nil {
		return nil, errors.New("fleet bans subscriber: nothing to apply bans to")
	}
	if opts.MaxBans < 0 {
		return nil, fmt.Errorf("fleet bans subscriber: negative ban bound %d", opts.MaxBans)
	}
	if opts.MaxBans == 0 {
		opts.MaxBans = DefaultMaxBans
	}
	if opts.Resync == 0 {
		opts.Resync = DefaultResync
	}
	return &Subscriber{
		fleet: b, apply: apply, book: bans.NewBook(opts.MaxBans), resync: opts.Resync, events: opts.Events,
		onError: opts.OnError, synced: make(chan struct{}),
	}, nil
}

// Synced is closed when the first sync with the index is done: from then on
// the sidecar enforces every ban in force.
func (s *Subscriber) Synced() <-chan struct{} { return s.synced }

// InForce calls fn with the number of bans in force the subscriber holds,
// per rule segment of their keys.
func (s *Subscriber) InForce(fn func(rule string, n int)) { s.book.InForce(s.fleet.now(), fn) }

// Run subscribes and applies the fleet's bans until ctx ends, reconnecting
// with backoff.
func (s *Subscriber) Run(ctx context.Context) {
	ps, stop := subscribeTo(ctx, s.fleet.client, s.fleet.index)
	defer stop()
	var (
		pause      = syncBackoffMin
		lastSync   time.Time
		subscribed bool // the subscription is confirmed on the current connection
		unsynced   bool // and no sync succeeded since
	)
	for ctx.Err() == nil {
		due := unsynced || s.resync > 0 && !lastSync.IsZero() && time.Since(lastSync) >= s.resync
		if subscribed && due {
			sctx, cancel := context.WithTimeout(ctx, banCallTimeout)
			err := s.sync(sctx, unsynced)
			cancel()
			if ctx.Err() != nil {
				return
			}
			if err != nil {
				s.fail(err)
				unsynced, pause = true, min(2*pause, syncBackoffMax)
			} else {
				unsynced, lastSync, pause = false, time.Now(), syncBackoffMin
				select {
				case <-s.synced:
				default:
					close(s.synced)
				}
			}
		}
		wait := receiveTimeout
		if unsynced {
			wait = pause
		} else if s.resync > 0 && !lastSync.IsZero() {
			wait = min(wait, max(time.Until(lastSync.Add(s.resync)), time.Millisecond))
		}
		msg, got := receive(ctx, ps, wait, &pause, s.fail, "fleet bans")
		switch got {
		case recvDone:
			return
		case recvTimeout:
			if !unsynced && (s.resync <= 0 || time.Since(lastSync) < s.resync) {
				// Quiet and not due for a sync: make sure the connection
				// lives (the pong comes as a message).
				if err := ps.Ping(ctx); err != nil {
					s.fail(fmt.Errorf("fleet bans: ping: %w", err))
				}
			}
			continue
		case recvLost:
			subscribed = false
			continue
		}
		switch m := msg.(type) {
		case *redis.Subscription:
			if m.Kind == "subscribe" {
				subscribed, unsynced = true, true
			}
		case *redis.Message:
			s.handle(ctx, m.Payload)
		}
	}
}

func (s *Subscriber) fail(err error) {
	if s.onError != nil {
		s.onError(err)
	}
}

// sleep waits d or until ctx ends; it reports whether d passed.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// handle applies one channel message, as the Book decides: a ban raised by
// a count that the ban held outlasts is written back (Redis lost the held
// one), any other ban is learnt and applied, a lift forgets and lifts.
func (s *Subscriber) handle(ctx context.Context, payload string) {
	ev, ok := parseBanMessage(payload)
	if !ok || s.fleet.checkKey(ev.key) != nil {
		return
	}
	now := s.fleet.now()
	if ev.lift {
		inForce := s.book.Forget(ev.key, now)
		s.apply.Lift(ev.key)
		if inForce && s.events != nil {
			s.events.Lifted(bans.KeyRule(ev.key))
		}
		return
	}
	if !ev.until.After(now) {
		return
	}
	if held, ok := s.book.Outlasts(ev.key, ev.until, ev.by); ok {
		s.keepHeld(ctx, []bans.Entry{{Key: ev.key, Until: held}})
		return
	}
	if !s.learn(ev.key, ev.until) && s.events != nil {
		s.events.Raised(bans.KeyRule(ev.key), ev.by)
	}
}

// learn records a ban in the Book and applies it unless it is in force
// already; it reports whether a ban of key in force was held.
func (s *Subscriber) learn(key string, until time.Time) (known bool) {
	known, apply := s.book.Learn(key, until, s.fleet.now())
	if apply {
		s.apply.Ban(key, until)
	}
	return known
}

// sync reads the index and applies it (see Subscriber): the epoch first,
// then, if full or the epoch changed, the bans in force.
func (s *Subscriber) sync(ctx context.Context, full bool) error {
	var rnd [8]byte
	if _, err := rand.Read(rnd[:]); err != nil {
		return fmt.Errorf("fleet bans: sync: draw an epoch: %w", err)
	}
	epoch, err := s.fleet.epoch.eval(ctx, s.fleet.client, []string{s.fleet.index}, []any{epochPrefix + hex.EncodeToString(rnd[:])})
	if err != nil {
		return fmt.Errorf("fleet bans: sync: epoch: %w", err)
	}
	var e string
	if len(epoch) == 1 {
		e, _ = epoch[0].(string)
	}
	if e == "" {
		return fmt.Errorf("fleet bans: sync: the epoch script replied %v", epoch)
	}
	last := s.epoch
	if e == last && !full {
		return nil
	}
	list, err := s.fleet.List(ctx)
	if err != nil {
		return fmt.Errorf("fleet bans: sync: %w", err)
	}
	restore, lift, learn := s.book.Reconcile(list, last != "" && e != last, s.fleet.now())
	if len(restore) > 0 {
		if err := s.restore(ctx, restore); err != nil {
			return err // the epoch is kept: the next sync tries again
		}
	}
	for _, b := range lift {
		s.apply.Lift(b.Key)
		if s.events != nil {
			s.events.Lifted(bans.KeyRule(b.Key))
		}
	}
	for _, b := range learn {
		s.learn(b.Key, b.Until)
	}
	s.epoch = e
	return nil
}

// keepHeld writes back bans the subscriber holds that Redis lost, within
// banCallTimeout; a failure is reported and left to the next sync (the
// held bans stay in force here meanwhile).
func (s *Subscriber) keepHeld(ctx context.Context, held []bans.Entry) {
	rctx, cancel := context.WithTimeout(ctx, banCallTimeout)
	defer cancel()
	if err := s.restore(rctx, held); err != nil {
		s.fail(err)
	}
}

// restore writes back bans Redis lost: each unless a later one is there,
// indexed and published for the sidecars that did not hold it.
func (s *Subscriber) restore(ctx context.Context, lost []bans.Entry) error {
	calls := make([]scriptCall, len(lost))
	for i, b := range lost {
		calls[i] = scriptCall{keys: []string{b.Key + banSuffix}, args: []any{b.Until.UnixMilli()}}
	}
	for _, cmd := range s.fleet.restore.evalEach(ctx, s.fleet.client, calls) {
		if err := cmd.Err(); err != nil {
			return fmt.Errorf("fleet bans: write back lost bans: %w", err)
		}
	}
	return s.fleet.announce(ctx, lost)
}
