package redisstore

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// settleLua keeps the latest settle end proposed in KEYS[1], in ms of
// Redis's clock, until it has passed: ARGV[1] proposes an end that many ms
// from Redis's now (0 only reads). It returns the ms from now to the end
// kept, 0 when none is kept or it has passed.
const settleLua = `
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local kept = tonumber(redis.call('GET', KEYS[1]) or '0') or 0
local d = tonumber(ARGV[1])
if d > 0 and now + d > kept then
  kept = now + d
  redis.call('SET', KEYS[1], string.format('%d', kept), 'PX', d + 1000)
end
if kept <= now then
  return 0
end
return kept - now
`

// Settles is where a fleet agrees when a settle after an outage ends
// (fallback.SettleStore): one key, holding the latest end proposed, on
// Redis's clock, until it has passed.
type Settles struct {
	client redis.Scripter
	key    string
	script *redis.Script
}

// NewSettles returns a Settles on client, in key (window.Keys.Settle).
func NewSettles(client redis.Scripter, key string) *Settles {
	return &Settles{client: client, key: key, script: redis.NewScript(settleLua)}
}

// SettleEnd implements fallback.SettleStore.
func (s *Settles) SettleEnd(ctx context.Context, d time.Duration) (time.Duration, error) {
	ms, err := s.script.Run(ctx, s.client, []string{s.key}, max(d.Milliseconds(), 0)).Int64()
	if err != nil {
		return 0, fmt.Errorf("redis settle end: %w", clientClosed(classified(err)))
	}
	return time.Duration(max(ms, 0)) * time.Millisecond, nil
}
