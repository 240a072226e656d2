package window

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// scripted is a Limiter whose outcomes the test sets: each call advances
// the clock by took and fails with err (nil: Memory decides). It stands for
// a backend that is slow or failing in a way a real Redis cannot be made to
// be on cue; the Redis tests below use a real one.
type scripted struct {
	clock *stepClock
	mem   *Memory
	took  time.Duration
	err   error
}

func (s *scripted) Decide(ctx context.Context, hits []Hit) (Decision, error) {
	s.clock.Advance(s.took)
	if s.err != nil {
		return Decision{}, s.err
	}
	return s.mem.Decide(ctx, hits)
}

var (
	errTimeout = fmt.Errorf("redis decide: %w", context.DeadlineExceeded)
	errRefused = fmt.Errorf("redis decide: %w", &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED})
)

func newTestBreaker(t *testing.T) (*Breaker, *scripted, *stepClock) {
	t.Helper()
	clock := newStepClock()
	s := &scripted{clock: clock, mem: newTestMemory(t, clock, 0)}
	b, err := NewBreaker(s, BreakerOptions{Now: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	return b, s, clock
}

// TestBreakerSlowIsNotDead: timeouts on a minority of calls (a slow moment
// of a healthy Redis) fail those calls only; the breaker stays closed.
func TestBreakerSlowIsNotDead(t *testing.T) {
	b, s, clock := newTestBreaker(t)
	ctx := context.Background()
	for i := range 500 {
		s.err = nil
		if i%5 == 0 { // a fifth of the replies are late
			s.err = errTimeout
		}
		_, err := b.Decide(ctx, []Hit{hit(fmt.Sprint("k", i), 5, time.Second)})
		if errors.Is(err, ErrBreakerOpen) {
			t.Fatalf("call %d: the breaker opened on a 20%% timeout rate", i)
		}
		clock.Advance(3 * time.Millisecond)
	}
	if b.Opened() != 0 || b.Open() {
		t.Fatalf("opened %d times", b.Opened())
	}
}

// TestBreakerOpensOnRate: most calls timing out opens it; after the
// cooldown one probe goes through, and its success closes it.
func TestBreakerOpensOnRate(t *testing.T) {
	b, s, clock := newTestBreaker(t)
	ctx := context.Background()
	h := []Hit{hit("k", 1000, time.Second)}
	s.err = errTimeout
	// A burst of failures within one tenth of the window (a late pipelined
	// batch) does not open it: failures must be sustained.
	for i := range 50 {
		if _, err := b.Decide(ctx, h); errors.Is(err, ErrBreakerOpen) {
			t.Fatalf("opened at call %d of a burst within 50µs", i)
		}
		clock.Advance(time.Microsecond)
	}
	opened := time.Duration(-1)
	for i := range 100 { // a call every 10ms, all failing
		if _, err := b.Decide(ctx, h); errors.Is(err, ErrBreakerOpen) {
			opened = time.Duration(i) * 10 * time.Millisecond
			break
		}
		clock.Advance(10 * time.Millisecond)
	}
	if opened < 0 || opened > time.Second {
		t.Fatalf("opened after %s of sustained timeouts, want within the 1s window", opened)
	}
	t.Logf("opened after %s of sustained timeouts", opened)
	s.err = nil
	if _, err := b.Decide(ctx, h); !errors.Is(err, ErrBreakerOpen) {
		t.Fatalf("within the cooldown: %v, want ErrBreakerOpen", err)
	}
	clock.Advance(DefaultBreakerCooldown)
	if _, err := b.Decide(ctx, h); err != nil {
		t.Fatalf("the probe: %v", err)
	}
	if b.Open() {
		t.Fatal("a successful probe left the breaker open")
	}
	// Closed again, and the window forgotten: one timeout does not reopen.
	s.err = errTimeout
	_, _ = b.Decide(ctx, h)
	s.err = nil
	if _, err := b.Decide(ctx, h); err != nil {
		t.Fatalf("after one timeout on a fresh window: %v", err)
	}
}

// TestBreakerConnectionErrors: Redis refusing connections is dead, not
// slow: a few in a row open it at once, whatever the rate; a failed probe
// opens it again.
func TestBreakerConnectionErrors(t *testing.T) {
	b, s, clock := newTestBreaker(t)
	ctx := context.Background()
	h := []Hit{hit("k", 1000, time.Second)}
	for range 50 { // a healthy history: the rate alone would not open it
		if _, err := b.Decide(ctx, h); err != nil {
			t.Fatal(err)
		}
	}
	s.err = errRefused
	for i := range DefaultBreakerConnFailures {
		if _, err := b.Decide(ctx, h); errors.Is(err, ErrBreakerOpen) {
			t.Fatalf("open after %d connection errors", i)
		}
	}
	if _, err := b.Decide(ctx, h); !errors.Is(err, ErrBreakerOpen) {
		t.Fatalf("after %d connection errors in a row: %v, want ErrBreakerOpen", DefaultBreakerConnFailures, err)
	}
	clock.Advance(DefaultBreakerCooldown)
	if _, err := b.Decide(ctx, h); !errors.Is(err, errRefused) {
		t.Fatalf("the probe: %v, want the backend's error", err)
	}
	if _, err := b.Decide(ctx, h); !errors.Is(err, ErrBreakerOpen) {
		t.Fatalf("after a failed probe: %v, want ErrBreakerOpen", err)
	}
}

// TestBreakerCallerGaveUp: calls whose caller gave up (Envoy's timeout) and
// invalid hits say nothing of the backend.
func TestBreakerCallerGaveUp(t *testing.T) {
	b, s, _ := newTestBreaker(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	s.err = fmt.Errorf("redis decide: %w", context.Canceled)
	for range 100 {
		_, _ = b.Decide(ctx, []Hit{hit("k", 5, time.Second)})
	}
	s.err = nil
	for range 100 {
		_, _ = b.Decide(context.Background(), []Hit{{Key: "k"}}) // invalid
	}
	if b.Opened() != 0 {
		t.Fatal("the breaker opened on calls that tell nothing of the backend")
	}
}

// TestBudgetFollowsLatency: the budget starts at Min, grows with a slower
// backend (never above Max), and shrinks back when it is fast again.
func TestBudgetFollowsLatency(t *testing.T) {
	clock := newStepClock()
	s := &scripted{clock: clock, mem: newTestMemory(t, clock, 0)}
	b, err := NewBudget(s, BudgetOptions{Min: 25 * time.Millisecond, Max: 40 * time.Millisecond, Now: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	if got := b.Current(); got != 40*time.Millisecond {
		t.Fatalf("budget before any call = %s, want Max (nothing known yet)", got)
	}
	h := []Hit{hit("k", 1_000_000, time.Hour)}
	s.took = time.Millisecond
	for range 50 {
		mustDecide(t, b, h...)
	}
	if got := b.Current(); got != 25*time.Millisecond {
		t.Fatalf("budget for a 1ms backend = %s, want Min", got)
	}
	s.took = 12 * time.Millisecond // jittery: 12ms then 2ms
	for i := range 50 {
		if i%2 == 1 {
			s.took = 2 * time.Millisecond
		} else {
			s.took = 12 * time.Millisecond
		}
		mustDecide(t, b, h...)
	}
	if got := b.Current(); got <= 25*time.Millisecond || got > 40*time.Millisecond {
		t.Fatalf("budget for a jittery 2–12ms backend = %s, want above Min, at most Max", got)
	}
	s.took = 100 * time.Millisecond
	for range 20 {
		mustDecide(t, b, h...)
	}
	if got := b.Current(); got != 40*time.Millisecond {
		t.Fatalf("budget for a 100ms backend = %s, want Max", got)
	}
	s.took = time.Millisecond
	for range 200 {
		mustDecide(t, b, h...)
	}
	if got := b.Current(); got != 25*time.Millisecond {
		t.Fatalf("budget once fast again = %s, want Min", got)
	}
	if _, err := NewBudget(s, BudgetOptions{Min: 10 * time.Millisecond, Max: 5 * time.Millisecond}); err == nil {
		t.Fatal("NewBudget accepted max < min")
	}
}

// TestBudgetDeadline: a backend that outlives the budget is cut at it, and
// the timeout counts as a sample as long as the budget.
func TestBudgetDeadline(t *testing.T) {
	s, c := startRedis(t)
	r := newTestRedis(t, c, RedisOptions{})
	b, err := NewBudget(r, BudgetOptions{Min: 50 * time.Millisecond, Max: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	mustDecide(t, b, hit(testKeys(t).Key("warm", "up"), 5, time.Second))
	wait := pauseRedis(t, s.Addr(), 500*time.Millisecond)
	start := time.Now()
	_, err = b.Decide(context.Background(), []Hit{hit(testKeys(t).Key("u", "1"), 5, time.Second)})
	took := time.Since(start)
	wait()
	if Classify(err) != KindTimeout {
		t.Fatalf("Decide on a paused Redis = %v (%s), want a timeout", err, Classify(err))
	}
	if took < 50*time.Millisecond {
		t.Fatalf("returned after %s, before the budget of 50ms", took)
	}
}

// TestBudgetPipelineDeadline: over an auto-pipelined Redis the Budget's
// deadline is the pipeline's to keep (no context per call): a check sent on
// its own and checks queued behind a stuck Redis return at their budget as
// the Budget's timeout, not before it, and those still queued then are never
// sent.
func TestBudgetPipelineDeadline(t *testing.T) {
	s, c := startRedis(t)
	r := newTestRedis(t, c, RedisOptions{AutoPipeline: true, PipelineWorkers: 2})
	t.Cleanup(r.Close)
	const budget = 60 * time.Millisecond
	b, err := NewBudget(r, BudgetOptions{Min: budget, Max: budget})
	if err != nil {
		t.Fatal(err)
	}
	k := testKeys(t)
	mustDecide(t, b, hit(k.Key("warm", "up"), 5, time.Minute))

	wait := pauseRedis(t, s.Addr(), time.Second)
	// Nothing in flight: a check goes out on its own, with its budget in
	// its context.
	start := time.Now()
	_, err = b.Decide(context.Background(), []Hit{hit(k.Key("lone", "1"), 5, time.Minute)})
	if took := time.Since(start); Classify(err) != KindTimeout || took < budget || took > 700*time.Millisecond {
		t.Fatalf("a check sent alone to a stuck Redis = %v (%s) after %s, want a timeout at its budget of %s", err, Classify(err), took, budget)
	}
	var wg sync.WaitGroup
	for i := range 2 { // both slots: sent, stuck until Redis is free
		wg.Go(func() {
			_, _ = r.Decide(context.Background(), []Hit{hit(k.Key("slot", fmt.Sprint(i)), 5, time.Minute)})
		})
	}
	time.Sleep(30 * time.Millisecond)
	queued := someKeys(t, 10)
	for _, key := range queued {
		wg.Go(func() {
			start := time.Now()
			_, err := b.Decide(context.Background(), []Hit{hit(key, 5, time.Minute)})
			took := time.Since(start)
			if Classify(err) != KindTimeout || !strings.Contains(err.Error(), "within the budget") {
				t.Errorf("a check queued behind a stuck Redis = %v (%s), want the budget's timeout", err, Classify(err))
			}
			if took < budget {
				t.Errorf("returned after %s, before the budget of %s", took, budget)
			}
			if took > 700*time.Millisecond {
				t.Errorf("returned after %s, long after the budget of %s (Redis was stuck for 1s)", took, budget)
			}
		})
	}
	// A call without a deadline queued behind them, past their budget:
	// they would go out in its batch.
	time.Sleep(150 * time.Millisecond)
	live := k.Key("live", "1")
	wg.Go(func() { mustDecide(t, r, hit(live, 5, time.Minute)) })
	wg.Wait()
	wait()
	if n := c.ZCard(context.Background(), live).Val(); n != 1 {
		t.Errorf("the live call's key holds %d entries, want 1", n)
	}
	mustDecide(t, b, hit(k.Key("after", "1"), 5, time.Minute)) // not wedged
	for _, key := range queued {
		if n := c.ZCard(context.Background(), key).Val(); n != 0 {
			t.Errorf("%s holds %d entries: a check past its budget was sent and recorded", key, n)
		}
	}
}

// TestFallbackShare: alone, a fleet member enforces ceil(limit / N), or the
// rule's own share.
func TestFallbackShare(t *testing.T) {
	clock := newStepClock()
	n := 3
	f, err := NewFallback(FallbackOptions{Now: clock.Now, Size: func() int { return n }})
	if err != nil {
		t.Fatal(err)
	}
	h := hit("k", 5, time.Second)
	for i := range 3 {
		d := mustDecide(t, f, h)
		if d.Allowed != (i < 2) {
			t.Fatalf("request %d of a 5/s rule in a fleet of 3: %+v, want 2 admitted", i, d)
		}
		if d.Limit != h.Limit {
			t.Fatalf("decision reports limit %s, want the rule's %s", d.Limit, h.Limit)
		}
	}
	own := hit("own", 5, time.Second)
	own.LocalShare = 4
	for i := range 5 {
		if d := mustDecide(t, f, own); d.Allowed != (i < 4) {
			t.Fatalf("request %d with local_share 4: %+v", i, d)
		}
	}
	n = 1
	alone := hit("alone", 5, time.Second)
	for i := range 6 {
		if d := mustDecide(t, f, alone); d.Allowed != (i < 5) {
			t.Fatalf("request %d in a fleet of 1: %+v", i, d)
		}
	}
}

// TestFallbackSeed: what Redis last reported for a key holds for one
// window: a full key admits nothing locally until then, a partly used one
// shares out only the rest.
func TestFallbackSeed(t *testing.T) {
	clock := newStepClock()
	f, err := NewFallback(FallbackOptions{Now: clock.Now, Size: func() int { return 3 }})
	if err != nil {
		t.Fatal(err)
	}
	full, part := hit("full", 5, time.Second), hit("part", 5, time.Second)
	f.Observe([]Hit{full}, Decision{Allowed: false, Index: 0, Count: 5, Source: SourceBackend})
	f.Observe([]Hit{part}, Decision{Allowed: true, Index: 0, Count: 2, Source: SourceBackend})
	// A local answer teaches nothing.
	f.Observe([]Hit{part}, Decision{Allowed: false, Index: 0, Count: 5, Source: SourceLocalFull})
	// Nor does a count that leaves the share as it is (ceil(4/3) = 2): not stored.
	f.Observe([]Hit{hit("quiet", 5, time.Second)}, Decision{Allowed: true, Index: 0, Count: 1, Source: SourceBackend})
	if _, _, ok := f.seeds.load(f.hash("quiet"), 5, clock.Now().UnixNano()); ok {
		t.Fatal("a count of 1 of 5 in a fleet of 3 was stored")
	}

	d := mustDecide(t, f, full)
	if d.Allowed || d.RetryAfter != time.Second {
		t.Fatalf("a key Redis reported full: %+v, want denied until the seed expires (1s)", d)
	}
	for i := range 2 { // ceil((5-2)/3) = 1
		if d := mustDecide(t, f, part); d.Allowed != (i == 0) {
			t.Fatalf("request %d on a key at 2 of 5: %+v, want 1 admitted", i, d)
		}
	}
	clock.Advance(time.Second)
	for i := range 3 { // the seed expired: the share, 2, less the one admitted at 0s (now out)
		if d := mustDecide(t, f, full); d.Allowed != (i < 2) {
			t.Fatalf("request %d after the seed expired: %+v", i, d)
		}
	}
}

// TestFleet: sidecars announce themselves on one key and count each other;
// one that leaves drops out at once, one that stops beating within the TTL.
func TestFleet(t *testing.T) {
	_, c := startRedis(t)
	key := testKeys(t).Fleet("flashsale")
	ctx := context.Background()
	mk := func(id string) *Fleet {
		f, err := NewFleet(c, FleetOptions{Key: key, ID: id, TTL: 300 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	a, b, d := mk("a"), mk("b"), mk("c")
	if n, known := a.Size(); n != 1 || known {
		t.Fatalf("size before a beat = %d, %v; want 1, unknown", n, known)
	}
	for _, f := range []*Fleet{a, b, d} {
		if _, err := f.Beat(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if n, _ := d.Size(); n != 3 {
		t.Fatalf("size after three beats = %d", n)
	}
	if err := d.Leave(ctx); err != nil {
		t.Fatal(err)
	}
	if n, _ := a.Beat(ctx); n != 2 {
		t.Fatalf("size after one left = %d, want 2", n)
	}
	// b stops beating (killed): gone from a's count within the TTL.
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	go a.Run(runCtx, nil)
	deadline := time.Now().Add(2 * time.Second)
	for {
		if n, _ := a.Size(); n == 1 {
			break
		}
		if time.Now().After(deadline) {
			n, _ := a.Size()
			t.Fatalf("size %d two seconds after b stopped beating (TTL 300ms)", n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestStackRedisDown: Guard(Watch(Breaker(Budget(Redis)))) with Redis
// stopped: the breaker opens on connection errors, the Guard still refuses
// what Redis said was full, and the fallback enforces the seeded share.
func TestStackRedisDown(t *testing.T) {
	s, c := startRedis(t)
	r := newTestRedis(t, c, RedisOptions{})
	bud, err := NewBudget(r, BudgetOptions{Min: time.Second, Max: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	br, err := NewBreaker(bud, BreakerOptions{Cooldown: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	fb, err := NewFallback(FallbackOptions{Size: func() int { return 2 }})
	if err != nil {
		t.Fatal(err)
	}
	g, err := NewGuard(fb.Watch(br), GuardOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(g.Close)
	k := testKeys(t)
	hot, warm := hit(k.Key("uid", "hot"), 2, time.Minute), hit(k.Key("uid", "warm"), 4, time.Minute)
	mustDecide(t, g, hot)
	mustDecide(t, g, hot)
	if d := mustDecide(t, g, hot); d.Allowed || d.Source != SourceBackend {
		t.Fatalf("third on a 2/min key: %+v, want Redis's denial", d)
	}
	mustDecide(t, g, warm) // 1 of 4
	g.Wait()
	s.Stop()
	var last error
	for range DefaultBreakerConnFailures + 1 {
		_, last = g.Decide(context.Background(), []Hit{hit(k.Key("uid", "new"), 5, time.Minute)})
	}
	if !errors.Is(last, ErrBreakerOpen) {
		t.Fatalf("with Redis stopped: %v, want the breaker open", last)
	}
	if d, err := g.Decide(context.Background(), []Hit{hot}); err != nil || d.Allowed || d.Source != SourceLocalFull {
		t.Fatalf("the key Redis said full, breaker open: %+v, %v; want the Guard's refusal", d, err)
	}
	// The fallback: warm was at 1 of 4 → ceil(3/2) = 2 locally.
	for i := range 3 {
		if d := mustDecide(t, fb, warm); d.Allowed != (i < 2) {
			t.Fatalf("fallback request %d on a key at 1 of 4, fleet of 2: %+v", i, d)
		}
	}
}

// gate is a Limiter whose calls wait until it is opened: calls in flight.
type gate struct {
	open    chan struct{}
	entered chan struct{}
}

func (g *gate) Decide(ctx context.Context, _ []Hit) (Decision, error) {
	g.entered <- struct{}{}
	select {
	case <-g.open:
		return Decision{Allowed: true, Index: -1, ShadowIndex: -1}, nil
	case <-ctx.Done():
		return Decision{}, ctx.Err()
	}
}

// TestFallbackInFlight: calls this sidecar still has in flight to Redis
// for a key may yet be admitted there: each takes one from the key's local
// allowance, and a timed-out call's request holds a local place even when
// the fallback denies it. A burst whose calls all time out at once admits
// nothing locally beyond what its calls could not have taken.
func TestFallbackInFlight(t *testing.T) {
	clock := newStepClock()
	f, err := NewFallback(FallbackOptions{Now: clock.Now, Size: func() int { return 1 }})
	if err != nil {
		t.Fatal(err)
	}
	g := &gate{open: make(chan struct{}), entered: make(chan struct{}, 16)}
	lim := f.Watch(g)
	h := hit("hot", 3, time.Second)
	ctx, cancel := context.WithCancel(context.Background())
	errs := make(chan error, 3)
	for range 3 {
		go func() {
			_, err := lim.Decide(ctx, []Hit{h})
			errs <- err
		}()
	}
	for range 3 {
		<-g.entered
	}
	// Three calls in flight for a 3/s key: nothing is left locally.
	if d, err := f.DecideAfter(context.Background(), []Hit{h}, errTimeout); err != nil || d.Allowed {
		t.Fatalf("with 3 calls in flight on a 3/s key: %+v, %v; want denied", d, err)
	}
	// Another key is not affected.
	if d := mustDecide(t, f, hit("cold", 3, time.Second)); !d.Allowed {
		t.Fatalf("another key: %+v", d)
	}
	cancel() // the calls time out together
	for range 3 {
		<-errs
	}
	// The denied timed-out request above holds a place: 2 are left.
	for i := range 3 {
		d, err := f.DecideAfter(context.Background(), []Hit{h}, errTimeout)
		if err != nil || d.Allowed != (i < 2) {
			t.Fatalf("timed-out request %d after the calls ended: %+v, %v", i, d, err)
		}
	}
	// A refused connection never reached Redis: a local denial records nothing.
	k := hit("refused", 1, time.Second)
	mustDecide(t, f, k)
	for range 3 {
		if d, _ := f.DecideAfter(context.Background(), []Hit{k}, errRefused); d.Allowed {
			t.Fatal("over the limit after refused connections")
		}
	}
	clock.Advance(time.Second)
	if d, _ := f.DecideAfter(context.Background(), []Hit{k}, errRefused); !d.Allowed {
		t.Fatalf("a window later: %+v; the refused denials were recorded", d)
	}
}

// TestFleetOutageKeepsCount: when Redis stops answering, the count stays
// what it was: the members that were beating are not counted out.
func TestFleetOutageKeepsCount(t *testing.T) {
	s, c := startRedis(t)
	key := testKeys(t).Fleet("flashsale")
	ctx := context.Background()
	var fleets []*Fleet
	for _, id := range []string{"a", "b", "c"} {
		f, err := NewFleet(c, FleetOptions{Key: key, ID: id, TTL: 300 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.Beat(ctx); err != nil {
			t.Fatal(err)
		}
		fleets = append(fleets, f)
	}
	if n, err := fleets[0].Beat(ctx); err != nil || n != 3 {
		t.Fatalf("a's beat after all joined: %d, %v", n, err)
	}
	s.Stop()
	time.Sleep(time.Second) // three TTLs without a beat answering
	if _, err := fleets[0].Beat(ctx); err == nil {
		t.Fatal("a beat answered with Redis stopped")
	}
	if n, known := fleets[0].Size(); n != 3 || !known {
		t.Fatalf("size during the outage = %d (known %v), want the last count, 3", n, known)
	}
}

// TestRedisNoScriptReloadsOnce: after Redis lost its scripts (a restart, a
// failover, SCRIPT FLUSH), a burst of checks that all meet NOSCRIPT loads
// the script once, not once per check, and never sends its body with EVAL.
func TestRedisNoScriptReloadsOnce(t *testing.T) {
	s, c := startRedis(t)
	r := newTestRedis(t, c, RedisOptions{})
	if err := r.Warm(context.Background(), 4); err != nil {
		t.Fatal(err)
	}
	admin := redis.NewClient(&redis.Options{Addr: s.Addr()})
	defer admin.Close()
	if err := admin.ScriptFlush(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	before := commandCalls(t, admin)
	k := testKeys(t)
	var wg sync.WaitGroup
	for i := range 32 {
		wg.Go(func() {
			if _, err := r.Decide(context.Background(), []Hit{hit(k.Key("u", fmt.Sprint(i)), 5, time.Second)}); err != nil {
				t.Errorf("decision %d: %v", i, err)
			}
		})
	}
	wg.Wait()
	after := commandCalls(t, admin)
	if n := after["script|load"] - before["script|load"]; n != 1 {
		t.Errorf("32 checks after SCRIPT FLUSH sent SCRIPT LOAD %d times, want once", n)
	}
	if n := after["eval"] - before["eval"]; n != 0 {
		t.Errorf("32 checks after SCRIPT FLUSH sent the script's body with EVAL %d times, want none", n)
	}
}

// TestRedisNoScriptLoadRefused: where SCRIPT LOAD fails (here an ACL
// forbids it; on a Cluster, a node that is down or loading), checks that
// meet NOSCRIPT still decide, by EVAL, which caches the script on the node
// that holds the key.
func TestRedisNoScriptLoadRefused(t *testing.T) {
	s, _ := startRedis(t)
	admin := redis.NewClient(&redis.Options{Addr: s.Addr()})
	defer admin.Close()
	ctx := context.Background()
	if err := admin.Do(ctx, "ACL", "SETUSER", "lim", "on", ">pw", "~*", "+@all", "-script|load").Err(); err != nil {
		t.Fatalf("ACL SETUSER: %v", err)
	}
	for _, ap := range []bool{false, true} {
		c := newTestClient(t, ClientConfig{Addrs: []string{s.Addr()}, Username: "lim", Password: "pw"})
		r := newTestRedis(t, c, RedisOptions{AutoPipeline: ap})
		if ap {
			r.pipe.alwaysQueue = true // through the batching dispatchers
		}
		t.Cleanup(r.Close)
		if err := r.Warm(ctx, 2); err != nil {
			t.Fatalf("autopipeline=%t: Warm where SCRIPT LOAD is refused: %v (the load is best effort)", ap, err)
		}
		k := testKeys(t)
		for i := range 3 {
			if err := admin.ScriptFlush(ctx).Err(); err != nil {
				t.Fatal(err)
			}
			if d := mustDecide(t, r, hit(k.Key("u", "1"), 5, time.Minute)); !d.Allowed || d.Count != i+1 {
				t.Fatalf("autopipeline=%t: decision %d after SCRIPT FLUSH, SCRIPT LOAD refused: %+v", ap, i, d)
			}
		}
	}
}

// TestBreakerLateFailureKeepsProbe: a call let through before the breaker
// opened that fails while a probe is in flight does not cancel the probe
// nor extend the cooldown: the probe's success closes the breaker.
func TestBreakerLateFailureKeepsProbe(t *testing.T) {
	b, _, clock := newTestBreaker(t)
	ctx := context.Background()
	early, ok := b.allow() // let through while closed; it will fail late
	if !ok || early != 0 {
		t.Fatalf("allow while closed = %d, %v", early, ok)
	}
	for range DefaultBreakerConnFailures {
		b.record(ctx, errRefused, 0)
	}
	if !b.Open() {
		t.Fatal("not open after connection errors")
	}
	clock.Advance(DefaultBreakerCooldown)
	probe, ok := b.allow()
	if !ok || probe == 0 {
		t.Fatalf("no probe after the cooldown: %d, %v", probe, ok)
	}
	b.record(ctx, errRefused, early) // the early call fails now
	if _, ok := b.allow(); ok {
		t.Fatal("a second probe while the first is in flight")
	}
	b.record(ctx, nil, probe)
	if b.Open() {
		t.Fatal("the probe's success did not close the breaker: the late failure cancelled it")
	}
}
