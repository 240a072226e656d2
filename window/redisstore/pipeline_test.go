package redisstore

import (
	"context"
	"errors"
	"fmt"
	"net"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashgate/flashgate/window"
	"github.com/flashgate/flashgate/window/redistest"
)

// busyScript keeps Redis's single thread busy for the given µs, so that
// every other client waits (DEBUG SLEEP is disabled by default in Redis 7).
func busyScript(us int) string {
	return fmt.Sprintf(`local t0 = redis.call('TIME')
repeat local t = redis.call('TIME') until (t[1] - t0[1]) * 1000000 + (t[2] - t0[2]) > %d`, us)
}

// pauseRedis makes Redis at addr busy for d from another connection and
// returns a function that waits until it is free again.
func pauseRedis(t *testing.T, addr string, d time.Duration) (wait func()) {
	t.Helper()
	admin := redis.NewClient(&redis.Options{Addr: addr, ReadTimeout: d + 5*time.Second})
	var wg sync.WaitGroup
	wg.Go(func() {
		defer admin.Close()
		admin.Eval(context.Background(), busyScript(int(d.Microseconds())), nil)
	})
	// The busy script has started once a PING from a fresh connection goes
	// unanswered (a loaded machine may take a while to send it).
	probe := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, ReadTimeout: min(d/5, 50*time.Millisecond)})
	defer probe.Close()
	for deadline := time.Now().Add(d / 2); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if err := probe.Ping(context.Background()).Err(); err != nil {
			break
		}
	}
	return wg.Wait
}

// countHook counts a client's script calls outside pipelines and its
// pipelines holding script calls (connection set-up, which go-redis also
// pipelines, is not counted).
type countHook struct{ cmds, pipelines atomic.Int64 }

func (h *countHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *countHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if strings.HasPrefix(cmd.Name(), "eval") {
			h.cmds.Add(1)
		}
		return next(ctx, cmd)
	}
}

func (h *countHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if slices.ContainsFunc(cmds, func(c redis.Cmder) bool { return strings.HasPrefix(c.Name(), "eval") }) {
			h.pipelines.Add(1)
		}
		return next(ctx, cmds)
	}
}

// decideAll runs one decision per key concurrently and returns their errors.
func decideAll(ctx context.Context, r *Redis, keys []string, limit int) []error {
	errs := make([]error, len(keys))
	var wg sync.WaitGroup
	for i, key := range keys {
		wg.Go(func() {
			d, err := r.Decide(ctx, []window.Hit{hit(key, limit, time.Minute)})
			if err == nil && (!d.Allowed || d.Count != 1) {
				err = fmt.Errorf("decision %+v, want allowed with count 1", d)
			}
			errs[i] = err
		})
	}
	wg.Wait()
	return errs
}

// settle waits until at most n calls are in flight. A dispatcher hands a
// batch's callers their replies before it releases the batch's slot (and
// starts a hold), so a caller that just returned may still see its batch in
// flight.
func settle(ctx context.Context, t *testing.T, p *autoPipeline, n int) {
	t.Helper()
	for {
		p.mu.Lock()
		busy := len(p.sends)
		p.mu.Unlock()
		if busy <= n {
			return
		}
		if ctx.Err() != nil {
			t.Fatalf("%d calls still in flight, want at most %d", busy, n)
		}
		time.Sleep(time.Millisecond)
	}
}

func someKeys(t *testing.T, n int) []string {
	k := testKeys(t)
	keys := make([]string, n)
	for i := range keys {
		keys[i] = k.Key("uid", fmt.Sprint(i))
	}
	return keys
}

// TestAutoPipelineSharesRoundTrips: decisions that arrive while Redis is
// busy are decided together: one script call per batch, far fewer calls
// than decisions, each decision recorded once.
func TestAutoPipelineSharesRoundTrips(t *testing.T) {
	s, c := startRedis(t)
	hook := &countHook{}
	c.AddHook(hook)
	r := newTestRedis(t, c, Options{AutoPipeline: true})
	t.Cleanup(r.Close)
	mustDecide(t, r, hit(testKeys(t).Key("warm", "up"), 5, time.Minute)) // load the script
	admin := redis.NewClient(&redis.Options{Addr: s.Addr(), ReadTimeout: 5 * time.Second})
	defer admin.Close()
	before := commandCalls(t, admin)
	hook.pipelines.Store(0)
	hook.cmds.Store(0)

	const n = 64
	keys := someKeys(t, n)
	wait := pauseRedis(t, s.Addr(), 300*time.Millisecond)
	errs := decideAll(context.Background(), r, keys, 5)
	wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("decision %d: %v", i, err)
		}
	}
	after := commandCalls(t, admin)
	calls := after["evalsha"] - before["evalsha"]
	if got := after["eval"] - before["eval"]; got != 1 {
		t.Errorf("%d EVAL calls, want 1 (the busy script)", got)
	}
	// The first DefaultPipelineWorkers decisions may each go alone while
	// Redis is busy; the rest queue behind them and are decided in batches,
	// a script call each.
	if max := int64(2 * DefaultPipelineWorkers); calls > max {
		t.Errorf("%d decisions took %d script calls, want at most %d", n, calls, max)
	}
	if got := hook.cmds.Load() + hook.pipelines.Load(); got != calls {
		t.Errorf("the client sent %d script calls and pipelines, Redis ran %d EVALSHA", got, calls)
	}
	for _, key := range keys {
		if got := admin.ZCard(context.Background(), key).Val(); got != 1 {
			t.Fatalf("%s holds %d entries, want 1", key, got)
		}
	}
	t.Logf("%d decisions in %d script calls", n, calls)
}

// TestAutoPipelineDeadline: a caller returns at its own deadline while its
// batch waits on a busy Redis, and the dispatchers are free again after.
func TestAutoPipelineDeadline(t *testing.T) {
	s, c := startRedis(t)
	r := newTestRedis(t, c, Options{AutoPipeline: true})
	t.Cleanup(r.Close)
	k := testKeys(t)
	mustDecide(t, r, hit(k.Key("a", "1"), 5, time.Second))

	wait := pauseRedis(t, s.Addr(), time.Second)
	var wg sync.WaitGroup
	for i := range 8 { // more than the dispatchers: some in flight, some queued
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
			defer cancel()
			start := time.Now()
			_, err := r.Decide(ctx, []window.Hit{hit(k.Key("b", fmt.Sprint(i)), 5, time.Second)})
			took := time.Since(start)
			// The caller's deadline, or its batch's read timeout at the
			// same instant (a batch of one has that caller's deadline).
			var ne net.Error
			if !errors.Is(err, context.DeadlineExceeded) && !(errors.As(err, &ne) && ne.Timeout()) {
				t.Errorf("Decide with a 30ms deadline on a busy Redis = %v, want a timeout", err)
			}
			if took > 500*time.Millisecond {
				t.Errorf("Decide with a 30ms deadline returned after %s", took)
			}
		})
	}
	wg.Wait()
	wait()
	mustDecide(t, r, hit(k.Key("a", "1"), 5, time.Second)) // not wedged
}

// TestAutoPipelineDeadRedis: a stopped Redis fails every caller with a
// connection error, and the limiter recovers after a restart.
func TestAutoPipelineDeadRedis(t *testing.T) {
	s, c := startRedis(t)
	r := newTestRedis(t, c, Options{AutoPipeline: true})
	t.Cleanup(r.Close)
	mustDecide(t, r, hit(testKeys(t).Key("warm", "up"), 5, time.Minute))

	s.Stop()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	for i, err := range decideAll(ctx, r, someKeys(t, 16), 5) {
		var ne net.Error
		if err == nil || !(errors.As(err, &ne) || errors.Is(err, context.DeadlineExceeded)) {
			t.Errorf("decision %d with Redis stopped = %v, want a connection error", i, err)
		}
	}

	s.Restart()
	// go-redis stops dialling after a pool's worth of failed dials (the
	// idle-connection keeper makes them quickly) and probes once a second:
	// the first decisions after a restart may still see the last dial error.
	recovered := false
	for deadline := time.Now().Add(5 * time.Second); !recovered && time.Now().Before(deadline); {
		_, err := r.Decide(context.Background(), []window.Hit{hit(testKeys(t).Key("probe", "x"), 1000, time.Second)})
		if recovered = err == nil; !recovered {
			time.Sleep(50 * time.Millisecond)
		}
	}
	if !recovered {
		t.Fatal("no decision succeeded within 5s of the restart")
	}
	for i, err := range decideAll(context.Background(), r, someKeys(t, 32), 5) {
		if err != nil {
			t.Fatalf("decision %d after a restart: %v", i, err)
		}
	}
}

// TestAutoPipelineNoScript: a batch (one script call) that meets an empty
// script cache loads the script and runs again, each request recorded once.
func TestAutoPipelineNoScript(t *testing.T) {
	s, c := startRedis(t)
	r := newTestRedis(t, c, Options{AutoPipeline: true})
	t.Cleanup(r.Close)
	admin := redis.NewClient(&redis.Options{Addr: s.Addr(), ReadTimeout: 5 * time.Second})
	defer admin.Close()
	ctx := context.Background()
	if err := admin.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	before := commandCalls(t, admin)
	keys := someKeys(t, 8)
	for i, err := range sendFirsts(t, r, keys) {
		if err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
	}
	after := commandCalls(t, admin)
	if got := after["script|load"] - before["script|load"]; got != 1 {
		t.Errorf("%d SCRIPT LOAD, want 1", got)
	}
	if got := after["evalsha"] - before["evalsha"]; got != 2 {
		t.Errorf("%d EVALSHA, want 2 (the batch's, NOSCRIPT then again)", got)
	}
	for _, key := range keys {
		if got := admin.ZCard(ctx, key).Val(); got != 1 {
			t.Fatalf("%s holds %d entries after one decision, want 1", key, got)
		}
	}
}

// TestAutoPipelineClose: Close fails queued callers and those waiting on a
// batch at once (calls sent on their own finish), Decide after Close fails,
// and no goroutine outlives Close.
func TestAutoPipelineClose(t *testing.T) {
	s, c := startRedis(t)
	k := testKeys(t)
	plain := newTestRedis(t, c, Options{})
	mustDecide(t, plain, hit(k.Key("warm", "up"), 5, time.Minute)) // the pool's first connection
	base := runtime.NumGoroutine()

	r := newTunedRedis(t, c, Options{AutoPipeline: true}, withWorkers(3))
	mustDecide(t, r, hit(k.Key("warm", "up"), 5, time.Minute))
	wait := pauseRedis(t, s.Addr(), 600*time.Millisecond)
	type result struct {
		err  error
		took time.Duration // since Close began
	}
	var closing atomic.Pointer[time.Time]
	results := make(chan result, 16)
	for i := range cap(results) {
		go func() {
			_, err := r.Decide(context.Background(), []window.Hit{hit(k.Key("q", fmt.Sprint(i)), 5, time.Minute)})
			took := time.Duration(-1) // returned before Close began
			if c := closing.Load(); c != nil {
				took = time.Since(*c)
			}
			results <- result{err, took}
		}()
	}
	time.Sleep(100 * time.Millisecond) // 3 sent on their own, the rest queued or in a batch
	now := time.Now()
	closing.Store(&now)
	r.Close()
	wait()
	closedErrs := 0
	for range cap(results) {
		res := <-results
		switch {
		case errors.Is(res.err, window.ErrClosed):
			closedErrs++
			if res.took < 0 {
				t.Errorf("a caller got window.ErrClosed before Close")
			}
			if res.took > 300*time.Millisecond { // Redis answers after ~500ms
				t.Errorf("a caller pending at Close returned window.ErrClosed %s later", res.took)
			}
		case res.err != nil:
			t.Errorf("a caller pending at Close got %v, want window.ErrClosed or success", res.err)
		}
	}
	if want := cap(results) - 3; closedErrs < want {
		t.Errorf("%d callers got window.ErrClosed, want at least %d (all but those sent on their own)", closedErrs, want)
	}
	r.Close() // again: no-op
	if _, err := r.Decide(context.Background(), []window.Hit{hit(k.Key("after", "close"), 5, time.Minute)}); !errors.Is(err, window.ErrClosed) {
		t.Errorf("Decide after Close = %v, want window.ErrClosed", err)
	}
	var n int
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if n = runtime.NumGoroutine(); n <= base {
			return
		}
	}
	buf := make([]byte, 1<<16)
	t.Fatalf("%d goroutines after Close, %d before NewRedis:\n%s", n, base, buf[:runtime.Stack(buf, true)])
}

// TestAutoPipelineIgnoredPerSlot: a Cluster limiter starts no dispatchers.
func TestAutoPipelineIgnoredPerSlot(t *testing.T) {
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{"127.0.0.1:1"}})
	defer cc.Close()
	r := newTestRedis(t, cc, Options{AutoPipeline: true})
	defer r.Close()
	if r.pipe != nil {
		t.Fatal("a per-slot limiter got an auto-pipeline")
	}
	if _, err := newRedis(cc, Options{AutoPipeline: true}, withWorkers(-1)); err == nil {
		t.Fatal("a store with -1 pipeline workers was made")
	}
}

// TestAutoPipelineSentinel: auto-pipelining through a Sentinel-managed
// client decides as the plain one does.
func TestAutoPipelineSentinel(t *testing.T) {
	sentinel := redistest.StartSentinel(t, redistest.Start(t), "fgmaster")
	c := newTestClient(t, ClientConfig{Addrs: []string{sentinel.Addr()}, MasterName: "fgmaster"})
	r := newTestRedis(t, c, Options{AutoPipeline: true})
	t.Cleanup(r.Close)
	for i, err := range decideAll(context.Background(), r, someKeys(t, 32), 5) {
		if err != nil {
			t.Fatalf("decision %d: %v", i, err)
		}
	}
}

// TestAutoPipelineAbandonedNotSent: calls whose callers gave up while queued
// are not sent when their batch goes out, so a request that the failure
// mode already answered is never recorded.
func TestAutoPipelineAbandonedNotSent(t *testing.T) {
	s, c := startRedis(t)
	r := newTunedRedis(t, c, Options{AutoPipeline: true}, withWorkers(2))
	t.Cleanup(r.Close)
	k := testKeys(t)
	mustDecide(t, r, hit(k.Key("warm", "up"), 5, time.Minute))
	admin := redis.NewClient(&redis.Options{Addr: s.Addr(), ReadTimeout: 5 * time.Second})
	defer admin.Close()

	wait := pauseRedis(t, s.Addr(), 400*time.Millisecond)
	var wg sync.WaitGroup
	for i := range 2 { // take both slots, sent on their own
		wg.Go(func() {
			_, _ = r.Decide(context.Background(), []window.Hit{hit(k.Key("slot", fmt.Sprint(i)), 5, time.Minute)})
		})
	}
	time.Sleep(30 * time.Millisecond)
	abandoned := someKeys(t, 10)
	for _, key := range abandoned { // queued, then given up
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
			defer cancel()
			if _, err := r.Decide(ctx, []window.Hit{hit(key, 5, time.Minute)}); err == nil {
				t.Errorf("a call queued behind a busy Redis succeeded within 30ms")
			} else if ctx.Err() == nil {
				// The caller's own deadline, not Redis's: the Breaker
				// must be able to tell (ctx.Err() set).
				t.Errorf("a call given up at its caller's deadline returned %v before its context was done", err)
			}
		})
	}
	time.Sleep(100 * time.Millisecond)
	live := k.Key("live", "1")
	wg.Go(func() { mustDecide(t, r, hit(live, 5, time.Minute)) }) // queued behind the abandoned ones
	wg.Wait()
	wait()
	for _, key := range abandoned {
		if n := admin.ZCard(context.Background(), key).Val(); n != 0 {
			t.Errorf("%s holds %d entries: an abandoned call was sent and recorded", key, n)
		}
	}
	if n := admin.ZCard(context.Background(), live).Val(); n != 1 {
		t.Errorf("the live call's key holds %d entries, want 1", n)
	}
}

// TestAutoPipelineScriptErrorFailsOnlyItsRequest: a batch's script call
// that fails with an error reply (one request's key holds a string) is
// sent again as one call per request: the others are decided, each
// recorded once, and only the request on the bad key fails.
func TestAutoPipelineScriptErrorFailsOnlyItsRequest(t *testing.T) {
	s, c := startRedis(t)
	r := newTestRedis(t, c, Options{AutoPipeline: true})
	t.Cleanup(r.Close)
	mustDecide(t, r, hit(testKeys(t).Key("warm", "up"), 5, time.Minute)) // load the script
	admin := redis.NewClient(&redis.Options{Addr: s.Addr(), ReadTimeout: 5 * time.Second})
	defer admin.Close()
	ctx := context.Background()
	keys := someKeys(t, 6)
	const bad = 3
	if err := admin.Set(ctx, keys[bad], "not a sorted set", 0).Err(); err != nil {
		t.Fatal(err)
	}
	before := commandCalls(t, admin)
	for i, err := range sendFirsts(t, r, keys) {
		switch {
		case i == bad && (err == nil || !strings.Contains(err.Error(), "WRONGTYPE")):
			t.Fatalf("the request on the string key: %v, want WRONGTYPE", err)
		case i != bad && err != nil:
			t.Fatalf("call %d: %v", i, err)
		}
	}
	after := commandCalls(t, admin)
	if got := after["evalsha"] - before["evalsha"]; got != 1+int64(len(keys)) {
		t.Errorf("%d EVALSHA, want %d (the batch's, then one per request)", got, 1+len(keys))
	}
	for i, key := range keys {
		if i == bad {
			continue
		}
		if got := admin.ZCard(ctx, key).Val(); got != 1 {
			t.Fatalf("%s holds %d entries after one decision, want 1", key, got)
		}
	}
}

// sendFirsts sends one batch, as a dispatcher would, of one request per key
// (5 per minute) and returns each request's error: a reply other than the
// first admission of the request on its key is one (a batch that failed
// midway leaves the requests before the failure recorded: their retry
// counts them once, from then).
func sendFirsts(t *testing.T, r *Redis, keys []string) []error {
	t.Helper()
	batch := make([]*pipelineCall, len(keys))
	for i, key := range keys {
		batch[i] = &pipelineCall{keys: []string{key}, args: appendHitArgs([]any{r.member(), "", 1}, &[]window.Hit{hit(key, 5, time.Minute)}[0]), done: make(chan struct{}, 1)}
	}
	r.pipe.send(batch)
	errs := make([]error, len(batch))
	for i, c := range batch {
		<-c.done
		if errs[i] = c.err; c.err != nil {
			continue
		}
		st := make([]window.HitState, 1)
		h := hit(keys[i], 5, time.Minute)
		if err := parseReply(c.res, []window.Hit{h}, st); err != nil || st[0].Count != 1 || st[0].Over || st[0].Reset <= 0 || st[0].Reset > time.Minute {
			errs[i] = fmt.Errorf("state %+v, %v; want count 1, under, a reset within the window", st[0], err)
		}
	}
	return errs
}

// readGate holds the reply of one connection: after arm, the first
// connection that reads blocks before its read until release is closed (a
// network stall on that connection only; Redis itself stays free).
type readGate struct {
	mu      sync.Mutex
	armed   bool
	held    net.Conn
	holding chan struct{} // closed once a read is held
	release chan struct{}
}

func newReadGate() *readGate {
	return &readGate{holding: make(chan struct{}), release: make(chan struct{})}
}

func (g *readGate) arm() {
	g.mu.Lock()
	g.armed = true
	g.mu.Unlock()
}

type gatedConn struct {
	net.Conn
	g *readGate
}

func (c *gatedConn) Read(b []byte) (int, error) {
	g := c.g
	g.mu.Lock()
	hold := g.armed && g.held == nil
	if hold {
		g.armed, g.held = false, c
		close(g.holding)
	}
	g.mu.Unlock()
	if hold {
		<-g.release
	}
	return c.Conn.Read(b)
}

// gatedRedis is an auto-pipelining limiter on a real Redis whose
// connections pass through g, with stall bounds lo and hi.
func gatedRedis(t *testing.T, g *readGate, lo, hi time.Duration) (*Redis, *countHook) {
	t.Helper()
	s := redistest.Start(t)
	c := redis.NewClient(&redis.Options{
		Addr: s.Addr(), ReadTimeout: 20 * time.Second, WriteTimeout: 20 * time.Second, PoolSize: 4,
		Dialer: func(ctx context.Context, network, addr string) (net.Conn, error) {
			var d net.Dialer
			cn, err := d.DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			return &gatedConn{Conn: cn, g: g}, nil
		},
	})
	t.Cleanup(func() { c.Close() })
	hook := &countHook{}
	c.AddHook(hook)
	r := newTunedRedis(t, c, Options{AutoPipeline: true}, func(tune *pipelineTuning) {
		tune.stallMin, tune.stallMax = lo, hi
	})
	t.Cleanup(r.Close)
	mustDecide(t, r, hit(testKeys(t).Key("warm", "up"), 5, time.Minute)) // load the script
	return r, hook
}

// decideAsync decides one hit of key (limit 5 a minute) on its own
// goroutine; the channel gets its error, or one if it was not allowed.
func decideAsync(ctx context.Context, r *Redis, key string) <-chan error {
	done := make(chan error, 1)
	go func() {
		d, err := r.Decide(ctx, []window.Hit{hit(key, 5, time.Minute)})
		if err == nil && !d.Allowed {
			err = fmt.Errorf("decision %+v, want allowed", d)
		}
		done <- err
	}()
	return done
}

// TestAutoPipelineStallOpensSlot: while one call is in flight the next
// queue behind it, unless it stalls: a reply held on its connection opens
// the second slot, and the calls behind it are decided at once, not after
// it. Cases: "stalled" (the held call has stalled when the next arrive:
// they go out at once, one after another, while it is held), "timer" (the
// next arrives first: it queues, and goes out when the dispatcher's timer
// finds the held call stalled), "never" (no stall: it stays queued).
func TestAutoPipelineStallOpensSlot(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	k := testKeys(t)
	for _, tc := range []struct {
		name  string
		stall time.Duration
	}{
		{"stalled", 200 * time.Millisecond},
		{"timer", time.Second},
		{"never", time.Hour},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := newReadGate()
			r, hook := gatedRedis(t, g, tc.stall, tc.stall)
			calls := func() int64 { return hook.cmds.Load() + hook.pipelines.Load() }
			hook.cmds.Store(0)
			hook.pipelines.Store(0)
			decide := func(name string) <-chan error { return decideAsync(ctx, r, k.Key(tc.name, name)) }
			g.arm()
			first := decide("first")
			<-g.holding
			held := func(what string) {
				t.Helper()
				select {
				case err := <-first:
					t.Fatalf("the held call returned (%v) before %s", err, what)
				default:
				}
			}
			queued := func() bool {
				r.pipe.mu.Lock()
				defer r.pipe.mu.Unlock()
				return len(r.pipe.queue) == 1
			}
			want := int64(2)
			switch tc.name {
			case "stalled":
				time.Sleep(tc.stall + 50*time.Millisecond)
				if err := <-decide("second"); err != nil {
					t.Fatalf("second call: %v", err)
				}
				held("the second call's")
				settle(ctx, t, r.pipe, 1) // defensive: a second call sent by a dispatcher frees its slot after it returns
				// The held call is still out and stalled: the slot the
				// second call freed is open at once, whenever it was sent.
				r.pipe.mu.Lock()
				open := len(r.pipe.sends) == 1 && r.pipe.openLocked(r.pipe.since())
				r.pipe.mu.Unlock()
				if !open {
					t.Fatal("a slot is free and the call in flight stalled, but no slot is open")
				}
				if err := <-decide("third"); err != nil {
					t.Fatalf("third call: %v", err)
				}
				held("the third call's")
				want = 3
			case "timer", "never":
				second := decide("second")
				for !queued() {
					if ctx.Err() != nil {
						t.Fatal("the second call never queued")
					}
					time.Sleep(time.Millisecond)
				}
				if got := calls(); got != 1 {
					t.Fatalf("%d script calls sent while the first is in flight, want 1", got)
				}
				if tc.name == "timer" {
					if err := <-second; err != nil {
						t.Fatalf("second call: %v", err)
					}
					held("the queued call's")
					break
				}
				close(g.release)
				if err := <-second; err != nil {
					t.Fatalf("second call: %v", err)
				}
			}
			select {
			case <-g.release:
			default:
				close(g.release)
			}
			if err := <-first; err != nil {
				t.Fatalf("first call: %v", err)
			}
			if got := calls(); got != want {
				t.Errorf("%d script calls, want %d", got, want)
			}
		})
	}
}

// TestAutoPipelineLoneOpensSlot: once a dispatcher's batch carried one
// call (a second call queued behind a held one, sent alone when it
// returned), the next call that finds one in flight goes out at once on
// the free slot, while that call is still held, however long the stall.
func TestAutoPipelineLoneOpensSlot(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	k := testKeys(t)
	g := newReadGate()
	r, hook := gatedRedis(t, g, time.Hour, time.Hour)
	decide := func(name string) <-chan error { return decideAsync(ctx, r, k.Key("lone", name)) }
	g.arm()
	first := decide("first")
	<-g.holding
	second := decide("second")
	for {
		r.pipe.mu.Lock()
		queued := len(r.pipe.queue)
		r.pipe.mu.Unlock()
		if queued == 1 {
			break
		}
		if ctx.Err() != nil {
			t.Fatal("the second call never queued behind the held one")
		}
		time.Sleep(time.Millisecond)
	}
	close(g.release)
	for name, done := range map[string]<-chan error{"first": first, "second": second} {
		if err := <-done; err != nil {
			t.Fatalf("%s call: %v", name, err)
		}
	}
	settle(ctx, t, r.pipe, 0)

	// The second call went alone: the next one behind a held call does not
	// wait for it.
	g2 := newReadGate()
	g.mu.Lock()
	g.armed, g.held, g.holding, g.release = false, nil, g2.holding, g2.release
	g.mu.Unlock()
	hook.cmds.Store(0)
	hook.pipelines.Store(0)
	g.arm()
	third := decide("third")
	<-g2.holding
	if err := <-decide("fourth"); err != nil {
		t.Fatalf("fourth call: %v", err)
	}
	select {
	case err := <-third:
		t.Fatalf("the held call returned (%v) before the fourth", err)
	default:
	}
	close(g2.release)
	if err := <-third; err != nil {
		t.Fatalf("third call: %v", err)
	}
	if got := hook.cmds.Load() + hook.pipelines.Load(); got != 2 {
		t.Errorf("%d script calls for the third and fourth, want 2", got)
	}
}

// TestAutoPipelineHold: after a batch of holdMin or more returns, fewer
// calls than it held that arrive within the hold go out together when it
// ends, as one script call ("together"); as many as it held end the hold,
// and go out at once as one ("enough"); a call behind a smaller batch, or
// after the hold, goes out at once ("lone").
func TestAutoPipelineHold(t *testing.T) {
	for _, tc := range []string{"together", "enough", "lone"} {
		t.Run(tc, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			s, c := startRedis(t)
			hook := &countHook{}
			c.AddHook(hook)
			r := newTestRedis(t, c, Options{AutoPipeline: true})
			t.Cleanup(r.Close)
			p := r.pipe
			mustDecide(t, r, hit(testKeys(t).Key("warm", "up"), 5, time.Minute))
			p.mu.Lock()
			if p.held >= 0 {
				t.Errorf("a call of one started a hold (held %d)", p.held)
			}
			p.mu.Unlock()

			// A batch: decisions queued behind a busy Redis.
			wait := pauseRedis(t, s.Addr(), 200*time.Millisecond)
			for i, err := range decideAll(ctx, r, someKeys(t, 4*holdMin), 5) {
				if err != nil {
					t.Fatalf("decision %d: %v", i, err)
				}
			}
			wait()
			settle(ctx, t, p, 0)
			// The batch started a hold; from now on it lasts far longer than
			// any scheduling delay.
			p.mu.Lock()
			if p.held < 0 || p.holdN < holdMin {
				p.mu.Unlock()
				t.Fatalf("after a batch: held %d, holdN %d; want a hold of at least %d", p.held, p.holdN, holdMin)
			}
			p.hold = int64(3 * time.Second)
			p.held = p.since()
			held, size := p.held, p.holdN
			p.mu.Unlock()
			calls := func() int64 { return hook.cmds.Load() + hook.pipelines.Load() }
			before := calls()
			n := size - 1
			switch tc {
			case "enough":
				n = size
			case "lone":
				n = 1
				p.mu.Lock()
				p.held -= p.hold // the hold is over
				p.mu.Unlock()
			}
			for i, err := range decideAll(ctx, r, someKeys(t, n), 5) {
				if err != nil {
					t.Fatalf("decision %d: %v", i, err)
				}
			}
			end := p.since()
			switch tc {
			case "together":
				if end < held+p.hold {
					t.Errorf("the calls returned %v into a hold of %v", time.Duration(end-held), time.Duration(p.hold))
				}
				if got := calls() - before; got != 1 {
					t.Errorf("%d calls within the hold took %d script calls, want 1", n, got)
				}
			case "enough", "lone":
				if end >= held+p.hold {
					t.Errorf("the calls returned %v after the batch, not before the hold's end (%v)", time.Duration(end-held), time.Duration(p.hold))
				}
				if got := calls() - before; tc == "enough" && got != 1 {
					t.Errorf("%d calls took %d script calls, want 1", n, got)
				}
			}
		})
	}
}

// TestAutoPipelineBatchWindow: with Options.BatchWindow, decisions that
// find the pipeline idle wait for the window and go out as one call; a
// full batch goes out before the window ends; New refuses a window out of
// range.
func TestAutoPipelineBatchWindow(t *testing.T) {
	for _, w := range []time.Duration{-time.Millisecond, MaxBatchWindow + time.Microsecond} {
		if _, err := New(redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}), Options{AutoPipeline: true, BatchWindow: w}); err == nil {
			t.Errorf("New with batch window %v: no error", w)
		}
	}
	for _, tc := range []struct {
		name   string
		n      int
		window time.Duration
	}{
		{"together", 10, time.Second},
		{"full", maxPipelineBatch, time.Minute},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			_, c := startRedis(t)
			hook := &countHook{}
			c.AddHook(hook)
			r := newTestRedis(t, c, Options{AutoPipeline: true, BatchWindow: MaxBatchWindow})
			t.Cleanup(r.Close)
			p := r.pipe
			mustDecide(t, r, hit(testKeys(t).Key("warm", "up"), 5, time.Minute))
			settle(ctx, t, p, 0)
			p.mu.Lock()
			p.window = int64(tc.window) // far longer than any scheduling delay
			p.mu.Unlock()
			calls := func() int64 { return hook.cmds.Load() + hook.pipelines.Load() }
			before, start := calls(), time.Now()
			for i, err := range decideAll(ctx, r, someKeys(t, tc.n), 5) {
				if err != nil {
					t.Fatalf("decision %d: %v", i, err)
				}
			}
			took := time.Since(start)
			if got := calls() - before; got != 1 {
				t.Errorf("%d decisions took %d script calls, want 1", tc.n, got)
			}
			switch tc.name {
			case "together":
				if took < tc.window {
					t.Errorf("the decisions returned after %v, inside the window of %v", took, tc.window)
				}
			case "full":
				if took >= tc.window {
					t.Errorf("a full batch returned after %v, not before the window's end (%v)", took, tc.window)
				}
			}
		})
	}
}

// TestAutoPipelineWindowAndHold: with a batch window and a hold both
// running, a call goes out once each is over, by its time or by the calls
// queued, and the dispatcher waits only for the ones not yet over: holdN
// queued calls end a 2 ms hold, and the 1 ms window is then all there is
// to wait for.
func TestAutoPipelineWindowAndHold(t *testing.T) {
	const ms = int64(time.Millisecond)
	p := &autoPipeline{slots: 2, hold: 2 * ms, window: 1 * ms}
	p.held, p.holdN = 10*ms, 4 // a batch of 4 returned at 10 ms: the hold lasts to 12 ms
	p.opened = 10*ms + ms/4    // a call at 10.25 ms opened the window, to 11.25 ms
	queue := func(n int) {
		p.queue = p.queue[:0]
		for range n {
			p.queue = append(p.queue, &pipelineCall{})
		}
	}
	for _, tc := range []struct {
		name   string
		now    int64
		queued int
		open   bool
		wait   time.Duration
	}{
		{"both running", 10*ms + ms/2, 1, false, 1500 * time.Microsecond},
		{"hold ended by the calls queued", 10*ms + ms/2, 4, false, 750 * time.Microsecond},
		{"window over, hold running", 11*ms + ms/2, 1, false, 500 * time.Microsecond},
		{"window over, hold ended by the calls queued", 11*ms + ms/2, 4, true, 0},
		{"both over", 12 * ms, 1, true, 0},
		{"window ended by a full batch", 10*ms + ms/2, maxPipelineBatch, true, 0},
	} {
		queue(tc.queued)
		if got := p.openLocked(tc.now); got != tc.open {
			t.Errorf("%s: open = %v, want %v", tc.name, got, tc.open)
		}
		if !tc.open {
			if got := p.waitLocked(tc.now); got != tc.wait {
				t.Errorf("%s: wait = %v, want %v", tc.name, got, tc.wait)
			}
		}
	}
}

// TestAutoPipelineWindowNotBehindAFlight: decisions that queue while a call
// is in flight go out when it returns (or stalls), not a batch window
// later.
func TestAutoPipelineWindowNotBehindAFlight(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, c := startRedis(t)
	r := newTestRedis(t, c, Options{AutoPipeline: true, BatchWindow: MaxBatchWindow})
	t.Cleanup(r.Close)
	p := r.pipe
	mustDecide(t, r, hit(testKeys(t).Key("warm", "up"), 5, time.Minute))
	settle(ctx, t, p, 0)
	// Redis stays busy long enough for every decision below to queue
	// behind the first one's call, even on a loaded machine.
	wait := pauseRedis(t, s.Addr(), 2*time.Second)
	first := make(chan error, 1)
	go func() {
		_, err := r.Decide(ctx, []window.Hit{hit(testKeys(t).Key("first", "one"), 5, time.Minute)})
		first <- err
	}()
	for { // the first decision's window ends and its call waits on the busy Redis
		p.mu.Lock()
		busy := len(p.sends)
		p.mu.Unlock()
		if busy > 0 {
			break
		}
		if ctx.Err() != nil {
			t.Fatal("the first decision never went out")
		}
		time.Sleep(time.Millisecond)
	}
	const window = time.Minute
	p.mu.Lock()
	p.window = int64(window)
	p.mu.Unlock()
	start := time.Now()
	for i, err := range decideAll(ctx, r, someKeys(t, 10), 5) {
		if err != nil {
			t.Fatalf("decision %d: %v", i, err)
		}
	}
	if took := time.Since(start); took >= window {
		t.Errorf("decisions queued behind a call in flight returned after %v, a window (%v) later", took, window)
	}
	if err := <-first; err != nil {
		t.Fatalf("the first decision: %v", err)
	}
	wait()
}
