package redisstore

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashgate/flashgate/window"
	"github.com/flashgate/flashgate/window/guard"
	"github.com/flashgate/flashgate/window/redistest"
	"github.com/flashgate/flashgate/window/windowtest"
)

// TestConformance runs the table every limiter passes against Redis
// standalone (with and without auto-pipelining, and under serve's
// decorators), through Sentinel and on a Cluster (with and without its
// per-master auto-pipelines).
func TestConformance(t *testing.T) {
	t.Parallel()
	store := func(lim window.Limiter, r *Redis, c redis.UniversalClient) windowtest.Store {
		return windowtest.Store{Limiter: lim, Client: c, Member: r.member,
			DecideAs: func(ctx context.Context, hits []window.Hit, member string) (window.Decision, error) {
				return decideAs(ctx, r, hits, member)
			}}
	}
	single := redistest.Start(t)
	sentinel := redistest.StartSentinel(t, redistest.Start(t), "fgmaster")
	cluster := redistest.StartCluster(t, 3)
	windowtest.Run(t,
		windowtest.Factory{Name: "redis", New: func(t *testing.T) windowtest.Store {
			c := newTestClient(t, ClientConfig{Addrs: []string{single.Addr()}})
			r := newTestRedis(t, c, Options{})
			return store(r, r, c)
		}},
		windowtest.Factory{Name: "redis-autopipeline", New: func(t *testing.T) windowtest.Store {
			c := newTestClient(t, ClientConfig{Addrs: []string{single.Addr()}})
			r := newTunedRedis(t, c, Options{AutoPipeline: true}, queued) // every call through the batching dispatchers
			t.Cleanup(r.Close)
			return store(r, r, c)
		}},
		windowtest.Factory{Name: "redis-batch-window", New: func(t *testing.T) windowtest.Store {
			c := newTestClient(t, ClientConfig{Addrs: []string{single.Addr()}})
			r := newTestRedis(t, c, Options{AutoPipeline: true, BatchWindow: time.Millisecond}) // every call waits for its window
			t.Cleanup(r.Close)
			return store(r, r, c)
		}},
		windowtest.Factory{Name: "redis-breaker-budget", New: func(t *testing.T) windowtest.Store {
			// The decorators of serve's stack change nothing while Redis answers.
			c := newTestClient(t, ClientConfig{Addrs: []string{single.Addr()}})
			r := newTestRedis(t, c, Options{})
			bud, err := guard.NewBudget(r, guard.BudgetOptions{Min: time.Second, Max: 2 * time.Second})
			if err != nil {
				t.Fatalf("NewBudget: %v", err)
			}
			br, err := guard.NewBreaker(bud, guard.BreakerOptions{})
			if err != nil {
				t.Fatalf("NewBreaker: %v", err)
			}
			return store(br, r, c)
		}},
		windowtest.Factory{Name: "redis-sentinel", New: func(t *testing.T) windowtest.Store {
			c := newTestClient(t, ClientConfig{Addrs: []string{sentinel.Addr()}, MasterName: "fgmaster"})
			r := newTestRedis(t, c, Options{})
			return store(r, r, c)
		}},
		windowtest.Factory{Name: "redis-cluster", New: func(t *testing.T) windowtest.Store {
			c := newTestClient(t, ClientConfig{Addrs: cluster.Addrs(), Mode: ModeCluster})
			if err := c.Ping(context.Background()).Err(); err != nil { // loads the slot map
				t.Fatalf("PING the cluster: %v", err)
			}
			r := newTestRedis(t, c, Options{})
			return store(r, r, c)
		}},
		windowtest.Factory{Name: "redis-cluster-autopipeline", New: func(t *testing.T) windowtest.Store {
			c := newTestClient(t, ClientConfig{Addrs: cluster.Addrs(), Mode: ModeCluster})
			if err := c.Ping(context.Background()).Err(); err != nil {
				t.Fatalf("PING the cluster: %v", err)
			}
			r := newTunedRedis(t, c, Options{AutoPipeline: true}, queued) // every call through each master's dispatchers
			t.Cleanup(r.Close)
			if r.nodes == nil {
				t.Fatal("a cluster client with AutoPipeline got no per-master pipelines")
			}
			return store(r, r, c)
		}},
		windowtest.Factory{Name: "redis-cluster-batch-window", New: func(t *testing.T) windowtest.Store {
			c := newTestClient(t, ClientConfig{Addrs: cluster.Addrs(), Mode: ModeCluster})
			if err := c.Ping(context.Background()).Err(); err != nil {
				t.Fatalf("PING the cluster: %v", err)
			}
			r := newTestRedis(t, c, Options{AutoPipeline: true, BatchWindow: time.Millisecond})
			t.Cleanup(r.Close)
			return store(r, r, c)
		}},
	)
}
