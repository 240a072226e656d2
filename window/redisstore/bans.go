package redisstore

// Fleet-wide bans: the Redis layout and the operator's API (Add, Lift, List,
// Get). The denial reporter is in banreport.go, the subscriber that keeps a
// sidecar's Guard in step in bansync.go; doc.go tells the whole story, and
// window/bans decides when a ban is raised, renewed, kept and lifted.
//
// Every key derives from a limit key K (window.Keys.Key) and reuses its
// {tag}, so it lives in K's Cluster slot:
//
//	K!bc              the fleet's denial counter of K: INCRBY n, PEXPIRE the
//	                  rule's ban window when created
//	K!ban             the ban: "<untilUnixMs>", PEXPIREAT until
//	<prefix>:bans     the index of bans in force, a sorted set: member K,
//	                  score untilUnixMs (members below now are stale and
//	                  pruned by readers), plus one epoch member "~<hex>" of
//	                  score +inf (see bansync.go)
//	channel <prefix>:bans   "ban <untilUnixMs> <K> [threshold|hand]" or
//	                  "lift <K>" (K never holds a space)

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashgate/flashgate/window"
	"github.com/flashgate/flashgate/window/bans"
)

// Suffixes of the keys a ban adds beside its limit key.
const (
	banSuffix     = "!ban"
	counterSuffix = "!bc"
)

// epochPrefix starts the index's epoch member; no limit key starts with it
// (a prefix is [A-Za-z0-9._-]).
const epochPrefix = "~"

// banCallTimeout bounds one Redis call of the fleet's background work (a
// flush, a sync) when the caller's context has no deadline.
const banCallTimeout = 2 * time.Second

// FleetBansOptions configures [NewFleetBans]. The zero value is valid.
type FleetBansOptions struct {
	// Clock: ClockRedis (default) takes a ban's start from Redis TIME;
	// ClockLocal from Now, for a Redis that forbids TIME in scripts.
	Clock Clock
	// Now is the local clock: the instant lists are pruned at and, on
	// ClockLocal, bans start at. nil means time.Now.
	Now func() time.Time
}

// FleetBans is the fleet's ban list on Redis: the operator's API (Add, Lift,
// List, Get), the denial [Reporter] (NewReporter) and the [Subscriber]
// (NewSubscriber) that keeps a sidecar's local bans in step. It is safe for
// concurrent use and holds no goroutine of its own; it does not close the
// client.
type FleetBans struct {
	client  redis.UniversalClient
	prefix  string // the keys' prefix, "<prefix>:{"
	index   string // the index sorted set, also the channel's name
	local   bool   // ClockLocal
	now     func() time.Time
	report  *script // reportLua
	restore *script // restoreBanLua
	epoch   *script // epochLua
}

// NewFleetBans returns the ban list of the limit keys keys builds, on
// client. It does not contact Redis.
func NewFleetBans(client redis.UniversalClient, keys window.Keys, opts FleetBansOptions) (*FleetBans, error) {
	if client == nil {
		return nil, errors.New("fleet bans: the client is nil")
	}
	switch opts.Clock {
	case ClockRedis, ClockLocal:
	default:
		return nil, fmt.Errorf("fleet bans: unknown clock %d", opts.Clock)
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	p := keys.Prefix()
	return &FleetBans{
		client:  client,
		prefix:  p + ":{",
		index:   p + ":bans",
		local:   opts.Clock == ClockLocal,
		now:     opts.Now,
		report:  newScript(reportLua),
		restore: newScript(restoreBanLua),
		epoch:   newScript(epochLua),
	}, nil
}

// Channel returns the Pub/Sub channel the fleet's ban messages go on; it is
// also the index's key.
func (b *FleetBans) Channel() string { return b.index }

// checkKey reports whether key is a limit key of b's prefix, as
// window.Keys builds them: the layout relies on it (no space, bounded).
func (b *FleetBans) checkKey(key string) error {
	if !strings.HasPrefix(key, b.prefix) || len(key) > window.MaxKeyLen || strings.ContainsAny(key, " \r\n") {
		return fmt.Errorf("fleet bans: %q is not a limit key of prefix %q", truncID(key), strings.TrimSuffix(b.prefix, ":{"))
	}
	return nil
}

// Add bans key until until on every sidecar: it sets K!ban, indexes it and
// publishes it. An existing ban of key is replaced (shortened too). until
// must be in the future, within bans.CheckDuration.
func (b *FleetBans) Add(ctx context.Context, key string, until time.Time) error {
	if err := b.checkKey(key); err != nil {
		return err
	}
	if err := bans.CheckDuration(until.Sub(b.now())); err != nil {
		return fmt.Errorf("fleet bans: ban of %s ending %s: %w", key, until.Format(time.RFC3339), err)
	}
	ms := until.UnixMilli()
	pipe := b.client.Pipeline()
	pipe.Do(ctx, "SET", key+banSuffix, ms, "PXAT", ms)
	pipe.ZAdd(ctx, b.index, redis.Z{Score: float64(ms), Member: key})
	pipe.Publish(ctx, b.index, banMessage(ms, key, bans.ByHand))
	if _, err := pipe.Exec(ctx); err != nil {
		return fmt.Errorf("fleet bans: add %s: %w", key, err)
	}
	return nil
}

// Lift ends key's ban on every sidecar: it deletes K!ban and K's denial
// counter (and K itself, its window, if resetWindow), unindexes it and
// publishes the lift. Lifting a key that is not banned is not an error.
func (b *FleetBans) Lift(ctx context.Context, key string, resetWindow bool) error {
	if err := b.checkKey(key); err != nil {
		return err
	}
	pipe := b.client.Pipeline()
	pipe.Del(ctx, key+banSuffix, key+counterSuffix)
	if resetWindow {
		pipe.Del(ctx, key)
	}
	pipe.ZRem(ctx, b.index, key)
	pipe.Publish(ctx, b.index, "lift "+key)
	if _, err := pipe.Exec(ctx); err != nil {
		return fmt.Errorf("fleet bans: lift %s: %w", key, err)
	}
	return nil
}

// List returns the bans in force, soonest to end first, after pruning the
// index of the ended ones.
func (b *FleetBans) List(ctx context.Context) ([]bans.Entry, error) {
	now := b.now().UnixMilli()
	pipe := b.client.Pipeline()
	pipe.ZRemRangeByScore(ctx, b.index, "-inf", "("+strconv.FormatInt(now, 10))
	rows := pipe.ZRangeByScoreWithScores(ctx, b.index, &redis.ZRangeBy{Min: strconv.FormatInt(now, 10), Max: "+inf"})
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, fmt.Errorf("fleet bans: list: %w", err)
	}
	return b.entries(rows.Val()), nil
}

// entries turns index rows into bans, skipping the epoch member.
func (b *FleetBans) entries(rows []redis.Z) []bans.Entry {
	out := make([]bans.Entry, 0, len(rows))
	for _, z := range rows {
		k, ok := z.Member.(string)
		if !ok || strings.HasPrefix(k, epochPrefix) || math.IsInf(z.Score, 0) {
			continue
		}
		out = append(out, bans.Entry{Key: k, Until: time.UnixMilli(int64(z.Score))})
	}
	return out
}

// Get reports whether key is banned, and until when.
func (b *FleetBans) Get(ctx context.Context, key string) (until time.Time, banned bool, err error) {
	if err := b.checkKey(key); err != nil {
		return time.Time{}, false, err
	}
	v, err := b.client.Get(ctx, key+banSuffix).Result()
	if errors.Is(err, redis.Nil) {
		return time.Time{}, false, nil
	}
	if err != nil {
		return time.Time{}, false, fmt.Errorf("fleet bans: get %s: %w", key, err)
	}
	ms, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return time.Time{}, false, fmt.Errorf("fleet bans: get %s: value %q is not a time in ms", key, truncID(v))
	}
	until = time.UnixMilli(ms)
	return until, until.After(b.now()), nil
}

// announce indexes bans set by a script (a threshold crossed, a lost ban
// written back) and publishes them, in one pipeline; an index entry is
// only moved later (ZADD GT).
func (b *FleetBans) announce(ctx context.Context, list []bans.Entry) error {
	pipe := b.client.Pipeline()
	for _, e := range list {
		ms := e.Until.UnixMilli()
		pipe.ZAddArgs(ctx, b.index, redis.ZAddArgs{GT: true, Members: []redis.Z{{Score: float64(ms), Member: e.Key}}})
		pipe.Publish(ctx, b.index, banMessage(ms, e.Key, bans.ByThreshold))
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return fmt.Errorf("fleet bans: index and publish %d bans: %w", len(list), err)
	}
	return nil
}

// banMessage is the channel's message that bans key until ms.
func banMessage(ms int64, key string, by bans.Origin) string {
	return "ban " + strconv.FormatInt(ms, 10) + " " + key + " " + by.String()
}

// banEvent is a parsed channel message.
type banEvent struct {
	lift  bool
	key   string
	until time.Time
	by    bans.Origin
}

// parseBanMessage reads a channel message; ok is false for anything else.
func parseBanMessage(msg string) (ev banEvent, ok bool) {
	f := strings.Fields(msg)
	switch {
	case len(f) == 2 && f[0] == "lift":
		return banEvent{lift: true, key: f[1]}, true
	case (len(f) == 3 || len(f) == 4) && f[0] == "ban":
		ms, err := strconv.ParseInt(f[1], 10, 64)
		if err != nil || ms <= 0 {
			return banEvent{}, false
		}
		ev := banEvent{key: f[2], until: time.UnixMilli(ms)}
		if len(f) == 4 && f[3] == "hand" {
			ev.by = bans.ByHand
		}
		return ev, true
	}
	return banEvent{}, false
}

// reportLua is bans.Tally.Deny on Redis, for the fleet's count: atomic, so
// that the sidecars' reports of one key meet in one counter.
//
//	KEYS[1]: K!bc, KEYS[2]: K!ban.
//	ARGV: denials n, threshold, ban window (ms), ban duration (ms), now in
//	  ms as a decimal string or "" for Redis TIME, bans.RenewEvery (ms).
//	Reply: {count, until, state}: count, the counter after adding n (0 once
//	  it raised a ban: it is reset); until, the ban's end in Unix ms (0: no
//	  ban); state 0: nothing changed, 1: raised, 2: renewed.
//
// The counter lives one ban window from its first denial. When it passes
// the threshold the ban is set to now + duration when bans.Due says so; the
// counter is then reset.
const reportLua = `local c = redis.call('INCRBY', KEYS[1], ARGV[1])
if c == tonumber(ARGV[1]) then
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
end
local now = ARGV[5]
if now == '' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
else
  now = tonumber(now)
end
local cur = tonumber(redis.call('GET', KEYS[2]) or '0') or 0
if cur <= now then
  cur = 0
end
if c <= tonumber(ARGV[2]) then
  return { c, cur, 0 }
end
local untl = now + tonumber(ARGV[4])
if cur >= untl - tonumber(ARGV[6]) then
  return { c, cur, 0 }
end
local s = string.format('%d', untl)
redis.call('SET', KEYS[2], s, 'PXAT', s)
redis.call('DEL', KEYS[1])
if cur > 0 then
  return { 0, untl, 2 }
end
return { 0, untl, 1 }`

// restoreBanLua sets a ban unless one ending later is there.
//
//	KEYS[1]: K!ban. ARGV[1]: until in Unix ms.
//	Reply: 1 if it set the ban, 0 if a later one was there.
const restoreBanLua = `local cur = tonumber(redis.call('GET', KEYS[1]) or '0') or 0
if cur >= tonumber(ARGV[1]) then
  return 0
end
redis.call('SET', KEYS[1], ARGV[1], 'PXAT', ARGV[1])
return 1`

// epochLua returns the index's epoch member (in a one-element array),
// creating it as ARGV[1] when the
// index has none (Redis lost it: restarted empty, flushed, or a fresh one).
//
//	KEYS[1]: the index. ARGV[1]: a new epoch member ("~" and random hex).
const epochLua = `local e = redis.call('ZRANGEBYSCORE', KEYS[1], '+inf', '+inf', 'LIMIT', 0, 1)
if e[1] then
  return e
end
redis.call('ZADD', KEYS[1], '+inf', ARGV[1])
return { ARGV[1] }`
