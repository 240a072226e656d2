package window

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// Defaults of [FleetOptions].
const (
	DefaultFleetTTL = 3 * time.Second
)

// fleetLua announces a member until now + ttl, drops the expired ones and
// returns Redis's time and the expiry of every live member (ms). The score
// of a member is its expiry (Redis TIME), so every member may have its own
// TTL; the caller counts the members still live when it is asked, so that
// a member that stopped beating drops out of the count at its expiry, not
// at the next beat.
//
// KEYS[1]: the fleet's sorted set. ARGV[1]: member. ARGV[2]: ttl in ms.
// ARGV[3]: "1" to leave (remove the member) instead of announcing it.
const fleetLua = `
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[2])
if ARGV[3] == '1' then
  redis.call('ZREM', KEYS[1], ARGV[1])
else
  redis.call('ZADD', KEYS[1], now + ttl, ARGV[1])
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
if last[2] then
  redis.call('PEXPIREAT', KEYS[1], last[2]) -- the latest member's expiry, whoever beat last
end
local live = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now, '+inf', 'WITHSCORES')
local out = { now }
for i = 2, #live, 2 do
  out[#out + 1] = tonumber(live[i])
end
return out
`

// FleetOptions configures a [Fleet].
type FleetOptions struct {
	// Key is the sorted set the fleet announces itself in: one per domain,
	// shared by every sidecar of it (see [Keys.Fleet]). Required.
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

// Fleet tells how many sidecars share a Redis: each announces itself with a
// heartbeat (a member of one small sorted set per domain, scored by its
// expiry) and counts the live ones. The count is what the local failure
// mode divides a limit by ([Fallback]). While Redis cannot be reached the
// last count is kept: sidecars that die during an outage make the estimate
// too large, which makes the fallback stricter, never looser.
//
// Fleet is safe for concurrent use.
type Fleet struct {
	client  rediser
	script  *redis.Script
	key, id string
	ttl     time.Duration
	timeout time.Duration
	now     func() time.Time
	// last is the last beat that answered; nil before the first.
	last atomic.Pointer[fleetView]
}

// fleetView is what one beat learnt: when it answered and the live
// members' expiries, on the local clock (UnixNano), sorted.
type fleetView struct {
	at       int64
	expiries []int64
}

// NewFleet returns a Fleet on client; it does not contact Redis (see
// [Fleet.Beat] and [Fleet.Run]).
func NewFleet(client rediser, o FleetOptions) (*Fleet, error) {
	if client == nil {
		return nil, errors.New("fleet: the client is nil")
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
	if o.ID == "" {
		var b [8]byte
		if _, err := rand.Read(b[:]); err != nil {
			return nil, fmt.Errorf("fleet: draw an id: %w", err)
		}
		o.ID = hex.EncodeToString(b[:])
	}
	return &Fleet{client: client, script: redis.NewScript(fleetLua), key: o.Key, id: o.ID, ttl: o.TTL,
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
	if err := f.call(ctx, "0"); err != nil {
		return 0, err
	}
	n, _ := f.Size()
	return n, nil
}

// Leave removes this member's announcement, so that the others' count
// drops at once rather than after TTL.
func (f *Fleet) Leave(ctx context.Context) error {
	return f.call(ctx, "1")
}

func (f *Fleet) call(ctx context.Context, leave string) error {
	ctx, cancel := context.WithTimeout(ctx, f.timeout)
	defer cancel()
	sent := f.now()
	res, err := f.script.Run(ctx, f.client, []string{f.key}, f.id, f.ttl.Milliseconds(), leave).Int64Slice()
	if err != nil {
		return fmt.Errorf("fleet heartbeat on %s: %w", f.key, err)
	}
	if len(res) == 0 {
		return fmt.Errorf("fleet heartbeat on %s: an empty reply", f.key)
	}
	if leave == "1" {
		return nil
	}
	// Redis's clock to ours: Redis read TIME about halfway through the
	// round trip.
	got := f.now()
	mid := sent.UnixNano() + got.Sub(sent).Nanoseconds()/2
	offset := mid - res[0]*int64(time.Millisecond)
	exp := make([]int64, 0, len(res)-1)
	for _, e := range res[1:] {
		exp = append(exp, e*int64(time.Millisecond)+offset)
	}
	slices.Sort(exp)
	f.last.Store(&fleetView{at: got.UnixNano(), expiries: exp})
	return nil
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

// Fleet returns the heartbeat key of domain's fleet: "<prefix>:fleet:" and
// the domain, hashed like a value when it is long or unsafe. It cannot
// collide with a limit key, whose second segment is a "{tag}".
func (k Keys) Fleet(domain string) string {
	var b strings.Builder
	b.WriteString(k.Prefix())
	b.WriteString(":fleet:")
	if len(domain) <= MaxVerbatim && verbatim(domain) && domain != "" {
		b.WriteString(domain)
	} else {
		writeHashed(&b, sha256.Sum256([]byte(domain)))
	}
	return b.String()
}
