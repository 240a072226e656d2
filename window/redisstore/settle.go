package redisstore

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// settleLua keeps the latest settle end proposed, in ms, in KEYS[1] until
// it has passed (ARGV[2] ms from now, at least), and returns it: ARGV[1]
// is the end proposed, 0 to only read. It returns 0 when none is kept.
const settleLua = `
local kept = tonumber(redis.call('GET', KEYS[1]) or '0') or 0
local proposed = tonumber(ARGV[1])
if proposed > kept then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return proposed
end
return kept
`

// Settles is where a fleet agrees when a settle after an outage ends
// (fallback.SettleStore): one key, holding the latest end proposed until
// it has passed.
type Settles struct {
	client redis.Scripter
	key    string
	script *redis.Script
}

// NewSettles returns a Settles on client, in key (window.Keys.Settle).
func NewSettles(client redis.Scripter, key string) *Settles {
	return &Settles{client: client, key: key, script: redis.NewScript(settleLua)}
}

// settleKeep is how long past its end a settle's end is kept, so that a
// sidecar reading late still finds it.
const settleKeep = time.Second

// SettleEnd implements fallback.SettleStore.
func (s *Settles) SettleEnd(ctx context.Context, until time.Time) (time.Time, error) {
	var proposed, keep int64
	if !until.IsZero() {
		proposed = until.UnixMilli()
		keep = max(time.Until(until), 0).Milliseconds() + settleKeep.Milliseconds()
	}
	ms, err := s.script.Run(ctx, s.client, []string{s.key}, proposed, max(keep, 1)).Int64()
	if err != nil {
		return time.Time{}, fmt.Errorf("redis settle end: %w", clientClosed(classified(err)))
	}
	if ms <= 0 {
		return time.Time{}, nil
	}
	return time.UnixMilli(ms), nil
}
