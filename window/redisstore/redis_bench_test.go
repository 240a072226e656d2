package redisstore

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashgate/flashgate/window"
	"github.com/flashgate/flashgate/window/redistest"
)

// benchUsers is how many distinct users (keys per rule) the Redis benchmarks
// spread over; each is limited to 100 per second, so most decisions admit.
const benchUsers = 10_000

// BenchmarkRedisDecide measures Redis decisions per second against a
// harness redis-server on loopback at 1, 16 and 64 goroutines, with one hit
// per request (as redis-benchmark's EVALSHA of the same script) and with the
// three hits of the built-in example. It reports decisions/s, script calls
// per decision (EVALSHA and EVAL, INFO commandstats), round trips per
// decision (script calls outside pipelines plus pipelines, counted by a
// client hook) and Redis commands per decision (script-internal commands
// included). Each case runs without auto-pipelining and with it at 1, 2 and
// 4 dispatchers (".../autopipeline=N").
//
// For comparison, the same script straight from redis-benchmark (64
// connections, one key of 10,000, random member):
//
//	SHA=$(redis-cli -p PORT SCRIPT LOAD "$(cat window/redis.lua)")
//	redis-benchmark -p PORT -n 200000 -c 64 -P 1 -r 10000 \
//	  EVALSHA $SHA 1 'fg:{__rand_int__}:uid' __rand_int__ "" 1 "100 1000000 1 0 0 1000"
func BenchmarkRedisDecide(b *testing.B) {
	s := redistest.Start(b)
	admin := redis.NewClient(&redis.Options{Addr: s.Addr()})
	defer admin.Close()
	for _, nhits := range []int{1, 3} {
		for _, g := range []int{1, 16, 64} {
			for _, workers := range []int{0, 1, 2, 4} {
				name := fmt.Sprintf("hits=%d/goroutines=%d", nhits, g)
				if workers > 0 {
					name += fmt.Sprintf("/autopipeline=%d", workers)
				}
				benchmarkRedisDecide(b, s, admin, name, nhits, g, workers)
			}
		}
	}
}

// benchmarkRedisDecide runs one case of BenchmarkRedisDecide: g goroutines,
// nhits hits per request, auto-pipelining with workers dispatchers (0: off).
func benchmarkRedisDecide(b *testing.B, s *redistest.Server, admin *redis.Client, name string, nhits, g, workers int) {
	b.Run(name, func(b *testing.B) {
		c := newTestClient(b, ClientConfig{Addrs: []string{s.Addr()}, PoolSize: max(g, 8), Timeout: time.Second})
		hook := &countHook{}
		c.AddHook(hook)
		r := newTunedRedis(b, c, Options{AutoPipeline: workers > 0}, withWorkers(max(workers, 1)))
		b.Cleanup(r.Close)
		reqs := benchRequests(b, nhits)
		mustDecide(b, r, reqs[0]...) // load the script
		before := commandCalls(b, admin)
		hook.cmds.Store(0)
		hook.pipelines.Store(0)
		b.ResetTimer()
		start := time.Now()
		err := decideConcurrently(b, []*Redis{r}, reqs, g)
		elapsed := time.Since(start)
		b.StopTimer()
		if err != nil {
			b.Fatalf("Decide: %v", err)
		}
		after := commandCalls(b, admin)
		total := int64(0)
		for cmd, n := range after {
			if cmd != "info" {
				total += n - before[cmd]
			}
		}
		b.ReportMetric(float64(b.N)/elapsed.Seconds(), "decisions/s")
		b.ReportMetric(float64(after["evalsha"]+after["eval"]-before["evalsha"]-before["eval"])/float64(b.N), "scriptcalls/op")
		b.ReportMetric(float64(hook.cmds.Load()+hook.pipelines.Load())/float64(b.N), "roundtrips/op")
		b.ReportMetric(float64(total)/float64(b.N), "rediscmds/op")
	})
}

// decideConcurrently makes b.N decisions from g goroutines, goroutine j on
// rs[j % len(rs)] and request i being reqs[i % len(reqs)], and returns the
// first error, which stops its goroutine.
func decideConcurrently(b *testing.B, rs []*Redis, reqs [][]window.Hit, g int) error {
	var next atomic.Int64
	var failed atomic.Value
	var wg sync.WaitGroup
	for j := range g {
		r := rs[j%len(rs)]
		wg.Go(func() {
			ctx := context.Background()
			for {
				i := next.Add(1) - 1
				if i >= int64(b.N) {
					return
				}
				if _, err := r.Decide(ctx, reqs[i%int64(len(reqs))]); err != nil {
					failed.Store(err)
					return
				}
			}
		})
	}
	wg.Wait()
	err, _ := failed.Load().(error)
	return err
}

// benchRequests returns one request per user, each of nhits hits.
func benchRequests(b *testing.B, nhits int) [][]window.Hit {
	k := testKeys(b)
	rules := []string{"uid", "fp", "ip"}
	reqs := make([][]window.Hit, benchUsers)
	for u := range reqs {
		for _, rule := range rules[:nhits] {
			reqs[u] = append(reqs[u], hit(k.Key(rule, fmt.Sprint(u)), 100, time.Second))
		}
	}
	return reqs
}
