package e2e

import (
	"context"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
)

// redisClient returns a go-redis client for inspecting addr, closed in
// cleanup.
func redisClient(t testing.TB, addr string) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{
		Addr: addr, DisableIdentity: true, Protocol: 2, PoolSize: 4,
		MaxRetries: -1, DialTimeout: time.Second, ReadTimeout: 2 * time.Second, WriteTimeout: 2 * time.Second,
		MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
	})
	t.Cleanup(func() { c.Close() })
	return c
}

// scanKeys returns every key matching pattern (SCAN, which also expires
// the logically expired keys it meets).
func scanKeys(ctx context.Context, c *redis.Client, pattern string) ([]string, error) {
	var keys []string
	var cursor uint64
	for {
		ks, next, err := c.Scan(ctx, cursor, pattern, 1000).Result()
		if err != nil {
			return nil, err
		}
		keys = append(keys, ks...)
		if next == 0 {
			break
		}
		cursor = next
	}
	sort.Strings(keys)
	return keys, nil
}

// infoField reads "field:value" from INFO section.
func infoField(ctx context.Context, c *redis.Client, section, field string) (int64, error) {
	s, err := c.Info(ctx, section).Result()
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(s, "\r\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			return strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		}
	}
	return 0, nil
}

func bg() context.Context { return context.Background() }
