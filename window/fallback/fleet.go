package fallback

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Defaults of [FleetOptions].
const (
	DefaultFleetTTL = 3 * time.Second
)

// FleetOptions configures a [Fleet].
type FleetOptions struct {
	// Key is the sorted set the fleet announces itself in: one per domain,
	// shared by every sidecar of it (see [window.Keys.Fleet]). Required.
	Key string
	// ID names this member; empty means 16 random hex digits.
	ID string
	// TTL is how long an announcement lasts: a member that stops beating
	// (killed, partitioned) leaves the others' count within TTL. 0 means
	// DefaultFleetTTL. Beats go out every TTL/3. Give every member of a
	// fleet the same TTL: a member's count freezes one of its own beats
	// after Redis stopped answering, and counts only announcements still
	// live then.
	TTL time.Duration
	// Timeout bounds one beat; 0 means one second.
	Timeout time.Duration
}

// Fleet tells how many sidecars share a Redis, by heartbeat (see the
// package doc); its count is what the Fallback divides a limit by. It is
// safe for concurrent use.
type Fleet struct {
	hb      Heartbeat
	key, id string
	ttl     time.Duration
	timeout time.Duration
	now     func() time.Time
	// mu serialises beats, so that each merges the view of the one before;
	// it guards failing.
	mu sync.Mutex
	// failing is set when a beat failed after the last one that answered.
	failing bool
	// last is the last beat that answered; nil before the first.
	last atomic.Pointer[fleetView]
	// restarted is set when Redis restarted since the last beat that
	// answered (see Restarted).
	restarted atomic.Bool
}

// Restarted tells f that Redis restarted or failed over, so may have lost
// the fleet's set: the next beat that answers keeps every member it knew
// for a whole TTL from then, time to announce itself in the new set, however
// often Redis restarts. It implements redisstore.RestartListener (on the
// heartbeat's client); safe for concurrent use.
func (f *Fleet) Restarted() { f.restarted.Store(true) }

// fleetView is what the beats learnt up to one that answered: when it
// answered and every member counted live then, with its expiry on the local
// clock (UnixNano), sorted by expiry.
type fleetView struct {
	at      int64
	members map[string]int64
	// kept are the members counted though Redis no longer held them.
	kept map[string]bool
	// expiries are the members' expiries, sorted.
	expiries []int64
}

// Heartbeat keeps a fleet's announcements in the shared store (the Redis
// store's NewHeartbeat). Announce announces member id of the fleet at key
// until ttl from the store's clock, or with leave marks it departed for
// ttl; it drops the expired announcements and returns, on the store's
// clock, its time, every member announced with its expiry, and the members
// whose departure has not expired.
type Heartbeat interface {
	Announce(ctx context.Context, key, id string, ttl time.Duration, leave bool) (now time.Time, live map[string]time.Time, left []string, err error)
}

// NewFleet returns a Fleet on hb; it does not contact the store (see
// [Fleet.Beat] and [Fleet.Run]).
func NewFleet(hb Heartbeat, o FleetOptions) (*Fleet, error) {
	if hb == nil {
		return nil, errors.New("fleet: the heartbeat is nil")
	}
	if o.Key == "" {
		return nil, errors.New("fleet: no key given")
	}
	if o.TTL < 0 || o.Timeout < 0 {
		return nil, errors.New("fleet: TTL and timeout must not be negative")
	}
	if o.TTL == 0 {
		o.TTL = DefaultFleetTTL
	}
	if o.TTL < 30*time.Millisecond {
		return nil, fmt.Errorf("fleet: TTL %s: must be at least 30ms", o.TTL)
	}
	if o.Timeout == 0 {
		o.Timeout = time.Second
	}
	if strings.HasPrefix(o.ID, "\x00") {
		return nil, errors.New("fleet: an id must not begin with NUL (a departed member's mark)")
	}
	if o.ID == "" {
		var b [8]byte
		if _, err := rand.Read(b[:]); err != nil {
			return nil, fmt.Errorf("fleet: draw an id: %w", err)
		}
		o.ID = hex.EncodeToString(b[:])
	}
	return &Fleet{hb: hb, key: o.Key, id: o.ID, ttl: o.TTL,
		timeout: o.Timeout, now: time.Now}, nil
}

// ID returns this member's id.
func (f *Fleet) ID() string { return f.id }

// Size returns the live fleet size, at least 1 (this sidecar), and
// whether a beat has ever answered: the members whose announcement, as of
// the last beat that answered, has not expired yet. A member that stops
// beating leaves the count at its expiry (seen by the others' next beat).
// When this sidecar's beats stop answering (Redis down) or run late, the
// count freezes one beat after the last answer, while every member that was
// beating is still counted: an outage never shrinks N.
func (f *Fleet) Size() (n int, known bool) {
	v := f.last.Load()
	if v == nil {
		return 1, false
	}
	at := min(f.now().UnixNano(), v.at+int64(f.beat()))
	i, _ := slices.BinarySearch(v.expiries, at+1) // the first expiry after at
	return max(len(v.expiries)-i, 1), true
}

// Beat announces this member once and returns the live fleet size.
func (f *Fleet) Beat(ctx context.Context) (int, error) {
	if err := f.call(ctx, false); err != nil {
		return 0, err
	}
	n, _ := f.Size()
	return n, nil
}

// Leave removes this member's announcement, so that the others' count
// drops at once rather than after TTL.
func (f *Fleet) Leave(ctx context.Context) error {
	return f.call(ctx, true)
}

func (f *Fleet) call(ctx context.Context, leave bool) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, f.timeout)
	defer cancel()
	sent := f.now()
	now, live, left, err := f.hb.Announce(ctx, f.key, f.id, f.ttl, leave)
	if err != nil {
		f.failing = true
		return fmt.Errorf("fleet heartbeat on %s: %w", f.key, err)
	}
	if leave {
		return nil
	}
	f.last.Store(f.merge(now, live, left, sent, f.now()))
	f.failing = false
	return nil
}

// merge returns the view of a beat sent at sent that answered res at got:
// the members res holds live, and those of the last view that res neither
// holds nor says left while they would still be alive. After beats failed
// (an outage), the time the count stood frozen is added to their expiries,
// and a member Redis held at the last answer but holds no more (it lost the
// set) is kept a whole TTL from now, once: time for it to announce itself
// again; after a restart Redis told of (Restarted), every member is kept a
// whole TTL from now. f.mu is held.
func (f *Fleet) merge(storeNow time.Time, live map[string]time.Time, gone []string, sent, got time.Time) *fleetView {
	// The store's clock to ours: it read its time about halfway through
	// the round trip.
	mid := sent.UnixNano() + got.Sub(sent).Nanoseconds()/2
	offset := mid - storeNow.UnixNano()
	v := &fleetView{at: got.UnixNano(), members: make(map[string]int64, len(live))}
	for id, exp := range live {
		v.members[id] = exp.UnixNano() + offset
	}
	left := make(map[string]bool, len(gone))
	for _, id := range gone {
		left[id] = true
	}
	restarted := f.restarted.Swap(false)
	if prev := f.last.Load(); prev != nil {
		var frozen int64 // from one beat after the last answer (see Size) to now
		if f.failing {
			frozen = max(v.at-(prev.at+int64(f.beat())), 0)
		}
		for id, exp := range prev.members {
			if _, ok := v.members[id]; ok || left[id] {
				continue
			}
			exp += frozen
			switch {
			case restarted:
				// Redis restarted since: the member may not have reached
				// the new set yet, its beats failing through the restarts.
				exp = max(exp, v.at+int64(f.ttl))
			case exp <= v.at+int64(f.beat())/2:
				// Half a beat of margin: a member that just expired may
				// look alive by the clock offsets' jitter between two beats.
				continue
			case !prev.kept[id] && f.failing:
				exp = max(exp, v.at+int64(f.ttl))
			}
			v.members[id] = exp
			if v.kept == nil {
				v.kept = make(map[string]bool)
			}
			v.kept[id] = true
		}
	}
	v.expiries = make([]int64, 0, len(v.members))
	for _, exp := range v.members {
		v.expiries = append(v.expiries, exp)
	}
	slices.Sort(v.expiries)
	return v
}

// beat is the interval between heartbeats.
func (f *Fleet) beat() time.Duration { return f.ttl / 3 }

// Run beats every TTL/3 until ctx ends, then leaves (within the timeout).
// A failed beat keeps the last count; onErr, if not nil, is told of it.
func (f *Fleet) Run(ctx context.Context, onErr func(error)) {
	t := time.NewTicker(f.beat())
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			_ = f.Leave(context.WithoutCancel(ctx))
			return
		case <-t.C:
			if _, err := f.Beat(ctx); err != nil && ctx.Err() == nil && onErr != nil {
				onErr(err)
			}
		}
	}
}
