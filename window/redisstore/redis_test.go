package redisstore

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashgate/flashgate/window"
	"github.com/flashgate/flashgate/window/memory"
	"github.com/flashgate/flashgate/window/redistest"
	"github.com/flashgate/flashgate/window/testclock"
	"github.com/flashgate/flashgate/window/windowtest"
)

var (
	testKeys     = windowtest.Keys
	hit          = windowtest.Hit
	bucketed     = windowtest.Bucketed
	mustDecide   = windowtest.MustDecide
	mustAllow    = windowtest.MustAllow
	mustDeny     = windowtest.MustDeny
	checkSliding = windowtest.CheckSliding
	fills        = windowtest.Fills
)

func newTestMemory(t testing.TB, clock *testclock.Clock, maxKeys int) *memory.Memory {
	t.Helper()
	m, err := memory.New(memory.Options{Now: clock.Now, MaxKeys: maxKeys})
	if err != nil {
		t.Fatalf("memory.New: %v", err)
	}
	return m
}

// startRedis starts a redis-server and returns it with a client built by
// NewClient (the production configuration, with a test-friendly budget).
func startRedis(t testing.TB) (*redistest.Server, redis.UniversalClient) {
	t.Helper()
	s := redistest.Start(t)
	return s, newTestClient(t, ClientConfig{Addrs: []string{s.Addr()}})
}

// newTestClient builds a client with NewClient and closes it in cleanup. A
// budget of 2 s keeps -race runs on small machines from timing out.
func newTestClient(t testing.TB, cfg ClientConfig) redis.UniversalClient {
	t.Helper()
	if cfg.Timeout == 0 {
		cfg.Timeout = 2 * time.Second
	}
	c, err := NewClient(cfg)
	if err != nil {
		t.Fatalf("NewClient: %v", err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func newTestRedis(t testing.TB, c Client, opts Options) *Redis {
	t.Helper()
	return newTunedRedis(t, c, opts, nil)
}

// newTunedRedis is newTestRedis with the auto-pipeline's tuning changed by
// tune (nil: the default).
func newTunedRedis(t testing.TB, c Client, opts Options, tune func(*pipelineTuning)) *Redis {
	t.Helper()
	r, err := newRedis(c, opts, tune)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return r
}

// withWorkers tunes an auto-pipeline for n round trips in flight.
func withWorkers(n int) func(*pipelineTuning) {
	return func(tune *pipelineTuning) { tune.workers = n }
}

// queued tunes an auto-pipeline to send every call through the batching
// dispatchers, so that sequential tests exercise them.
func queued(tune *pipelineTuning) { tune.alwaysQueue = true }

// decideAs decides hits as the request of member id member.
func decideAs(ctx context.Context, r *Redis, hits []window.Hit, member string) (window.Decision, error) {
	return r.decide(ctx, time.Time{}, hits, member)
}

// admittedAt returns the Redis time (µs) at which the request of member
// was recorded in key (on a Cluster, by key's node): its entry's score, or
// ok false when the entry has left the window already.
func admittedAt(r *Redis, key, member string) (at int64, ok bool, err error) {
	f, err := r.client.(redis.Cmdable).ZScore(context.Background(), key, member).Result()
	if errors.Is(err, redis.Nil) {
		return 0, false, nil
	}
	return int64(f), err == nil, err
}

// hammerCap bounds how long hammer waits for enough admissions.
const hammerCap = 20 * time.Second

// hammer runs goroutines callers on each limiter, each deciding hits(g, i)
// for its i-th request, for at least run and then until enough holds of
// the admissions so far (or hammerCap has passed: a machine too busy to
// fill a window then fails the caller's checks, rather than the test
// betting on its speed). It returns the Redis-side times (µs) of the
// admissions, sorted. A decision error fails the test.
func hammer(t *testing.T, limiters []*Redis, goroutines int, run time.Duration, enough func(ts []int64) bool, hits func(g, i int) []window.Hit) []int64 {
	t.Helper()
	var (
		mu   sync.Mutex // guards ts
		ts   []int64
		wg   sync.WaitGroup
		bad  atomic.Value
		stop atomic.Bool
	)
	for _, r := range limiters {
		for g := range goroutines {
			wg.Go(func() {
				for i := 0; !stop.Load(); i++ {
					hs, member := hits(g, i), r.member()
					d, err := r.decide(context.Background(), time.Time{}, hs, member)
					if err != nil {
						bad.Store(err)
						return
					}
					if d.Allowed {
						// The time of the last key's node, as a Cluster's
						// test wants it.
						at, ok, err := admittedAt(r, hs[len(hs)-1].Key, member)
						if err != nil {
							bad.Store(err)
							return
						}
						if ok {
							mu.Lock()
							ts = append(ts, at)
							mu.Unlock()
						}
					}
				}
			})
		}
	}
	start := time.Now()
	for time.Since(start) < hammerCap {
		time.Sleep(10 * time.Millisecond)
		if time.Since(start) < run {
			continue
		}
		mu.Lock()
		sorted := slices.Sorted(slices.Values(ts))
		mu.Unlock()
		if enough(sorted) || bad.Load() != nil {
			break
		}
	}
	stop.Store(true)
	wg.Wait()
	if err, _ := bad.Load().(error); err != nil {
		t.Fatalf("Decide: %v", err)
	}
	slices.Sort(ts)
	return ts
}

func TestNewRedisValidates(t *testing.T) {
	if _, err := New(nil, Options{}); err == nil {
		t.Error("New(nil) succeeded")
	}
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer c.Close()
	if _, err := New(c, Options{Clock: 7}); err == nil {
		t.Error("NewRedis with clock 7 succeeded")
	}
	r := newTestRedis(t, c, Options{})
	if r.perKey {
		t.Error("a *redis.Client got per-key mode")
	}
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{"127.0.0.1:1"}})
	defer cc.Close()
	if r := newTestRedis(t, cc, Options{}); !r.perKey {
		t.Error("a *redis.ClusterClient did not get per-key mode")
	}
	// Invalid hits fail before any round trip (the address is unreachable).
	if _, err := r.Decide(context.Background(), []window.Hit{{Key: "k", Limit: window.Limit{}}}); !errors.Is(err, window.ErrInvalidHit) {
		t.Errorf("Decide(invalid hit) = %v, want window.ErrInvalidHit", err)
	}
	if d, err := r.Decide(context.Background(), nil); err != nil || !d.Allowed || d.Index != -1 {
		t.Errorf("Decide(no hits) = %+v, %v; want allowed, index -1", d, err)
	}
}

func TestRedisMemberIDs(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer c.Close()
	a, b := newTestRedis(t, c, Options{}), newTestRedis(t, c, Options{})
	seen := map[string]bool{}
	for range 1000 {
		for _, r := range []*Redis{a, b} {
			m := r.member()
			if seen[m] {
				t.Fatalf("member id %x repeated", m)
			}
			if len(m) > 17 {
				t.Fatalf("member id %x is %d bytes, want ≤ 17", m, len(m))
			}
			seen[m] = true
		}
	}
	// A default id never begins with NUL (a bucketed key's counters and
	// width do): one limiter in 256 would draw such a prefix by chance.
	for range 2000 {
		if m := newTestRedis(t, c, Options{}).member(); m[0] == 0 {
			t.Fatalf("default member id %x begins with NUL", m)
		}
	}
}

func TestNewClientValidates(t *testing.T) {
	for name, tc := range map[string]struct {
		cfg  ClientConfig
		want string
	}{
		"no address":            {ClientConfig{}, "no address"},
		"empty address":         {ClientConfig{Addrs: []string{" "}}, "empty"},
		"unknown mode":          {ClientConfig{Addrs: []string{"a:1"}, Mode: "ring"}, "unknown mode"},
		"standalone two addrs":  {ClientConfig{Addrs: []string{"a:1", "b:1"}, Mode: ModeStandalone}, "one address"},
		"sentinel without name": {ClientConfig{Addrs: []string{"a:1"}, Mode: ModeSentinel}, "master name"},
		"name outside sentinel": {ClientConfig{Addrs: []string{"a:1"}, Mode: ModeCluster, MasterName: "m"}, "only for sentinel"},
		"cluster db":            {ClientConfig{Addrs: []string{"a:1"}, Mode: ModeCluster, DB: 2}, "database 0"},
		"negative db":           {ClientConfig{Addrs: []string{"a:1"}, DB: -1}, "negative"},
		"negative pool":         {ClientConfig{Addrs: []string{"a:1"}, PoolSize: -1}, "negative"},
		"negative timeout":      {ClientConfig{Addrs: []string{"a:1"}, Timeout: -time.Second}, "negative"},
	} {
		t.Run(name, func(t *testing.T) {
			c, err := NewClient(tc.cfg)
			if err == nil {
				_ = c.Close()
				t.Fatalf("NewClient(%+v) succeeded", tc.cfg)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("NewClient error %q does not mention %q", err, tc.want)
			}
		})
	}
	for name, tc := range map[string]struct {
		cfg  ClientConfig
		want string
	}{
		"one address":  {ClientConfig{Addrs: []string{"a:1"}}, "*redis.Client"},
		"two":          {ClientConfig{Addrs: []string{"a:1", "b:1"}}, "*redis.ClusterClient"},
		"sentinel":     {ClientConfig{Addrs: []string{"a:1", "b:1"}, MasterName: "m"}, "*redis.Client"},
		"cluster seed": {ClientConfig{Addrs: []string{"a:1"}, Mode: ModeCluster}, "*redis.ClusterClient"},
		"tls":          {ClientConfig{Addrs: []string{"a:1"}, TLS: true, Username: "u", Password: "p", DB: 3, PoolSize: 4}, "*redis.Client"},
	} {
		t.Run(name, func(t *testing.T) {
			c, err := NewClient(tc.cfg)
			if err != nil {
				t.Fatalf("NewClient(%+v): %v", tc.cfg, err)
			}
			defer c.Close()
			if got := fmt.Sprintf("%T", c); got != tc.want {
				t.Fatalf("NewClient(%+v) = %s, want %s", tc.cfg, got, tc.want)
			}
		})
	}
}

// TestRedisOneRoundTrip: a decision over several keys is one EVALSHA.
func TestRedisOneRoundTrip(t *testing.T) {
	s, c := startRedis(t)
	r := newTestRedis(t, c, Options{})
	k := testKeys(t)
	hits := []window.Hit{hit(k.Key("a", "1"), 5, time.Second), hit(k.Key("b", "1"), 5, time.Second), hit(k.Key("c", "1"), 5, time.Second)}
	mustDecide(t, r, hits...) // loads the script (EVALSHA, NOSCRIPT, EVAL)
	admin := redis.NewClient(&redis.Options{Addr: s.Addr()})
	defer admin.Close()
	before := commandCalls(t, admin)
	const n = 3
	for range n {
		mustDecide(t, r, hits...)
	}
	after := commandCalls(t, admin)
	if got := after["evalsha"] - before["evalsha"]; got != n {
		t.Errorf("%d decisions made %d EVALSHA calls, want %d", n, got, n)
	}
	// hello and client|setname set a connection up: go-redis dials the
	// pool's idle connections in the background and sets each up on its
	// first use, which may fall among these decisions (once per connection,
	// not per decision).
	for cmd, calls := range after {
		if calls != before[cmd] && !slices.Contains([]string{"evalsha", "zremrangebyscore", "zcard", "zrange", "zscore", "zadd", "pexpire", "time", "info", "hello", "client|setname"}, cmd) {
			t.Errorf("unexpected command %s (%d calls)", cmd, calls-before[cmd])
		}
	}
}

// commandCalls reads INFO commandstats: calls per lower-case command name.
func commandCalls(t testing.TB, c *redis.Client) map[string]int64 {
	t.Helper()
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatalf("INFO commandstats: %v", err)
	}
	out := map[string]int64{}
	for _, line := range strings.Split(info, "\r\n") {
		name, rest, ok := strings.Cut(strings.TrimPrefix(line, "cmdstat_"), ":calls=")
		if !ok || !strings.HasPrefix(line, "cmdstat_") {
			continue
		}
		var calls int64
		if _, err := fmt.Sscanf(rest, "%d", &calls); err == nil {
			out[name] = calls
		}
	}
	return out
}

// TestRedisRestart: after a restart the script cache is empty; the next
// decision still succeeds (NOSCRIPT → EVAL), on one key and on several.
func TestRedisRestart(t *testing.T) {
	for _, ap := range []bool{false, true} {
		t.Run(fmt.Sprintf("autopipeline=%t", ap), func(t *testing.T) { testRedisRestart(t, ap) })
	}
}

func testRedisRestart(t *testing.T, autoPipeline bool) {
	s, c := startRedis(t)
	r := newTestRedis(t, c, Options{AutoPipeline: autoPipeline})
	t.Cleanup(r.Close)
	k := testKeys(t)
	hits := []window.Hit{hit(k.Key("a", "1"), 2, time.Minute), hit(k.Key("b", "1"), 2, time.Minute)}
	mustDecide(t, r, hits...)
	for _, restart := range []func(){s.Restart, func() { s.Stop(); s.Restart() }} {
		restart()
		d, err := r.Decide(context.Background(), hits)
		if err != nil {
			t.Fatalf("first decision after restart: %v", err)
		}
		if !d.Allowed || d.Count != 1 {
			t.Fatalf("first decision after restart = %+v, want allowed with count 1 (empty dataset)", d)
		}
	}
}

// TestRedisIdempotent: the same member decided twice is recorded once, and
// a member left over from an attempt is removed when the request is denied.
func TestRedisIdempotent(t *testing.T) {
	_, c := startRedis(t)
	r := newTestRedis(t, c, Options{})
	k := testKeys(t)
	a, b := k.Key("a", "1"), k.Key("b", "1")
	ctx := context.Background()
	hits := []window.Hit{hit(a, 3, time.Minute), hit(b, 3, time.Minute)}
	for i := range 3 {
		d, err := decideAs(ctx, r, hits, "m1")
		if err != nil {
			t.Fatal(err)
		}
		if !d.Allowed || d.Count != 1 {
			t.Fatalf("attempt %d of member m1 = %+v, want allowed with count 1", i, d)
		}
	}
	if n := c.ZCard(ctx, a).Val(); n != 1 {
		t.Fatalf("ZCARD after 3 attempts of one member = %d, want 1", n)
	}
	// Fill a; an earlier attempt of m9 left its member in b only (as a
	// partial per-slot admission would). Denied: b must not keep it.
	mustDecide(t, r, hit(a, 3, time.Minute))
	mustDecide(t, r, hit(a, 3, time.Minute))
	if _, err := decideAs(ctx, r, []window.Hit{hit(b, 3, time.Minute)}, "m9"); err != nil {
		t.Fatal(err)
	}
	d, err := decideAs(ctx, r, hits, "m9")
	if err != nil {
		t.Fatal(err)
	}
	if d.Allowed || d.Index != 0 {
		t.Fatalf("m9 with a full = %+v, want denied on hit 0", d)
	}
	if _, err := c.ZScore(ctx, b, "m9").Result(); !errors.Is(err, redis.Nil) {
		t.Fatalf("denied member m9 still in b (ZSCORE err %v)", err)
	}
}

// TestRedisDeadline: a context deadline cuts a command that Redis holds
// without an answer. CLIENT PAUSE holds it: unlike a busy script sent from
// another goroutine, the pause is in force once its reply is back, so no
// sleep has to guess when it began. It outlasts the test (the server goes
// in cleanup): a Decide that the deadline did not cut could not return.
func TestRedisDeadline(t *testing.T) {
	s, c := startRedis(t)
	r := newTestRedis(t, c, Options{})
	k := testKeys(t)
	mustDecide(t, r, hit(k.Key("a", "1"), 5, time.Second))
	admin := redis.NewClient(&redis.Options{Addr: s.Addr(), ReadTimeout: 5 * time.Second})
	defer admin.Close()
	const pause = time.Minute
	if err := admin.Do(context.Background(), "CLIENT", "PAUSE", pause.Milliseconds(), "ALL").Err(); err != nil {
		t.Fatalf("CLIENT PAUSE: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := r.Decide(ctx, []window.Hit{hit(k.Key("a", "1"), 5, time.Second)})
	took := time.Since(start)
	if err == nil {
		t.Fatalf("Decide succeeded while Redis held every command past a 30ms deadline (after %s)", took)
	}
	if took >= pause {
		t.Fatalf("Decide with a 30ms deadline returned after %s, when the pause ended: the deadline did not cut the command", took)
	}
	t.Logf("cut after %s: %v", took, err)
}

// TestRedisConcurrentExact: independent clients (separate sidecars) × 32
// goroutines on one key for several windows. The Redis-side admission times
// never hold more than the limit in one window, and the limit is reached.
func TestRedisConcurrentExact(t *testing.T) {
	for _, ap := range []bool{false, true} {
		t.Run(fmt.Sprintf("autopipeline=%t", ap), func(t *testing.T) { testRedisConcurrentExact(t, ap) })
	}
}

func testRedisConcurrentExact(t *testing.T, autoPipeline bool) {
	s := redistest.Start(t)
	const (
		sidecars   = 3
		goroutines = 32
		limit      = 20
		win        = 100 * time.Millisecond
		run        = 5 * win
	)
	key := testKeys(t).Key("ip", "10.0.0.1")
	var limiters []*Redis
	for range sidecars {
		c := newTestClient(t, ClientConfig{Addrs: []string{s.Addr()}, PoolSize: goroutines})
		r := newTestRedis(t, c, Options{AutoPipeline: autoPipeline})
		t.Cleanup(r.Close)
		limiters = append(limiters, r)
	}
	// Several windows' worth, one of them full (not all of them: a loaded
	// machine may leave gaps, which is no error); the hammering goes on
	// past run until that is so.
	enough := func(ts []int64) bool { return len(ts) >= 2*limit && fills(ts, limit, win.Microseconds()) }
	ts := hammer(t, limiters, goroutines, run, enough, func(int, int) []window.Hit { return []window.Hit{hit(key, limit, win)} })
	if !checkSliding(t, ts, limit, win.Microseconds()) {
		t.Fatalf("%d admissions, but no win held the limit %d", len(ts), limit)
	}
	if len(ts) < 2*limit {
		t.Fatalf("%d admissions, want at least %d", len(ts), 2*limit)
	}
	t.Logf("%d admissions over %dµs at %d/%s", len(ts), ts[len(ts)-1]-ts[0], limit, win)
}

// TestRedisBoundaryBurst: a fixed-window counter admits twice its limit
// across a window edge; the sliding log admits the limit. A window of a
// second, the first burst starting half of it before an edge: each burst of
// ten has half a second, not the few milliseconds a tight window would
// leave it on a busy machine. An attempt whose bursts did not fit (the
// first crossed the edge, or both together took a window) proves nothing
// and is made again.
func TestRedisBoundaryBurst(t *testing.T) {
	_, c := startRedis(t)
	r := newTestRedis(t, c, Options{})
	ctx := context.Background()
	const (
		limit = 10
		win   = time.Second
		lead  = win / 2 // the first burst starts this long before an edge
	)
	for attempt := range 5 {
		k := testKeys(t)
		key := k.Key("uid", "u1")
		edge := time.Now().Truncate(win).Add(win)
		if time.Until(edge) < lead {
			edge = edge.Add(win)
		}
		time.Sleep(time.Until(edge.Add(-lead)))
		began := time.Now()
		fixed, sliding := 0, 0
		burst := func() {
			for range limit {
				bucket := fmt.Sprintf("%s:fixed:%d", key, time.Now().UnixMilli()/win.Milliseconds())
				n, err := c.Incr(ctx, bucket).Result()
				if err != nil {
					t.Fatal(err)
				}
				c.PExpire(ctx, bucket, win)
				if n <= limit {
					fixed++
				}
				if mustDecide(t, r, hit(key, limit, win)).Allowed {
					sliding++
				}
			}
		}
		burst()
		if !time.Now().Before(edge) {
			t.Logf("attempt %d: the first burst crossed the edge; again", attempt)
			continue
		}
		time.Sleep(time.Until(edge.Add(5 * time.Millisecond)))
		burst()
		span := time.Since(began)
		if span >= win {
			t.Logf("attempt %d: bursts took %s; again", attempt, span)
			continue
		}
		if fixed != 2*limit {
			t.Fatalf("fixed win admitted %d of %d across the edge, want %d", fixed, 2*limit, 2*limit)
		}
		if sliding != limit {
			t.Fatalf("sliding log admitted %d of %d within %s, want %d", sliding, 2*limit, span, limit)
		}
		return
	}
	t.Fatal("no attempt fit both bursts into one win")
}

// TestRedisClockSkew: on the local clock, two sidecars whose clocks are a
// window apart over-admit; on the Redis clock, they cannot. The window is a
// minute, so the six decisions fall within it however slow the machine.
func TestRedisClockSkew(t *testing.T) {
	s := redistest.Start(t)
	const win = time.Minute
	skewed := func() time.Time { return time.Now().Add(win + 100*time.Millisecond) }
	for _, tc := range []struct {
		clock Clock
		want  int
	}{{ClockLocal, 4}, {ClockRedis, 2}} {
		t.Run(tc.clock.String(), func(t *testing.T) {
			key := testKeys(t).Key("uid", "u1")
			a := newTestRedis(t, newTestClient(t, ClientConfig{Addrs: []string{s.Addr()}}), Options{Clock: tc.clock, Now: time.Now})
			b := newTestRedis(t, newTestClient(t, ClientConfig{Addrs: []string{s.Addr()}}), Options{Clock: tc.clock, Now: skewed})
			admitted := 0
			for _, r := range []*Redis{a, a, a, b, b, b} {
				if mustDecide(t, r, hit(key, 2, win)).Allowed {
					admitted++
				}
			}
			if admitted != tc.want {
				t.Fatalf("clock %s: %d admitted at 2/%s, want %d", tc.clock, admitted, win, tc.want)
			}
		})
	}
}

// TestRedisRetryCountsOnce: a read timeout makes go-redis send the script
// again while the first attempt is still queued behind a busy Redis; both
// run, and the request is recorded once.
//
// The choreography needs the first attempt sent after the busy script
// began and at least a budget before it ends, and the retry (a budget
// later) answered within its own budget: with a budget of a second and a
// script busy for 1.5 s, the first attempt may start anywhere in the
// script's first half second. An attempt that missed it anyway on a busy
// machine (no retry happened, so nothing was proven) is made again with a
// fresh key.
//
// The pool keeps no idle connections of its own (MinIdleConns -1): go-redis
// dials those in the background and sets them up (CLIENT SETNAME) on first
// use, and a set-up that times out behind the busy script is an error
// go-redis does not retry. The first attempt therefore takes the
// connection the warm-up used; the retry dials one, whose set-up waits out
// the rest of the script within its budget.
func TestRedisRetryCountsOnce(t *testing.T) {
	const (
		budget = time.Second
		// busy is the script's run: 1.5 budgets, in µs.
		busy = `local t0 = redis.call('TIME')
repeat local t = redis.call('TIME') until (t[1] - t0[1]) * 1000000 + (t[2] - t0[2]) > 1500000`
	)
	s := redistest.Start(t)
	c := newTestClient(t, ClientConfig{Addrs: []string{s.Addr()}, Timeout: budget, MinIdleConns: -1})
	r := newTestRedis(t, c, Options{})
	mustDecide(t, r, hit(testKeys(t).Key("warm", "up"), 5, time.Minute)) // load the script
	admin := redis.NewClient(&redis.Options{Addr: s.Addr(), ReadTimeout: 5 * time.Second})
	defer admin.Close()

	for attempt := range 5 {
		key := testKeys(t).Key("uid", "u1")
		before := commandCalls(t, admin) // also connects admin
		var wg sync.WaitGroup
		wg.Go(func() { admin.Eval(context.Background(), busy, nil) })
		time.Sleep(100 * time.Millisecond)
		start := time.Now()
		d, err := r.Decide(context.Background(), []window.Hit{hit(key, 5, time.Minute)})
		took := time.Since(start)
		wg.Wait()
		calls := commandCalls(t, admin)["evalsha"] - before["evalsha"]
		if calls == 1 && err == nil {
			t.Logf("attempt %d: one EVALSHA in %s, no retry: the busy script was not in its way; again", attempt, took)
			continue
		}
		if err != nil {
			t.Fatalf("Decide: %v (after %s, %d EVALSHA calls)", err, took, calls)
		}
		if calls != 2 {
			t.Fatalf("%d EVALSHA calls, want 2 (the first attempt and its retry)", calls)
		}
		if !d.Allowed || d.Count != 1 {
			t.Fatalf("retried decision = %+v, want allowed with count 1", d)
		}
		if n := admin.ZCard(context.Background(), key).Val(); n != 1 {
			t.Fatalf("the key holds %d entries after one retried request, want 1", n)
		}
		return
	}
	t.Fatal("no attempt had its first EVALSHA time out behind the busy script")
}

// TestRedisScoresAreMicroseconds: scores are exact microsecond timestamps,
// from Redis TIME or from the injected local clock (no float rounding).
func TestRedisScoresAreMicroseconds(t *testing.T) {
	_, c := startRedis(t)
	ctx := context.Background()
	k := testKeys(t)

	r := newTestRedis(t, c, Options{})
	key := k.Key("uid", "redis")
	before := time.Now().UnixMicro()
	_, err := decideAs(ctx, r, []window.Hit{hit(key, 5, time.Minute)}, "m")
	after := time.Now().UnixMicro()
	if err != nil {
		t.Fatal(err)
	}
	at, _, err := admittedAt(r, key, "m")
	if err != nil {
		t.Fatal(err)
	}
	if at < before-1000 || at > after+1000 {
		t.Fatalf("Redis time %d outside the local bracket [%d, %d]", at, before, after)
	}
	zs := c.ZRangeWithScores(ctx, key, 0, -1).Val()
	if len(zs) != 1 || int64(zs[0].Score) != at || zs[0].Member != "m" {
		t.Fatalf("ZRANGE = %+v, want member m at score %d", zs, at)
	}

	for _, us := range []int64{1_700_000_000_123_457, 4_102_444_800_999_999} { // 2023 and 2100
		clock := func() time.Time { return time.UnixMicro(us) }
		r := newTestRedis(t, c, Options{Clock: ClockLocal, Now: clock})
		key := k.Key("uid", fmt.Sprint(us))
		if _, err := decideAs(ctx, r, []window.Hit{hit(key, 5, time.Minute)}, "m"); err != nil {
			t.Fatalf("local clock %d: %v", us, err)
		}
		zs := c.ZRangeWithScores(ctx, key, 0, -1).Val()
		if len(zs) != 1 || int64(zs[0].Score) != us {
			t.Fatalf("local clock %d: ZRANGE = %+v", us, zs)
		}
	}
}

// TestNewClientPoolBound: PoolSize bounds the connections Redis sees, under
// load and after a restart, in standalone and per-slot (pipelined) use.
//
// The bound is the point, not every decision's success: 32 callers share 4
// connections, and on a loaded machine some wait past the pool's timeout,
// or (right after the restart) meet go-redis's "connection pool exhausted"
// while the idle-connection keeper redials; each phase must still decide.
func TestNewClientPoolBound(t *testing.T) {
	s := redistest.Start(t)
	const pool = 4
	c := newTestClient(t, ClientConfig{Addrs: []string{s.Addr()}, PoolSize: pool})
	standalone := newTestRedis(t, c, Options{})
	perSlot := newTestRedis(t, c, Options{})
	perSlot.perKey = true // as on a Cluster, over this one node
	admin := redis.NewClient(&redis.Options{Addr: s.Addr(), PoolSize: 1})
	defer admin.Close()
	k := testKeys(t)
	load := func(phase string) {
		var wg sync.WaitGroup
		var ok, failed atomic.Int64
		for g := range 32 {
			wg.Go(func() {
				for i := range 20 {
					r := standalone
					if i%2 == 1 {
						r = perSlot
					}
					u := fmt.Sprint(g)
					if _, err := r.Decide(context.Background(), []window.Hit{hit(k.Key("uid", u), 5, time.Second), hit(k.Key("ip", u), 5, time.Second)}); err != nil {
						if failed.Add(1) == 1 {
							t.Logf("%s: first failed decision: %v", phase, err)
						}
						continue
					}
					ok.Add(1)
				}
			})
		}
		wg.Wait()
		t.Logf("%s: %d decisions, %d failed", phase, ok.Load(), failed.Load())
		if ok.Load() == 0 {
			t.Fatalf("%s: no decision succeeded", phase)
		}
	}
	clients := func() int {
		info := admin.Info(context.Background(), "clients").Val()
		var n int
		for _, line := range strings.Split(info, "\r\n") {
			if v, ok := strings.CutPrefix(line, "connected_clients:"); ok {
				fmt.Sscan(v, &n)
			}
		}
		return n - 1 // the admin connection
	}
	load("under load")
	if n := clients(); n > pool {
		t.Fatalf("%d connections with PoolSize %d", n, pool)
	}
	s.Restart()
	load("after a restart")
	if n := clients(); n > pool {
		t.Fatalf("%d connections after a restart with PoolSize %d", n, pool)
	}
}

// TestRedisLogStaysBounded: a key admitted steadily for many windows holds
// only its live entries (the script trims every key that has any), and each
// decision's count is the live count, so x-ratelimit-remaining is exact.
func TestRedisLogStaysBounded(t *testing.T) {
	_, c := startRedis(t)
	ctx := context.Background()
	k := testKeys(t)

	const limit, step = 3, 400 * time.Millisecond
	now := time.UnixMicro(1_700_000_000_000_000)
	r := newTestRedis(t, c, Options{Clock: ClockLocal, Now: func() time.Time { return now }})
	key := k.Key("uid", "steady")
	var admitted []time.Time
	for i := range 50 {
		d, err := r.Decide(ctx, []window.Hit{hit(key, limit, time.Second)})
		if err != nil {
			t.Fatal(err)
		}
		live := 0
		for _, at := range admitted {
			if at.After(now.Add(-time.Second)) {
				live++
			}
		}
		if !d.Allowed || d.Count != live+1 {
			t.Fatalf("step %d: %+v, want allowed with count %d", i, d, live+1)
		}
		admitted = append(admitted, now)
		if n := c.ZCard(ctx, key).Val(); n != int64(live+1) {
			t.Fatalf("step %d: the key holds %d entries, want the %d live ones", i, n, live+1)
		}
		now = now.Add(step)
	}
}

// TestRedisScriptSpecs calls the script itself: the requests of one call
// read their hits' specs (binary, as appendHitArgs writes them), a spec
// shared by several requests serves each alike, each exact key gets its own
// window as its lifetime, the reply holds now as the caller gave it and per
// key a count and a retry-after (0 or below: room, then minus the reset,
// 0 for a fresh key), and a malformed spec is an error
// reply that names it (the caller's batch is then retried request by
// request; see autoPipeline.send).
func TestRedisScriptSpecs(t *testing.T) {
	_, c := startRedis(t)
	ctx := context.Background()
	k := testKeys(t)
	a, b, d := k.Key("uid", "a"), k.Key("uid", "b"), k.Key("dev", "d")
	spec := func(limit int, win time.Duration, shadow bool) any {
		return appendHitArgs(nil, &window.Hit{Limit: window.Limit{Requests: limit, Window: win}, Shadow: shadow})[0]
	}
	const now = "1700000000000000"
	res, err := c.Eval(ctx, slidingLua, []string{a, b, a, a, d, a, b},
		"m1", now, 1, spec(2, time.Minute, false), // a: 1 of 2
		"m2", now, 1, spec(1, 1500*time.Microsecond, false), // b: 1 of 1, a 1.5 ms window
		"m3", now, 1, spec(2, time.Minute, false), // a: 2 of 2
		"m4", now, 2, spec(2, time.Minute, false), spec(1, time.Minute, true), // a full: denied, though d (shadow) has room
		"m5", now, 2, spec(5, time.Minute, false), spec(1, 1500*time.Microsecond, false), // b full: denied, no reset for a
	).Slice()
	if err != nil {
		t.Fatalf("EVAL: %v", err)
	}
	want := []any{
		now, int64(1), int64(0),
		now, int64(1), int64(0),
		now, int64(2), int64(-60000000), // until m1 leaves
		now, int64(2), int64(60000000), int64(0), int64(0),
		now, int64(2), int64(0), int64(1), int64(1500),
	}
	if !slices.Equal(res, want) {
		t.Fatalf("reply %v, want %v", res, want)
	}
	if n := c.Exists(ctx, d).Val(); n != 0 {
		t.Fatalf("the denied request was recorded in %s", d)
	}
	if ttl := c.PTTL(ctx, a).Val(); ttl <= 59*time.Second || ttl > time.Minute {
		t.Fatalf("PTTL %s = %v, want its 60 s win", a, ttl)
	}
	if got := c.ZRange(ctx, a, 0, -1).Val(); !slices.Equal(got, []string{"m1", "m3"}) {
		t.Fatalf("%s holds %v, want m1 and m3", a, got)
	}

	good := spec(2, time.Minute, false).(string)
	for _, bad := range []string{
		good[:specLen],        // no lifetime
		good + "x",            // a lifetime that is not a number
		good[:specLen] + "-5", // nor this
		good[:specLen-5] + "\x02" + good[specLen-4:], // shadow 2
		"\x00\x00\x00\x00" + good[4:],                // limit 0
		"2 60000000 1 0 0 60000",                     // the text spec of before
		"",
	} {
		_, err := c.Eval(ctx, slidingLua, []string{k.Key("uid", "bad")}, "m", now, 1, bad).Result()
		if err == nil || !strings.Contains(err.Error(), "hit spec") {
			t.Errorf("spec %q: error %v, want one naming the hit spec", bad, err)
		}
	}
	if n := c.Exists(ctx, k.Key("uid", "bad")).Val(); n != 0 {
		t.Fatalf("a malformed spec recorded the request")
	}

	// Redis writes the spec: a key's lifetime is its window rounded up to the ms.
	r := newTestRedis(t, c, Options{})
	e := k.Key("uid", "e")
	w := 90500*time.Millisecond + time.Microsecond
	if _, err := decideAs(ctx, r, []window.Hit{hit(e, 5, w)}, "m"); err != nil {
		t.Fatal(err)
	}
	if ttl := c.PTTL(ctx, e).Val(); ttl <= 90*time.Second || ttl > 90501*time.Millisecond {
		t.Fatalf("PTTL %s = %v, want its %v win rounded up to 90.501 s", e, ttl, w)
	}
}

var errRefused = fmt.Errorf("redis decide: %w", &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED})

var errTimeout = fmt.Errorf("redis decide: %w", context.DeadlineExceeded)
