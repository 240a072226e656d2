package redisstore

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
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
	Raised(rule string, by BanOrigin)
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
// that had not received it). A sync that finds the epoch it last saw
// treats the index as the truth: a ban the subscriber holds that is missing
// was lifted meanwhile, and is lifted here. A sync that finds another epoch
// (or none: it then makes one) knows Redis lost the bans: it writes back
// the ones it holds that are still in force, each with its own end, over a
// shorter one a fresh count raised since (a later ban is kept), so that a
// restarted Redis pardons no abuser and shortens no ban. While Redis is down the bans held
// stay in force locally, each until its end.
type Subscriber struct {
	fleet   *FleetBans
	apply   BanApplier
	maxBans int
	resync  time.Duration
	events  BanEvents
	onError func(error)
	synced  chan struct{}

	// mu guards the fields below; only Run's goroutine writes them.
	mu    sync.Mutex
	held  map[string]time.Time // the bans known, by key: their end
	epoch string               // the index's epoch last seen
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
		fleet: b, apply: apply, maxBans: opts.MaxBans, resync: opts.Resync, events: opts.Events,
		onError: opts.OnError, synced: make(chan struct{}), held: make(map[string]time.Time),
	}, nil
}

// Synced is closed when the first sync with the index is done: from then on
// the sidecar enforces every ban in force.
func (s *Subscriber) Synced() <-chan struct{} { return s.synced }

// InForce calls fn with the number of bans in force the subscriber holds,
// per rule segment of their keys.
func (s *Subscriber) InForce(fn func(rule string, n int)) {
	now := s.fleet.now()
	counts := make(map[string]int)
	s.mu.Lock()
	for k, until := range s.held {
		if until.After(now) {
			counts[keyRule(k)]++
		}
	}
	s.mu.Unlock()
	for r, n := range counts {
		fn(r, n)
	}
}

// Run subscribes and applies the fleet's bans until ctx ends, reconnecting
// with backoff.
func (s *Subscriber) Run(ctx context.Context) {
	ps := s.fleet.client.Subscribe(ctx, s.fleet.index)
	defer ps.Close()
	// A receive does not watch ctx: closing the subscription ends it.
	stop := context.AfterFunc(ctx, func() { _ = ps.Close() })
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
		msg, err := ps.ReceiveTimeout(ctx, wait)
		if ctx.Err() != nil {
			return
		}
		var ne net.Error
		switch {
		case err != nil && errors.As(err, &ne) && ne.Timeout():
			if !unsynced && (s.resync <= 0 || time.Since(lastSync) < s.resync) {
				// Quiet and not due for a sync: make sure the connection
				// lives (the pong comes as a message).
				if err := ps.Ping(ctx); err != nil {
					s.fail(fmt.Errorf("fleet bans: ping: %w", err))
				}
			}
			continue
		case err != nil:
			// The next receive reconnects and subscribes again.
			s.fail(fmt.Errorf("fleet bans: subscribe: %w", err))
			subscribed = false
			if !sleep(ctx, pause) {
				return
			}
			pause = min(2*pause, syncBackoffMax)
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

// handle applies one channel message. A ban raised by a threshold that
// ends before the ban the subscriber holds for the key means Redis lost the
// held one (a reset: a fresh count then raised the rule's shorter box): the
// held end stands here and is written back (see keepHeld). A ban by hand
// replaces the held one, shorter too.
func (s *Subscriber) handle(ctx context.Context, payload string) {
	ev, ok := parseBanMessage(payload)
	if !ok || s.fleet.checkKey(ev.key) != nil {
		return
	}
	if ev.lift {
		s.mu.Lock()
		until, held := s.held[ev.key]
		delete(s.held, ev.key)
		s.mu.Unlock()
		s.apply.Lift(ev.key)
		if held && until.After(s.fleet.now()) && s.events != nil {
			s.events.Lifted(keyRule(ev.key))
		}
		return
	}
	if !ev.until.After(s.fleet.now()) {
		return
	}
	if ev.by == ByThreshold {
		s.mu.Lock()
		held, ok := s.held[ev.key]
		s.mu.Unlock()
		if ok && held.After(ev.until) {
			s.keepHeld(ctx, []BanEntry{{Key: ev.key, Until: held}})
			return
		}
	}
	if !s.learn(ev.key, ev.until) && s.events != nil {
		s.events.Raised(keyRule(ev.key), ev.by)
	}
}

// learn applies a ban and remembers it (within MaxBans); it reports
// whether the subscriber already held a ban of key in force.
func (s *Subscriber) learn(key string, until time.Time) (known bool) {
	now := s.fleet.now()
	s.mu.Lock()
	old, ok := s.held[key]
	known = ok && old.After(now)
	if ok || len(s.held) < s.maxBans || s.pruneLocked(now) {
		s.held[key] = until
	}
	s.mu.Unlock()
	if !known || !old.Equal(until) {
		s.apply.Ban(key, until)
	}
	return known
}

// pruneLocked forgets the bans that ended; it reports whether room was
// made.
func (s *Subscriber) pruneLocked(now time.Time) bool {
	n := len(s.held)
	for k, until := range s.held {
		if !until.After(now) {
			delete(s.held, k)
		}
	}
	return len(s.held) < n
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
	s.mu.Lock()
	same := e == s.epoch
	s.mu.Unlock()
	if same && !full {
		return nil
	}
	list, err := s.fleet.List(ctx)
	if err != nil {
		return fmt.Errorf("fleet bans: sync: %w", err)
	}
	now := s.fleet.now()
	indexed := make(map[string]time.Time, len(list))
	for _, b := range list {
		indexed[b.Key] = b.Until
	}
	s.mu.Lock()
	lost := s.epoch != "" && e != s.epoch
	var missing []BanEntry
	s.pruneLocked(now)
	for k, until := range s.held {
		// Redis lost the index: a ban held that it indexes shorter was
		// raised again by a fresh count since, and the held end stands.
		if in, ok := indexed[k]; !ok || lost && in.Before(until) {
			missing = append(missing, BanEntry{Key: k, Until: until})
		}
	}
	s.mu.Unlock()
	if lost && len(missing) > 0 {
		if err := s.restore(ctx, missing); err != nil {
			return err // the epoch is kept: the next sync tries again
		}
	} else {
		for _, b := range missing {
			s.mu.Lock()
			delete(s.held, b.Key)
			s.mu.Unlock()
			s.apply.Lift(b.Key)
			if s.events != nil {
				s.events.Lifted(keyRule(b.Key))
			}
		}
	}
	for _, b := range list {
		if lost {
			s.mu.Lock()
			held := s.held[b.Key]
			s.mu.Unlock()
			if held.After(b.Until) {
				continue // written back above
			}
		}
		s.learn(b.Key, b.Until)
	}
	s.mu.Lock()
	s.epoch = e
	s.mu.Unlock()
	return nil
}

// keepHeld writes back bans the subscriber holds that Redis lost, within
// banCallTimeout; a failure is reported and left to the next sync (the
// held bans stay in force here meanwhile).
func (s *Subscriber) keepHeld(ctx context.Context, bans []BanEntry) {
	rctx, cancel := context.WithTimeout(ctx, banCallTimeout)
	defer cancel()
	if err := s.restore(rctx, bans); err != nil {
		s.fail(err)
	}
}

// restore writes back bans Redis lost: each unless a later one is there,
// indexed and published for the sidecars that did not hold it.
func (s *Subscriber) restore(ctx context.Context, bans []BanEntry) error {
	calls := make([]scriptCall, len(bans))
	for i, b := range bans {
		calls[i] = scriptCall{keys: []string{b.Key + banSuffix}, args: []any{b.Until.UnixMilli()}}
	}
	for _, cmd := range s.fleet.restore.evalEach(ctx, s.fleet.client, calls) {
		if err := cmd.Err(); err != nil {
			return fmt.Errorf("fleet bans: write back lost bans: %w", err)
		}
	}
	return s.fleet.announce(ctx, bans)
}

// keyRule returns a limit key's rule segment: "<prefix>:{tag}:<rule>:…".
func keyRule(key string) string {
	i := strings.Index(key, "}:")
	if i < 0 {
		return ""
	}
	rest := key[i+2:]
	if j := strings.IndexByte(rest, ':'); j >= 0 {
		return rest[:j]
	}
	return rest
}
