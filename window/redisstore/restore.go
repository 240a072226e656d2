package redisstore

import (
	"context"
	"fmt"
	"strconv"

	"github.com/redis/go-redis/v9"

	"github.com/flashgate/flashgate/window"
)

// restoreCallEntries is the most admissions one script call records; a
// key with more gets several calls.
const restoreCallEntries = 1000

// restoreLua records in one key what a process admitted on its own.
//
//	KEYS[1]: the key, a sorted set as redis.lua keeps it.
//	ARGV[1]: now in µs as a decimal string, or "" for Redis TIME; ARGV[2]:
//	  the window (µs); ARGV[3]: the sub-window width (µs) of a bucketed rule,
//	  0 for an exact one; then three values per admission: its age (µs before
//	  now), its cost and its member id.
//	Reply: the entries added.
//
// An admission is recorded at now - age if that is still inside the window,
// and only once whatever the retries: on an exact key as a request is
// (member, member#2 … member#cost; ZADD NX); on a bucketed key (one that
// holds the width "\0w", or an empty one for a bucketed rule) as its member
// id, scored now so that it is kept for the key's idempotency horizon as a
// request's is, and, only if ZADD NX added the id, its cost on the counter
// of its sub-window of the width the key holds. A key with exact entries
// met by a bucketed rule gets exact entries, which the next decision
// converts. The key's lifetime is extended, never shortened, to one window
// (and one sub-window) past the newest admission recorded.
const restoreLua = `local key = KEYS[1]
local now = ARGV[1]
if now == '' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
else
  now = tonumber(now)
end
local window, width = tonumber(ARGV[2]), tonumber(ARGV[3])
local stored = redis.call('ZSCORE', key, '\0w')
if stored then
  width = tonumber(stored)
elseif width > 0 and redis.call('ZCARD', key) > 0 then
  width = 0
end
local added, newest, args = 0, nil, { 'NX' }
for i = 4, #ARGV, 3 do
  local at, cost, id = now - tonumber(ARGV[i]), tonumber(ARGV[i + 1]), ARGV[i + 2]
  if at > now - window then
    newest = math.max(newest or at, at)
    if width > 0 then
      if redis.call('ZADD', key, 'NX', now, id) == 1 then
        redis.call('ZINCRBY', key, cost, '\0' .. string.format('%d', math.floor(at / width)))
        added = added + cost
      end
    else
      args[#args + 1] = at
      args[#args + 1] = id
      for j = 2, cost do
        if #args >= 1000 then
          added = added + redis.call('ZADD', key, unpack(args))
          args = { 'NX' }
        end
        args[#args + 1] = at
        args[#args + 1] = id .. '#' .. j
      end
      if #args >= 1000 then
        added = added + redis.call('ZADD', key, unpack(args))
        args = { 'NX' }
      end
    end
  end
end
if #args > 1 then
  added = added + redis.call('ZADD', key, unpack(args))
end
if added > 0 then
  local life = newest + window - now
  if width > 0 then
    if not stored then
      redis.call('ZADD', key, width, '\0w')
    end
    life = life + width
  end
  life = math.max(math.ceil(life / 1000), 1)
  if redis.call('PTTL', key) < life then
    redis.call('PEXPIRE', key, life)
  end
end
return added`

// Restore writes batch back into the shared windows: each admission is
// recorded at Redis's now less its age (so the sidecar's clock does not
// matter; a negative age, at most a window, records it after now, as a
// lease's slot is scored at the lease's end), if that is still inside its
// window, and at most once however
// often it is retried (on a bucketed key: within the key's idempotency
// horizon, see [IdempotencyHorizon]). Each key is one script call (more
// for a key of over a thousand admissions), all pipelined in one round
// trip, so it works alike on standalone, Sentinel and Cluster; keep batches
// to a few thousand admissions. It returns the first call's error; the
// calls that succeeded are recorded all the same.
func (r *Redis) Restore(ctx context.Context, batch []window.Admitted) error {
	if r.closed.Load() {
		return fmt.Errorf("redis write-back: %w", window.ErrClosed)
	}
	now := ""
	if r.local {
		now = strconv.FormatInt(r.now().UnixMicro(), 10)
	}
	var calls []scriptCall
	for i := range batch {
		a := &batch[i]
		if a.Key == "" {
			return fmt.Errorf("redis write-back: key %d: empty key: %w", i, window.ErrInvalidHit)
		}
		if err := a.Limit.Validate(); err != nil {
			return fmt.Errorf("redis write-back: key %d: %w: %w", i, window.ErrInvalidHit, err)
		}
		for off := 0; off < len(a.Entries); off += restoreCallEntries {
			es := a.Entries[off:min(off+restoreCallEntries, len(a.Entries))]
			args := make([]any, 0, 3+3*len(es))
			args = append(args, now, a.Limit.Window.Microseconds(), a.Limit.Width().Microseconds())
			for _, e := range es {
				if e.ID == "" || e.ID[0] == 0 {
					return fmt.Errorf("redis write-back: key %d: member id %q is empty or begins with a NUL byte: %w", i, truncID(e.ID), window.ErrInvalidHit)
				}
				args = append(args, max(e.Age.Microseconds(), -a.Limit.Window.Microseconds()), min(max(e.Cost, 1), window.MaxRequests), e.ID)
			}
			calls = append(calls, scriptCall{keys: []string{a.Key}, args: args})
		}
	}
	if len(calls) == 0 {
		return nil
	}
	cmds := r.restore.evalEach(ctx, r.client, calls)
	for i, c := range cmds {
		if err := c.Err(); err != nil {
			return fmt.Errorf("redis write-back: call %d of %d: %w", i+1, len(cmds), clientClosed(r.masterDown(err)))
		}
	}
	return nil
}

// infoer is a client that answers INFO: every go-redis client does.
type infoer interface {
	Info(ctx context.Context, section ...string) *redis.StringCmd
}

// RunID tells whether Redis answers and returns its run id (INFO server's
// run_id), which changes when Redis restarts or fails over, so that the
// write-back can tell a Redis that came back (and may have come back
// empty) from one that stayed. It is "" where one id does not stand for
// the store (Redis Cluster) or INFO is refused (then it PINGs).
func (r *Redis) RunID(ctx context.Context) (string, error) {
	c, ok := r.client.(infoer)
	if _, cluster := r.client.(*redis.ClusterClient); !ok || cluster {
		return "", clientClosed(r.Ping(ctx))
	}
	info, err := c.Info(ctx, "server").Result()
	if err != nil {
		err = classified(err)
		if k := window.Classify(err); k == window.KindConnection || k == window.KindTimeout || k == window.KindClosed {
			return "", fmt.Errorf("redis run id: %w", clientClosed(err))
		}
		return "", clientClosed(r.Ping(ctx)) // INFO refused (ACL, renamed)
	}
	return infoValue(info, "run_id"), nil
}
