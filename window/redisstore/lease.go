package redisstore

import (
	"context"
	_ "embed"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/flashgate/flashgate/window"
)

//go:embed lease.lua
var leaseLua string

// LeaseCall is one call of the reserving script on one exact key: it
// returns Back's unused slots, then reserves up to Want slots for a lease
// of For (see docs/design.md, "Leased admissions").
type LeaseCall struct {
	// Key and Limit are the leased hit's; Limit must be an exact log.
	Key   string
	Limit window.Limit
	// For is the lease's length: each slot is scored at Redis's now + For.
	For time.Duration
	// ID names the lease: its slots are ID#1 … ID#n. From [Redis.LeaseID];
	// the same on a retry of the call, which then grants nothing twice.
	ID string
	// Want is how many slots to reserve; 0 only returns Back's. Least is
	// the fewest worth a grant (1 to Want, 0 means 1): with less room than
	// that the call grants nothing and RetryAfter says when Least fit.
	Want, Least int
	// Back returns the slots BackID#BackFrom … BackID#BackTo of an
	// earlier, closed lease on Key; BackID "" returns none.
	BackID           string
	BackFrom, BackTo int
}

// Grant is the reserving script's answer.
type Grant struct {
	// Slots reserved, at most Want.
	Slots int
	// Count is the key's entries after the call, the slots included.
	Count int
	// RetryAfter, when Slots is 0 and Want was not, is how long until
	// Least more entries fit the window.
	RetryAfter time.Duration
	// Returned is how many of Back's slots were still in the key.
	Returned int
}

// storeIDLen is the length of [Redis.ID]: the hex digits of the member
// ids' random prefix.
const storeIDLen = 16

// ID returns the store's id, drawn at New: the hex digits that follow the
// 0x02 of every lease id it makes, so that a key's reader tells which
// sidecar holds a lease's slots ([WindowState.Leases]).
func (r *Redis) ID() string { return hex.EncodeToString(r.idPrefix[:]) }

// LeaseID returns a new lease id, unique among the stores sharing the
// Redis: 0x02, never the first byte of a request's or a write-back's
// member id, then the store's random prefix and a counter, in hex.
func (r *Redis) LeaseID() string {
	var b [8 + binary.MaxVarintLen64]byte
	copy(b[:], r.idPrefix[:])
	n := binary.PutUvarint(b[8:], r.idNext.Add(1))
	return "\x02" + hex.EncodeToString(b[:8+n])
}

// Lease runs c: one script call on c.Key's node, at once (never queued
// behind the auto-pipeline), so that the caller's deadline, taken before
// the call, starts before Redis's now. It is safe for concurrent use.
func (r *Redis) Lease(ctx context.Context, c LeaseCall) (Grant, error) {
	if r.closed.Load() {
		return Grant{}, fmt.Errorf("redis lease: %w", window.ErrClosed)
	}
	switch {
	case c.Key == "" || (c.ID == "" && c.Want > 0):
		return Grant{}, errors.New("redis lease: empty key or lease id")
	case c.Limit.Buckets > 0:
		return Grant{}, fmt.Errorf("redis lease: %s: a lease needs an exact window", c.Limit)
	case c.Want < 0 || c.Want > c.Limit.Requests || c.Least < 0 || c.Least > max(c.Want, 1) || c.For <= 0 || c.BackFrom < 0 || c.BackTo > window.MaxRequests:
		return Grant{}, fmt.Errorf("redis lease: want %d of %s for %s: out of range", c.Want, c.Limit, c.For)
	}
	if err := c.Limit.Validate(); err != nil {
		return Grant{}, fmt.Errorf("redis lease: %w", err)
	}
	now := ""
	if r.local {
		now = strconv.FormatInt(r.now().UnixMicro(), 10)
	}
	from, to := c.BackFrom, c.BackTo
	if c.BackID == "" {
		from, to = 1, 0
	}
	keys := []string{c.Key}
	if q := queueKey(c.Key); q != "" && c.Want > 0 {
		keys = append(keys, q)
	}
	res, err := r.lease.eval(ctx, r.client, keys, []any{
		c.ID, c.Want, c.Limit.Requests, c.Limit.Window.Microseconds(), c.For.Microseconds(), now,
		c.BackID, from, to, max(c.Least, 1),
	})
	if err != nil {
		return Grant{}, fmt.Errorf("redis lease: %w", classified(err))
	}
	return parseGrant(res)
}

// queueKey returns the key in key's hash slot that holds the order of its
// refused reservations (lease.lua), "" when no such name is sure to share
// the slot (a key with braces but no hash tag): its refusals then go
// unordered.
func queueKey(key string) string {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			return key + ":lq"
		}
		return ""
	}
	if strings.IndexByte(key, '}') >= 0 {
		return ""
	}
	return "{" + key + "}:lq"
}

// parseGrant reads lease.lua's reply.
func parseGrant(res []any) (Grant, error) {
	if len(res) != 5 {
		return Grant{}, fmt.Errorf("redis lease: script replied %d values, want 5", len(res))
	}
	var v [4]int64
	for i := range v {
		n, ok := res[1+i].(int64)
		if !ok {
			return Grant{}, fmt.Errorf("redis lease: script replied %T at %d, want an integer", res[1+i], 1+i)
		}
		v[i] = n
	}
	return Grant{Slots: int(v[0]), Count: int(v[1]), RetryAfter: time.Duration(v[2]) * time.Microsecond, Returned: int(v[3])}, nil
}

// Member returns a new request member id, for [WithMember].
func (r *Redis) Member() string { return r.member() }

type memberKey struct{}

// WithMember returns ctx under which a Decide of this store records its
// request as member (from [Redis.Member]) instead of a fresh id, so that
// the caller can take the admission back with [Redis.Undo] through the
// layers between them: a decorator that decides a request's hits in two
// parts (window/lease) keeps them all or nothing this way.
func WithMember(ctx context.Context, member string) context.Context {
	return context.WithValue(ctx, memberKey{}, member)
}

// memberFor returns ctx's member id (WithMember), or a fresh one.
func (r *Redis) memberFor(ctx context.Context) string {
	if m, ok := ctx.Value(memberKey{}).(string); ok && m != "" {
		return m
	}
	return r.member()
}

// Undo takes back what a Decide under WithMember(ctx, member) recorded on
// hits' keys (the compensation a Cluster's partial admission gets): a
// request the caller ends up denying leaves no entry. It runs even if ctx
// is done; a removal that fails leaves the entries to age out with their
// windows, stricter.
func (r *Redis) Undo(ctx context.Context, member string, hits []window.Hit) {
	if member == "" || len(hits) == 0 {
		return
	}
	undo := make([]bool, len(hits))
	for i := range undo {
		undo[i] = true
	}
	r.compensate(ctx, hits, member, make([]window.HitState, len(hits)), undo, make([]bool, len(hits)))
}
