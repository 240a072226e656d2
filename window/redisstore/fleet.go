package redisstore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// fleetLua announces (see fallback.Heartbeat) a member until now + ttl, drops the expired
// announcements and returns Redis's time, then every live member and its
// expiry (ms), then the ids that left. The score of a member is its expiry
// (Redis TIME), so every member may have its own TTL; the caller counts the
// members still live when it is asked, so that a member that stopped beating
// drops out of the count at its expiry, not at the next beat. A member that
// leaves is replaced by a tombstone, "\0" and its id, scored like an
// announcement: it tells the others that its absence is a departure, not
// Redis's loss of the set (a restart, FLUSHALL, a failover that lost data).
//
// KEYS[1]: the fleet's sorted set. ARGV[1]: member. ARGV[2]: ttl in ms.
// ARGV[3]: "1" to leave instead of announcing.
// Reply: now, then member and expiry pairs, then "" and the ids that left.
const fleetLua = `
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[2])
if ARGV[3] == '1' then
  redis.call('ZREM', KEYS[1], ARGV[1])
  redis.call('ZADD', KEYS[1], now + ttl, '\0' .. ARGV[1])
else
  redis.call('ZADD', KEYS[1], now + ttl, ARGV[1])
  redis.call('ZREM', KEYS[1], '\0' .. ARGV[1])
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
if last[2] then
  redis.call('PEXPIREAT', KEYS[1], last[2]) -- the latest expiry, whoever beat last
end
local live = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now, '+inf', 'WITHSCORES')
local out, left = { string.format('%d', now) }, {}
for i = 1, #live, 2 do
  if string.byte(live[i], 1) == 0 then
    left[#left + 1] = string.sub(live[i], 2)
  else
    out[#out + 1] = live[i]
    out[#out + 1] = live[i + 1]
  end
end
out[#out + 1] = ''
for i = 1, #left do
  out[#out + 1] = left[i]
end
return out
`

// Heartbeat keeps a fleet's announcements in a Redis sorted set (see
// fallback.Fleet).
type Heartbeat struct {
	client redis.Scripter
	script *redis.Script
}

// NewHeartbeat returns a Heartbeat on client.
func NewHeartbeat(client redis.Scripter) *Heartbeat {
	return &Heartbeat{client: client, script: redis.NewScript(fleetLua)}
}

// Announce implements fallback.Heartbeat.
func (h *Heartbeat) Announce(ctx context.Context, key, id string, ttl time.Duration, leave bool) (now time.Time, live map[string]time.Time, left []string, err error) {
	flag := "0"
	if leave {
		flag = "1"
	}
	res, err := h.script.Run(ctx, h.client, []string{key}, id, ttl.Milliseconds(), flag).StringSlice()
	if err != nil || leave {
		return time.Time{}, nil, nil, classified(err)
	}
	return parseFleetReply(res)
}

// parseFleetReply reads fleetLua's reply.
func parseFleetReply(res []string) (now time.Time, live map[string]time.Time, left []string, err error) {
	if len(res) == 0 {
		return time.Time{}, nil, nil, errors.New("an empty reply")
	}
	ms, err := strconv.ParseInt(res[0], 10, 64)
	if err != nil {
		return time.Time{}, nil, nil, fmt.Errorf("a reply whose time is %q: %w", res[0], err)
	}
	live = make(map[string]time.Time, len(res)/2)
	i := 1
	for ; i+1 < len(res) && res[i] != ""; i += 2 {
		exp, err := strconv.ParseFloat(res[i+1], 64)
		if err != nil {
			return time.Time{}, nil, nil, fmt.Errorf("a reply whose expiry is %q: %w", res[i+1], err)
		}
		live[res[i]] = time.UnixMilli(int64(exp))
	}
	return time.UnixMilli(ms), live, res[min(i+1, len(res)):], nil
}
