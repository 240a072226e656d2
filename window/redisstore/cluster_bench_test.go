package redisstore

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashgate/flashgate/window/redistest"
)

// BenchmarkRedisDecideCPU measures the CPU time one auto-pipelined decision
// costs this process (getrusage) and the Redis servers (INFO cpu, summed over
// the masters), with the script calls per decision, on a standalone
// redis-server and on Clusters of 1, 3 and 6 masters, at 16, 64 and 128
// goroutines, with one hit per request and with the built-in example's three:
// the store's share of BENCHMARKS.md's "Redis Cluster" figures without gRPC
// and a load generator beside it. A 1-master Cluster against standalone
// isolates what cluster mode costs; standalone at 16 goroutines against 3
// masters at 64 (about 21 each) what smaller batches per master cost; 6
// masters at 128 against 3 at 64 (the same share each) what more masters
// cost beside their batches. The fleet topologies split the goroutines over
// 32 stores, each with its own connections and pipelines, two goroutines
// each at 64: 32 sidecars too lightly loaded to batch, whose calls a master
// sees together, as beneath a large fleet.
func BenchmarkRedisDecideCPU(b *testing.B) {
	s := redistest.Start(b)
	c1 := redistest.StartCluster(b, 1)
	c3 := redistest.StartCluster(b, 3)
	c6 := redistest.StartCluster(b, 6)
	for _, topo := range []struct {
		name     string
		addrs    []string
		mode     string
		sidecars int
	}{
		{"standalone", []string{s.Addr()}, ModeStandalone, 1},
		{"cluster1", c1.Addrs(), ModeCluster, 1},
		{"cluster3", c3.Addrs(), ModeCluster, 1},
		{"cluster6", c6.Addrs(), ModeCluster, 1},
		{"standalone-fleet", []string{s.Addr()}, ModeStandalone, fleetSidecars},
		{"cluster3-fleet", c3.Addrs(), ModeCluster, fleetSidecars},
		{"cluster6-fleet", c6.Addrs(), ModeCluster, fleetSidecars},
	} {
		for _, nhits := range []int{1, 3} {
			for _, g := range []int{16, 64, 128} {
				b.Run(fmt.Sprintf("%s/hits=%d/goroutines=%d", topo.name, nhits, g), func(b *testing.B) {
					benchmarkDecideCPU(b, topo.addrs, topo.mode, topo.sidecars, nhits, g)
				})
			}
		}
	}
}

// fleetSidecars is how many stores the fleet topologies of
// BenchmarkRedisDecideCPU run side by side.
const fleetSidecars = 32

func benchmarkDecideCPU(b *testing.B, addrs []string, mode string, sidecars, nhits, g int) {
	rs := make([]*Redis, min(sidecars, g)) // a store without a goroutine would be idle
	pool := max(g/sidecars, 1)
	reqs := benchRequests(b, nhits)
	for i := range rs {
		c := newTestClient(b, ClientConfig{Addrs: addrs, Mode: mode, PoolSize: pool, Timeout: time.Second})
		rs[i] = newTunedRedis(b, c, Options{AutoPipeline: true}, nil)
		b.Cleanup(rs[i].Close)
		for _, req := range reqs[:64] {
			mustDecide(b, rs[i], req...) // load the script, open the connections
		}
	}
	callsBefore := scriptCalls(b, addrs)
	sleepsBefore, sleepsOK := redisSleeps(b, addrs)
	redisBefore := redisCPU(b, addrs...)
	selfBefore := processCPU(b)
	b.ResetTimer()
	err := decideConcurrently(b, rs, reqs, g)
	b.StopTimer()
	self := processCPU(b) - selfBefore
	rcpu := redisCPU(b, addrs...) - redisBefore
	calls := scriptCalls(b, addrs) - callsBefore
	sleepsAfter, sleepsOK2 := redisSleeps(b, addrs)
	if err != nil {
		b.Fatalf("Decide: %v", err)
	}
	b.ReportMetric(float64(calls)/float64(b.N), "scriptcalls/op")
	if sleepsOK && sleepsOK2 {
		b.ReportMetric(float64(sleepsAfter-sleepsBefore)/float64(b.N), "redis-sleeps/op")
	}
	b.ReportMetric(float64(self)/float64(b.N), "cpu-ns/op")
	b.ReportMetric(float64(rcpu)/float64(b.N), "redis-cpu-ns/op")
}

// redisSleeps is how many times the servers at addrs have blocked (the
// voluntary context switches of their main threads, from /proc; serverCron
// and the cluster bus wake them too): a server that waits for its next
// command sleeps, and its next call pays the wake-up. It reports false
// and logs why where /proc cannot tell (not Linux).
func redisSleeps(b *testing.B, addrs []string) (int64, bool) {
	b.Helper()
	var n int64
	for _, a := range addrs {
		pid := infoField(serverInfo(b, a, "server"), "process_id")
		status, err := os.ReadFile("/proc/" + pid + "/status")
		if err != nil {
			b.Logf("no redis-sleeps/op: the status of redis-server %s (pid %q): %v", a, pid, err)
			return 0, false
		}
		v, err := strconv.ParseInt(infoField(string(status), "voluntary_ctxt_switches"), 10, 64)
		if err != nil {
			b.Logf("no redis-sleeps/op: voluntary_ctxt_switches of redis-server %s: %v", a, err)
			return 0, false
		}
		n += v
	}
	return n, true
}

// infoField is the value of name in text of "name:value" lines (INFO, or
// /proc/PID/status), trimmed; "" when absent.
func infoField(text, name string) string {
	for _, line := range strings.Split(text, "\n") {
		k, v, ok := strings.Cut(line, ":")
		if ok && strings.TrimSpace(k) == name {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// scriptCalls is how many EVALSHA and EVAL the servers at addrs have run.
func scriptCalls(b *testing.B, addrs []string) int64 {
	b.Helper()
	var n int64
	for _, a := range addrs {
		admin := redis.NewClient(&redis.Options{Addr: a})
		calls := commandCalls(b, admin)
		admin.Close()
		n += calls["evalsha"] + calls["eval"]
	}
	return n
}
