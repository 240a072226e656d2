package window

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// Defaults of [FleetOptions].
const (
	DefaultFleetTTL = 3 * time.Second
)

// fleetLua announces a member until now + ttl and counts the members whose
// announcement is still live one beat from now. The score of a member is
// its expiry (Redis TIME, ms), so every member may have its own TTL.
// Counting one beat ahead makes a member that stopped beating drop out of
// the count within its TTL as the others read it (they read it once a
// beat); a live member, whose announcement is renewed every beat, is still
// counted if its beats run up to TTL - 2 beats late.
//
// KEYS[1]: the fleet's sorted set. ARGV[1]: member. ARGV[2]: ttl in ms.
// ARGV[3]: "1" to leave (remove the member) instead of announcing it.
// ARGV[4]: one beat in ms (the lookahead).
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
redis.call('PEXPIRE', KEYS[1], ttl)
return redis.call('ZCOUNT', KEYS[1], '(' .. (now + tonumber(ARGV[4])), '+inf')
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
	// DefaultFleetTTL. Beats go out every TTL/3.
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
	size    atomic.Int64 // last count; 0 before the first beat answered
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
	return &Fleet{client: client, script: redis.NewScript(fleetLua), key: o.Key, id: o.ID, ttl: o.TTL, timeout: o.Timeout}, nil
}

// ID returns this member's id.
func (f *Fleet) ID() string { return f.id }

// Size returns the live fleet size last counted, at least 1 (this
// sidecar), and whether a beat has ever answered.
func (f *Fleet) Size() (n int, known bool) {
	s := f.size.Load()
	return max(int(s), 1), s > 0
}

// Beat announces this member once and returns the live fleet size.
func (f *Fleet) Beat(ctx context.Context) (int, error) {
	return f.call(ctx, "0")
}

// Leave removes this member's announcement, so that the others' count
// drops at once rather than after TTL.
func (f *Fleet) Leave(ctx context.Context) error {
	_, err := f.call(ctx, "1")
	return err
}

func (f *Fleet) call(ctx context.Context, leave string) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, f.timeout)
	defer cancel()
	n, err := f.script.Run(ctx, f.client, []string{f.key}, f.id, f.ttl.Milliseconds(), leave, f.beat().Milliseconds()).Int64()
	if err != nil {
		return 0, fmt.Errorf("fleet heartbeat on %s: %w", f.key, err)
	}
	if leave != "1" {
		f.size.Store(max(n, 1))
	}
	return int(n), nil
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
