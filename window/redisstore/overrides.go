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
//	                               the rule's latest entry as JSON: an
//	                               override, or a clear's tombstone
//	                               ("cleared"), with its revision "rev";
//	                               field "~rev" the highest revision given;
//	                               field "~epoch" a random value that only
//	                               Redis losing the hash removes (see
//	                               overridesync.go). An entry stays until
//	                               its horizon (overrides.Override.Horizon),
//	                               ended or not, so that it outranks an
//	                               older one a sidecar writes back; then
//	                               the operator's List prunes it.
//	<prefix>:overrides:{all}:log   the audit history, a list of events as
//	                               JSON, newest first, trimmed to
//	                               overrides.MaxHistory
//	<prefix>:overrides:{all}:req:<id>  a set's or clear's revision, for
//	                               requestTTL: <id> is the request's,
//	                               random, so that a retry of the script
//	                               (a reply lost) writes nothing twice
//	channel <prefix>:overrides     "set <domain>/<rule>", "clear …",
//	                               "restore <n>": a sidecar reads the hash
//	                               whole on each.
//
// Revisions and times are Redis's: a set or clear is stamped by one
// script, on the clock of the node that holds the hash, with a revision
// max(~rev+1, Redis's time in ms, the field's revision+1), so that a set
// after Redis lost the hash still outranks what the sidecars write back,
// and a set or clear outranks whatever its field holds. A revision above
// overrides.MaxRev (Redis's time in ms plus the clock slack) no writer
// gave: the scripts count it as none (it neither outranks an entry
// written back nor raises the next revision) and Verify skips its entry.
// The sidecars read Redis's TIME with the hash and end overrides on that
// clock.

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/redis/go-redis/v9"

	"github.com/flashgate/flashgate/window"
	"github.com/flashgate/flashgate/window/overrides"
)

// Fields of the override hash that name no target: no target's field
// starts with "~" followed by no NUL.
const (
	epochField = "~epoch"
	revField   = "~rev"
)

// overrideTimeLua returns Redis's TIME on the node that holds KEYS[1].
const overrideTimeLua = `return redis.call('TIME')`

// overrideReadLua creates the epoch ARGV[1] unless it is "" or one is
// there, and returns {TIME, HGETALL KEYS[1]}: the hash on the clock of its
// node.
const overrideReadLua = `
if ARGV[1] ~= '' then
  redis.call('HSETNX', KEYS[1], '` + epochField + `', ARGV[1])
end
return {redis.call('TIME'), redis.call('HGETALL', KEYS[1])}
`

// overrideRevLua defines, for the scripts that write entries, bound (the
// highest revision a writer can have given by now: Redis's time in ms plus
// ARGV[slack], overrides.MaxRev), now (Redis's time in ms), top (the
// hash's "~rev", 0 if above bound) and fieldRev(f): the revision of field
// f's entry, nil for no field, 0 for none readable or one above bound (no
// writer gave it: it outranks nothing).
const overrideRevLua = `
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local bound = now + tonumber(ARGV[slack])
local top = tonumber(redis.call('HGET', KEYS[1], '` + revField + `') or '0') or 0
if top > bound then
  top = 0
end
local function fieldRev(f)
  local cur = redis.call('HGET', KEYS[1], f)
  if not cur then
    return nil
  end
  local ok, d = pcall(cjson.decode, cur)
  if ok and type(d) == 'table' and type(d.rev) == 'number' and d.rev <= bound then
    return d.rev
  end
  return 0
end
`

// overrideSetLua writes the entry ARGV[2] (a JSON object without "rev")
// in field ARGV[1] of KEYS[1] with the next revision, max(~rev + 1, now,
// the field's + 1), creates the epoch ARGV[4], adds the event ARGV[3] to
// the history KEYS[2] (trimmed to ARGV[5]) and publishes ARGV[7] on
// ARGV[6]; ARGV[8] is the clock slack in ms. It returns the revision, and
// keeps it in the request's key KEYS[3] for ARGV[9] ms: while that key
// lives, the script (retried) returns its revision and writes nothing.
const overrideSetLua = `
local done = redis.call('GET', KEYS[3])
if done then
  return done
end
local slack = 8` + overrideRevLua + `
local rev = string.format('%d', math.max(top + 1, now, (fieldRev(ARGV[1]) or 0) + 1))
redis.call('SET', KEYS[3], rev, 'PX', ARGV[9])
redis.call('HSET', KEYS[1], '` + revField + `', rev)
redis.call('HSETNX', KEYS[1], '` + epochField + `', ARGV[4])
redis.call('HSET', KEYS[1], ARGV[1], '{"rev":' .. rev .. ',' .. string.sub(ARGV[2], 2))
redis.call('LPUSH', KEYS[2], ARGV[3])
redis.call('LTRIM', KEYS[2], 0, tonumber(ARGV[5]) - 1)
redis.call('PUBLISH', ARGV[6], ARGV[7])
return rev
`

// overrideMergeLua writes back entries into KEYS[1], the highest revision
// winning: ARGV[4..] are triples (field, revision, entry), each written
// unless the field holds an entry of a revision as high; "~rev" becomes at
// least the highest written. ARGV[3] is the clock slack in ms. It creates
// the epoch ARGV[1], publishes "restore <n>" on ARGV[2] if n > 0 and
// returns n, the entries written.
const overrideMergeLua = `local slack = 3` + overrideRevLua + `
redis.call('HSETNX', KEYS[1], '` + epochField + `', ARGV[1])
local n = 0
for i = 4, #ARGV, 3 do
  local rev = tonumber(ARGV[i + 1])
  if rev > (fieldRev(ARGV[i]) or -1) then
    redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 2])
    n = n + 1
  end
  if rev > top then
    top = rev
  end
end
redis.call('HSET', KEYS[1], '` + revField + `', string.format('%d', top))
if n > 0 then
  redis.call('PUBLISH', ARGV[2], 'restore ' .. n)
end
return n
`

// overridePruneLua deletes the fields ARGV[odd] of KEYS[1] that still hold
// ARGV[even].
const overridePruneLua = `
for i = 1, #ARGV, 2 do
  if redis.call('HGET', KEYS[1], ARGV[i]) == ARGV[i + 1] then
    redis.call('HDEL', KEYS[1], ARGV[i])
  end
end
return 0
`

// Overrides is the fleet's overrides on Redis: the operator's API and
// [Overrides.NewFollower]. It is safe for concurrent use, holds no
// goroutine and does not close the client.
type Overrides struct {
	client  redis.UniversalClient
	hash    string
	log     string
	channel string

	timeScript, read, set, merge, prune *redis.Script
}

// NewOverrides returns the overrides of the sidecars whose keys keys
// builds, on client. Their times are Redis's (a Follower measures its
// sidecar's offset on its Book's clock). It does not contact Redis.
func NewOverrides(client redis.UniversalClient, keys window.Keys) (*Overrides, error) {
	if client == nil {
		return nil, errors.New("overrides: the client is nil")
	}
	p := keys.Prefix()
	return &Overrides{client: client, hash: p + ":overrides:{all}", log: p + ":overrides:{all}:log", channel: p + ":overrides",
		timeScript: redis.NewScript(overrideTimeLua), read: redis.NewScript(overrideReadLua), set: redis.NewScript(overrideSetLua),
		merge: redis.NewScript(overrideMergeLua), prune: redis.NewScript(overridePruneLua)}, nil
}

// Channel returns the Pub/Sub channel of the overrides' changes.
func (s *Overrides) Channel() string { return s.channel }

func field(t overrides.Target) string { return t.Domain + "\x00" + t.Rule }

func newEpoch() (string, error) { return randomHex("an epoch") }

// randomHex returns 8 random bytes in hex; what names them in the error.
func randomHex(what string) (string, error) {
	var rnd [8]byte
	if _, err := rand.Read(rnd[:]); err != nil {
		return "", fmt.Errorf("draw %s: %w", what, err)
	}
	return hex.EncodeToString(rnd[:]), nil
}

// requestTTL is how long Redis keeps a set's or clear's request id: longer
// than any retry of its script.
const requestTTL = 5 * time.Minute

// redisTime converts a TIME reply to a time, to the millisecond.
func redisTime(v any) (time.Time, error) {
	a, ok := v.([]any)
	if !ok || len(a) != 2 {
		return time.Time{}, fmt.Errorf("TIME replied %T", v)
	}
	var n [2]int64
	for i := range a {
		s, _ := a[i].(string)
		var err error
		if n[i], err = strconv.ParseInt(s, 10, 64); err != nil {
			return time.Time{}, fmt.Errorf("TIME replied %q: %w", s, err)
		}
	}
	return time.UnixMilli(n[0]*1000 + n[1]/1000), nil
}

// Now returns Redis's time, on the node that holds the overrides.
func (s *Overrides) Now(ctx context.Context) (time.Time, error) {
	v, err := s.timeScript.Run(ctx, s.client, []string{s.hash}).Result()
	if err != nil {
		return time.Time{}, fmt.Errorf("overrides: redis time: %w", err)
	}
	return redisTime(v)
}

// Set puts o in force on every sidecar, replacing its rule's override, and
// records it in the history. The caller has checked it
// (overrides.Override.Check). o's Set becomes Redis's now and its Until as
// far from it as it was from Set, so that every sidecar ends it on
// Redis's clock; o's Rev is the revision Redis gave it.
func (s *Overrides) Set(ctx context.Context, o *overrides.Override) error {
	now, err := s.Now(ctx)
	if err != nil {
		return err
	}
	o.Set, o.Until, o.Rev = now, now.Add(o.Until.Sub(o.Set)), 0
	ev := overrides.Event{Op: "set", At: o.Set, By: o.By, Reason: o.Reason, Override: o}
	rev, err := s.write(ctx, o, ev, "set "+o.Target.String())
	if err != nil {
		return fmt.Errorf("overrides: set %s: %w", o.Target, err)
	}
	o.Rev = rev
	return nil
}

// write stamps entry with the next revision in its rule's field and
// records ev, once however often the client retries; it returns the
// revision.
func (s *Overrides) write(ctx context.Context, entry *overrides.Override, ev overrides.Event, msg string) (int64, error) {
	req, err := randomHex("a request id")
	if err != nil {
		return 0, err
	}
	return s.writeOnce(ctx, req, entry, ev, msg)
}

// writeOnce is write as the request req: a second call with the same req
// (within requestTTL) writes nothing and returns the first's revision.
func (s *Overrides) writeOnce(ctx context.Context, req string, entry *overrides.Override, ev overrides.Event, msg string) (int64, error) {
	v, err := json.Marshal(entry)
	if err != nil {
		return 0, err
	}
	evj, err := json.Marshal(ev)
	if err != nil {
		return 0, err
	}
	epoch, err := newEpoch()
	if err != nil {
		return 0, err
	}
	rev, err := s.set.Run(ctx, s.client, []string{s.hash, s.log, s.hash + ":req:" + req}, field(entry.Target), v, evj, epoch, overrides.MaxHistory,
		s.channel, msg, overrides.ClockSlack.Milliseconds(), requestTTL.Milliseconds()).Text()
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(rev, 10, 64)
}

// Clear ends t's override on every sidecar and records it (by, reason) in
// the history; it returns the override that was in force, nil if none
// (clearing then is not an error, and is recorded too). The rule's field
// holds the clear's tombstone until its horizon, so that no sidecar that
// missed the clear writes the override back.
func (s *Overrides) Clear(ctx context.Context, t overrides.Target, by, reason string) (*overrides.Override, error) {
	entries, now, err := s.entries(ctx)
	if err != nil {
		return nil, err
	}
	was := inForce(entries, t, now)
	ev := overrides.Event{Op: "clear", At: now, By: by, Reason: reason, Override: orTarget(was, t)}
	if _, err := s.write(ctx, &overrides.Override{Target: t, Cleared: true, Set: now}, ev, "clear "+t.String()); err != nil {
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

func inForce(entries []*overrides.Override, t overrides.Target, now time.Time) *overrides.Override {
	for _, o := range entries {
		if o.Target == t && o.InForce(now) {
			return o
		}
	}
	return nil
}

// Get returns t's override in force, nil if none.
func (s *Overrides) Get(ctx context.Context, t overrides.Target) (*overrides.Override, error) {
	entries, now, err := s.entries(ctx)
	if err != nil {
		return nil, err
	}
	return inForce(entries, t, now), nil
}

// List returns the overrides in force, soonest to end first, pruning the
// hash of the entries past their horizon.
func (s *Overrides) List(ctx context.Context) ([]*overrides.Override, error) {
	m, now, err := s.readHash(ctx, "")
	if err != nil {
		return nil, err
	}
	r := parse(m, now)
	if len(r.prune) > 0 {
		if err := s.prune.Run(ctx, s.client, []string{s.hash}, r.prune...).Err(); err != nil {
			return nil, fmt.Errorf("overrides: prune the ended: %w", err)
		}
	}
	var list []*overrides.Override
	for _, o := range r.entries {
		if o.InForce(now) {
			list = append(list, o)
		}
	}
	overrides.Sort(list)
	return list, nil
}

// entries returns the hash's valid entries and Redis's now.
func (s *Overrides) entries(ctx context.Context) ([]*overrides.Override, time.Time, error) {
	m, now, err := s.readHash(ctx, "")
	if err != nil {
		return nil, time.Time{}, err
	}
	return parse(m, now).entries, now, nil
}

// readHash reads the hash and Redis's now, creating the epoch unless it is
// "".
func (s *Overrides) readHash(ctx context.Context, epoch string) (map[string]string, time.Time, error) {
	v, err := s.read.Run(ctx, s.client, []string{s.hash}, epoch).Slice()
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("overrides: read: %w", err)
	}
	if len(v) != 2 {
		return nil, time.Time{}, fmt.Errorf("overrides: read: %d replies, want 2", len(v))
	}
	now, err := redisTime(v[0])
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("overrides: read: %w", err)
	}
	kv, _ := v[1].([]any)
	m := make(map[string]string, len(kv)/2)
	for i := 0; i+1 < len(kv); i += 2 {
		f, _ := kv[i].(string)
		val, _ := kv[i+1].(string)
		m[f] = val
	}
	return m, now, nil
}

// parsed is the hash read: the entries valid within their horizon, the
// revision of every rule's entry (valid or not; 0 for none readable), the
// epoch, the ones skipped, and (field, value) pairs past their horizon.
type parsed struct {
	entries []*overrides.Override
	held    map[overrides.Target]int64
	epoch   string
	skipped []skipped
	prune   []any
}

// skipped is an entry of the hash a sidecar does not apply; sum tells one
// value of its field from another.
type skipped struct {
	key  string
	sum  uint64
	skip overrides.Skip
}

// parse reads the hash at now (Redis's): every entry is checked like the
// ones Set writes (overrides.Override.Verify), whoever wrote it.
func parse(m map[string]string, now time.Time) parsed {
	r := parsed{held: make(map[overrides.Target]int64, len(m))}
	for f, v := range m {
		switch {
		case f == epochField:
			r.epoch = v
			continue
		case f == revField:
			continue
		}
		if d, rule, ok := strings.Cut(f, "\x00"); ok {
			var rev struct {
				Rev int64 `json:"rev"`
			}
			// Unreadable or above overrides.MaxRev: 0, as the scripts have it.
			if json.Unmarshal([]byte(v), &rev) != nil || rev.Rev > overrides.MaxRev(now) {
				rev.Rev = 0
			}
			r.held[overrides.Target{Domain: d, Rule: rule}] = rev.Rev
		}
		o, reason, err := decode(v)
		if err == nil && field(o.Target) != f {
			reason, err = overrides.SkipMalformed, errors.New("the hash field does not name the override's rule")
		}
		if err == nil {
			reason, err = o.Verify(now)
		}
		if err != nil {
			h := fnv.New64a()
			h.Write([]byte(v))
			r.skipped = append(r.skipped, skipped{key: f, sum: h.Sum64(), skip: overrides.Skip{What: describeField(f), Reason: reason, Err: err}})
			continue
		}
		if !now.Before(o.Horizon()) {
			r.prune = append(r.prune, f, v)
			continue
		}
		r.entries = append(r.entries, o)
	}
	return r
}

// describeField names a hash field in a log line: "domain/rule", quoted,
// cut to a bounded length.
func describeField(f string) string {
	const most = 96
	f = strings.Replace(f, "\x00", "/", 1)
	if len(f) > most {
		f = f[:most] + "..."
	}
	return strconv.QuoteToASCII(f)
}

// decode reads an entry; reason is overrides.SkipMode for a mode unknown
// to this sidecar, overrides.SkipMalformed for anything else unreadable.
// err's text is cut short (see cutError).
func decode(v string) (o *overrides.Override, reason string, err error) {
	o = new(overrides.Override)
	if err := json.Unmarshal([]byte(v), o); err != nil {
		if errors.Is(err, overrides.ErrMode) {
			return nil, overrides.SkipMode, &cutError{text: cut("a stored override: " + err.Error()), kind: overrides.ErrMode}
		}
		return nil, overrides.SkipMalformed, &cutError{text: cut("a stored override is not one: " + err.Error())}
	}
	return o, "", nil
}

// cutError is an error about a value read from Redis: its text (which the
// decoder's error may quote whole) is cut short and printable, so that it
// reaches no log unbounded; it wraps kind, if any, not the decoder's error.
type cutError struct {
	text string
	kind error
}

func (e *cutError) Error() string { return e.text }
func (e *cutError) Unwrap() error { return e.kind }

// cut returns s cut to 200 bytes (on a rune's start), its control
// characters and invalid UTF-8 replaced by '?'.
func cut(s string) string {
	const most = 200
	if len(s) > most {
		n := most
		for n > 0 && !utf8.RuneStart(s[n]) {
			n--
		}
		s = s[:n] + "..."
	}
	return strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f || r == utf8.RuneError {
			return '?'
		}
		return r
	}, s)
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

// restore writes back entries that Redis lost or holds older (the highest
// revision wins, atomically), and nudges the sidecars.
func (s *Overrides) restore(ctx context.Context, epoch string, lost []*overrides.Override) error {
	args := make([]any, 0, 3+3*len(lost))
	args = append(args, epoch, s.channel, overrides.ClockSlack.Milliseconds())
	for _, o := range lost {
		v, err := json.Marshal(o)
		if err != nil {
			return fmt.Errorf("overrides: write back %s: %w", o.Target, err)
		}
		args = append(args, field(o.Target), o.Rev, v)
	}
	if err := s.merge.Run(ctx, s.client, []string{s.hash}, args...).Err(); err != nil {
		return fmt.Errorf("overrides: write back %d entries: %w", len(lost), err)
	}
	return nil
}
