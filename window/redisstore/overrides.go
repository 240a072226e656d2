package redisstore

// Fleet-wide overrides: the Redis layout and the operator's API (Set,
// Clear, Get, List, History). The follower that keeps a sidecar's
// overrides.Book in step is in overridesync.go; window/overrides decides
// what an override may say and how it applies.
//
// Both keys share the hash tag {all}, so they live in one Cluster slot
// and change in one transaction; their second segment is not a hash tag,
// so they cannot collide with a limit key ("<prefix>:{tag}:..."):
//
//	<prefix>:overrides:{all}       a hash: field "<domain>\x00<rule>" holds
//	                               an override as JSON; field "~epoch" a
//	                               random value that only Redis losing the
//	                               hash removes (see overridesync.go).
//	                               Ended overrides are pruned by writers
//	                               and ignored by readers.
//	<prefix>:overrides:{all}:log   the audit history, a list of events as
//	                               JSON, newest first, trimmed to
//	                               overrides.MaxHistory
//	channel <prefix>:overrides     "set <domain>/<rule>", "clear …",
//	                               "restore <n>": a sidecar reads the hash
//	                               whole on each.

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashgate/flashgate/window"
	"github.com/flashgate/flashgate/window/overrides"
)

// epochField is the override hash's epoch field; no target's field starts
// with "~" followed by no NUL.
const epochField = "~epoch"

// Overrides is the fleet's overrides on Redis: the operator's API and
// [Overrides.NewFollower]. It is safe for concurrent use, holds no
// goroutine and does not close the client.
type Overrides struct {
	client  redis.UniversalClient
	hash    string
	log     string
	channel string
	now     func() time.Time
}

// NewOverrides returns the overrides of the sidecars whose keys keys
// builds, on client; now is the clock that ends them (nil: time.Now). It
// does not contact Redis.
func NewOverrides(client redis.UniversalClient, keys window.Keys, now func() time.Time) (*Overrides, error) {
	if client == nil {
		return nil, errors.New("overrides: the client is nil")
	}
	if now == nil {
		now = time.Now
	}
	p := keys.Prefix()
	return &Overrides{client: client, hash: p + ":overrides:{all}", log: p + ":overrides:{all}:log", channel: p + ":overrides", now: now}, nil
}

// Channel returns the Pub/Sub channel of the overrides' changes.
func (s *Overrides) Channel() string { return s.channel }

func field(t overrides.Target) string { return t.Domain + "\x00" + t.Rule }

func newEpoch() (string, error) {
	var rnd [8]byte
	if _, err := rand.Read(rnd[:]); err != nil {
		return "", fmt.Errorf("draw an epoch: %w", err)
	}
	return hex.EncodeToString(rnd[:]), nil
}

// Set puts o in force on every sidecar, replacing its rule's override, and
// records it in the history. The caller has checked it
// (overrides.Override.Check).
func (s *Overrides) Set(ctx context.Context, o *overrides.Override) error {
	v, err := json.Marshal(o)
	if err != nil {
		return fmt.Errorf("overrides: set %s: %w", o.Target, err)
	}
	ev, err := json.Marshal(overrides.Event{Op: "set", At: o.Set, By: o.By, Reason: o.Reason, Override: o})
	if err != nil {
		return fmt.Errorf("overrides: set %s: %w", o.Target, err)
	}
	epoch, err := newEpoch()
	if err != nil {
		return fmt.Errorf("overrides: set %s: %w", o.Target, err)
	}
	_, err = s.client.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.HSetNX(ctx, s.hash, epochField, epoch)
		p.HSet(ctx, s.hash, field(o.Target), v)
		s.record(ctx, p, ev)
		p.Publish(ctx, s.channel, "set "+o.Target.String())
		return nil
	})
	if err != nil {
		return fmt.Errorf("overrides: set %s: %w", o.Target, err)
	}
	return nil
}

// record adds ev to the history, within its bound.
func (s *Overrides) record(ctx context.Context, p redis.Pipeliner, ev []byte) {
	p.LPush(ctx, s.log, ev)
	p.LTrim(ctx, s.log, 0, overrides.MaxHistory-1)
}

// Clear ends t's override on every sidecar and records it (by, reason) in
// the history; it returns the override that was in force, nil if none
// (clearing then is not an error, and is recorded too).
func (s *Overrides) Clear(ctx context.Context, t overrides.Target, by, reason string) (*overrides.Override, error) {
	was, err := s.Get(ctx, t)
	if err != nil {
		return nil, err
	}
	ev, err := json.Marshal(overrides.Event{Op: "clear", At: s.now(), By: by, Reason: reason, Override: orTarget(was, t)})
	if err != nil {
		return nil, fmt.Errorf("overrides: clear %s: %w", t, err)
	}
	_, err = s.client.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.HDel(ctx, s.hash, field(t))
		s.record(ctx, p, ev)
		p.Publish(ctx, s.channel, "clear "+t.String())
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("overrides: clear %s: %w", t, err)
	}
	return was, nil
}

func orTarget(o *overrides.Override, t overrides.Target) *overrides.Override {
	if o != nil {
		return o
	}
	return &overrides.Override{Target: t}
}

// Get returns t's override in force, nil if none.
func (s *Overrides) Get(ctx context.Context, t overrides.Target) (*overrides.Override, error) {
	v, err := s.client.HGet(ctx, s.hash, field(t)).Result()
	if errors.Is(err, redis.Nil) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("overrides: get %s: %w", t, err)
	}
	o, err := decode(v)
	if err != nil || !o.InForce(s.now()) {
		return nil, err
	}
	return o, nil
}

// List returns the overrides in force, soonest to end first, pruning the
// hash of the ended ones.
func (s *Overrides) List(ctx context.Context) ([]*overrides.Override, error) {
	m, err := s.client.HGetAll(ctx, s.hash).Result()
	if err != nil {
		return nil, fmt.Errorf("overrides: list: %w", err)
	}
	list, _, ended := s.parse(m)
	if len(ended) > 0 {
		if err := s.client.HDel(ctx, s.hash, ended...).Err(); err != nil {
			return nil, fmt.Errorf("overrides: prune the ended: %w", err)
		}
	}
	return list, nil
}

// parse reads the hash: the overrides in force (sorted), the epoch, and
// the fields of the ended or unreadable ones.
func (s *Overrides) parse(m map[string]string) (list []*overrides.Override, epoch string, ended []string) {
	now := s.now()
	for f, v := range m {
		if f == epochField {
			epoch = v
			continue
		}
		o, err := decode(v)
		if err != nil || !o.InForce(now) || field(o.Target) != f {
			ended = append(ended, f)
			continue
		}
		list = append(list, o)
	}
	overrides.Sort(list)
	return list, epoch, ended
}

func decode(v string) (*overrides.Override, error) {
	var o overrides.Override
	if err := json.Unmarshal([]byte(v), &o); err != nil {
		return nil, fmt.Errorf("overrides: a stored override is not JSON: %w", err)
	}
	return &o, nil
}

// History returns the last n sets and clears (at most
// overrides.MaxHistory), newest first; n ≤ 0 means all kept.
func (s *Overrides) History(ctx context.Context, n int) ([]overrides.Event, error) {
	if n <= 0 || n > overrides.MaxHistory {
		n = overrides.MaxHistory
	}
	rows, err := s.client.LRange(ctx, s.log, 0, int64(n-1)).Result()
	if err != nil {
		return nil, fmt.Errorf("overrides: history: %w", err)
	}
	out := make([]overrides.Event, 0, len(rows))
	for _, r := range rows {
		var ev overrides.Event
		if json.Unmarshal([]byte(r), &ev) == nil && ev.Override != nil && (ev.Op == "set" || ev.Op == "clear") {
			out = append(out, ev)
		}
	}
	return out, nil
}

// restore writes back overrides that Redis lost, each unless its rule has
// one again, and nudges the sidecars.
func (s *Overrides) restore(ctx context.Context, lost []*overrides.Override) error {
	_, err := s.client.TxPipelined(ctx, func(p redis.Pipeliner) error {
		for _, o := range lost {
			v, err := json.Marshal(o)
			if err != nil {
				return err
			}
			p.HSetNX(ctx, s.hash, field(o.Target), v)
		}
		p.Publish(ctx, s.channel, "restore "+strconv.Itoa(len(lost)))
		return nil
	})
	if err != nil {
		return fmt.Errorf("overrides: write back %d lost overrides: %w", len(lost), err)
	}
	return nil
}
