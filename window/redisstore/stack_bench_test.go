package redisstore

import (
	"context"
	"runtime"
	"strconv"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashgate/flashgate/window"
	"github.com/flashgate/flashgate/window/fallback"
	"github.com/flashgate/flashgate/window/guard"
	"github.com/flashgate/flashgate/window/redistest"
)

// BenchmarkStackDecide runs the stack serve builds for the redis backend,
// Guard(Fallback.Watch(Breaker(Budget(Redis)))) with auto-pipelining, from
// 32 goroutines over 100,000 users of one rule (5 per second), as the
// end-to-end load of BENCHMARKS.md does without gRPC. Besides ns/op (wall
// time per decision, which on a shared machine depends on everyone else)
// it reports the CPU time this process spent per decision (cpu-ns/op, user
// and system from getrusage: the limiter stack and the Redis client, the
// load's own loop included) and the harness Redis's (redis-cpu-ns/op, from
// INFO), the numbers to compare between versions, and the share of
// decisions that failed (failed/op: a batch cut by its budget when Redis
// stalls on a busy machine; their failure mode is not run here).
func BenchmarkStackDecide(b *testing.B) {
	s := redistest.Start(b)
	c := newTestClient(b, ClientConfig{Addrs: []string{s.Addr()}, PoolSize: 32, Timeout: 40 * time.Millisecond})
	r := newTestRedis(b, c, Options{AutoPipeline: true})
	b.Cleanup(r.Close)
	budget, err := guard.NewBudget(r, guard.BudgetOptions{Min: 25 * time.Millisecond, Max: 36 * time.Millisecond})
	if err != nil {
		b.Fatal(err)
	}
	breaker, err := guard.NewBreaker(budget, guard.BreakerOptions{})
	if err != nil {
		b.Fatal(err)
	}
	fb, err := fallback.New(fallback.Options{})
	if err != nil {
		b.Fatal(err)
	}
	g, err := guard.NewGuard(fb.Watch(breaker), guard.GuardOptions{Ban: window.DefaultBan})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(g.Close)
	keys := make([]string, 100_000)
	k := testKeys(b)
	for i := range keys {
		keys[i] = k.Key("uid", strconv.Itoa(i))
	}
	var next, failed atomic.Uint64
	redisBefore := redisCPU(b, s.Addr())
	cpuBefore := processCPU(b)
	b.SetParallelism(max(32/runtime.GOMAXPROCS(0), 1)) // 32 goroutines
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			key := keys[next.Add(0x9e3779b97f4a7c15)%uint64(len(keys))]
			if _, err := g.Decide(context.Background(), []window.Hit{{Key: key, Limit: window.Limit{Requests: 5, Window: time.Second}}}); err != nil {
				failed.Add(1) // a Redis stall past the budget, on a busy machine
			}
		}
	})
	b.StopTimer()
	b.ReportMetric(float64(processCPU(b)-cpuBefore)/float64(b.N), "cpu-ns/op")
	b.ReportMetric(float64(redisCPU(b, s.Addr())-redisBefore)/float64(b.N), "redis-cpu-ns/op")
	b.ReportMetric(float64(failed.Load())/float64(b.N), "failed/op")
}

// processCPU returns this process's user and system CPU time, ns.
func processCPU(tb testing.TB) int64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		tb.Fatal(err)
	}
	return ru.Utime.Nano() + ru.Stime.Nano()
}

// redisCPU returns the used_cpu_sys + used_cpu_user of the Redis servers at
// addrs, summed, ns.
func redisCPU(tb testing.TB, addrs ...string) int64 {
	var total float64
	for _, addr := range addrs {
		info := serverInfo(tb, addr, "cpu")
		for _, name := range []string{"used_cpu_sys", "used_cpu_user"} {
			f, err := strconv.ParseFloat(infoField(info, name), 64)
			if err != nil {
				tb.Fatalf("INFO cpu %s: %v", name, err)
			}
			total += f
		}
	}
	return int64(total * 1e9)
}

// serverInfo is the INFO section of the server at addr.
func serverInfo(tb testing.TB, addr, section string) string {
	tb.Helper()
	admin := redis.NewClient(&redis.Options{Addr: addr})
	defer admin.Close()
	info, err := admin.Info(context.Background(), section).Result()
	if err != nil {
		tb.Fatal(err)
	}
	return info
}
