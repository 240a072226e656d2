package redistest_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashgate/flashgate/window/redistest"
)

func TestServerLifecycle(t *testing.T) {
	s := redistest.Start(t)
	ctx := context.Background()
	c := redis.NewClient(&redis.Options{Addr: s.Addr(), MaxRetries: -1})
	defer c.Close()
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	s.Stop()
	if err := c.Ping(ctx).Err(); err == nil {
		t.Fatal("PING after Stop succeeded")
	}
	s.Restart()
	if n, err := c.Exists(ctx, "k").Result(); err != nil || n != 0 {
		t.Fatalf("after Restart: EXISTS k = %d, %v; want 0, nil (empty dataset)", n, err)
	}
	s.Kill()
	if err := c.Ping(ctx).Err(); err == nil {
		t.Fatal("PING after Kill succeeded")
	}
	s.Restart()
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("PING after second Restart: %v", err)
	}
}

func TestCluster(t *testing.T) {
	c := redistest.StartCluster(t, 3)
	ctx := context.Background()
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs()})
	defer cc.Close()
	for _, k := range []string{"a", "b", "c", "d", "e", "f"} {
		if err := cc.Set(ctx, k, k, 0).Err(); err != nil {
			t.Fatalf("SET %s: %v", k, err)
		}
	}
	var masters atomic.Int32
	if err := cc.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
		masters.Add(1)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if n := masters.Load(); n != 3 {
		t.Fatalf("masters = %d, want 3", n)
	}
	// A restarted node rejoins with its slots and without its keys.
	for _, n := range c.Nodes() {
		n.Restart()
	}
	deadline := time.Now().Add(15 * time.Second)
	for _, k := range []string{"a", "b", "c", "d", "e", "f"} {
		for {
			n, err := cc.Exists(ctx, k).Result()
			if err == nil && n == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("after restarting every node: EXISTS %s = %d, %v; want 0", k, n, err)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
}

func TestSentinel(t *testing.T) {
	m := redistest.Start(t)
	s := redistest.StartSentinel(t, m, "fgmaster")
	ctx := context.Background()
	c := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: "fgmaster", SentinelAddrs: []string{s.Addr()}})
	defer c.Close()
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatalf("SET through the sentinel: %v", err)
	}
	direct := redis.NewClient(&redis.Options{Addr: m.Addr()})
	defer direct.Close()
	if v := direct.Get(ctx, "k").Val(); v != "v" {
		t.Fatalf("master holds %q, want v", v)
	}
}
