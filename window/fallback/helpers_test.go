package fallback

import (
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashgate/flashgate/window/redisstore"
	"github.com/flashgate/flashgate/window/redistest"
	"github.com/flashgate/flashgate/window/windowtest"
)

var (
	hit        = windowtest.Hit
	mustDecide = windowtest.MustDecide
	testKeys   = windowtest.Keys
)

// startRedis starts a redis-server and returns it with a client as serve
// builds one, with a budget of 2 s for -race runs on small machines.
func startRedis(t testing.TB) (*redistest.Server, redis.UniversalClient) {
	t.Helper()
	s := redistest.Start(t)
	c, err := redisstore.NewClient(redisstore.ClientConfig{Addrs: []string{s.Addr()}, Timeout: 2 * time.Second})
	if err != nil {
		t.Fatalf("NewClient: %v", err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return s, c
}

// ruleShare is a hit's Tag naming its rule's local share.
type ruleShare int

func (r ruleShare) FallbackShare() int { return int(r) }
