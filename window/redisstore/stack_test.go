package redisstore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashgate/flashgate/window"
	"github.com/flashgate/flashgate/window/fallback"
	"github.com/flashgate/flashgate/window/guard"
	"github.com/flashgate/flashgate/window/redistest"
)

// TestBudgetDeadline: a backend that outlives the budget is cut at it, and
// the timeout counts as a sample as long as the budget.
func TestBudgetDeadline(t *testing.T) {
	s, c := startRedis(t)
	r := newTestRedis(t, c, Options{})
	b, err := guard.NewBudget(r, guard.BudgetOptions{Min: 50 * time.Millisecond, Max: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	mustDecide(t, r, hit(testKeys(t).Key("warm", "up"), 5, time.Second)) // the store itself: a warm-up is no budget test
	wait := pauseRedis(t, s.Addr(), 500*time.Millisecond)
	start := time.Now()
	_, err = b.Decide(context.Background(), []window.Hit{hit(testKeys(t).Key("u", "1"), 5, time.Second)})
	took := time.Since(start)
	wait()
	if window.Classify(err) != window.KindTimeout {
		t.Fatalf("Decide on a paused Redis = %v (%s), want a timeout", err, window.Classify(err))
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
	r := newTunedRedis(t, c, Options{AutoPipeline: true}, withWorkers(2))
	t.Cleanup(r.Close)
	const budget = 60 * time.Millisecond
	b, err := guard.NewBudget(r, guard.BudgetOptions{Min: budget, Max: budget})
	if err != nil {
		t.Fatal(err)
	}
	k := testKeys(t)
	mustDecide(t, r, hit(k.Key("warm", "up"), 5, time.Minute)) // the store itself: a warm-up is no budget test

	wait := pauseRedis(t, s.Addr(), time.Second)
	// Nothing in flight: a check goes out on its own, with its budget in
	// its context.
	start := time.Now()
	_, err = b.Decide(context.Background(), []window.Hit{hit(k.Key("lone", "1"), 5, time.Minute)})
	if took := time.Since(start); window.Classify(err) != window.KindTimeout || took < budget || took > 700*time.Millisecond {
		t.Fatalf("a check sent alone to a stuck Redis = %v (%s) after %s, want a timeout at its budget of %s", err, window.Classify(err), took, budget)
	}
	var wg sync.WaitGroup
	for i := range 2 { // both slots: sent, stuck until Redis is free
		wg.Go(func() {
			_, _ = r.Decide(context.Background(), []window.Hit{hit(k.Key("slot", fmt.Sprint(i)), 5, time.Minute)})
		})
	}
	time.Sleep(30 * time.Millisecond)
	queued := someKeys(t, 10)
	for _, key := range queued {
		wg.Go(func() {
			start := time.Now()
			_, err := b.Decide(context.Background(), []window.Hit{hit(key, 5, time.Minute)})
			took := time.Since(start)
			if window.Classify(err) != window.KindTimeout || !strings.Contains(err.Error(), "within the budget") {
				t.Errorf("a check queued behind a stuck Redis = %v (%s), want the budget's timeout", err, window.Classify(err))
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

// TestStackRedisDown: Guard(Watch(Breaker(Budget(Redis)))) with Redis
// stopped: the breaker opens on connection errors, the Guard still refuses
// what Redis said was full, and the fallback enforces the seeded share.
func TestStackRedisDown(t *testing.T) {
	s, c := startRedis(t)
	r := newTestRedis(t, c, Options{})
	bud, err := guard.NewBudget(r, guard.BudgetOptions{Min: time.Second, Max: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	br, err := guard.NewBreaker(bud, guard.BreakerOptions{Cooldown: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	fb, err := fallback.New(fallback.Options{Size: func() int { return 2 }})
	if err != nil {
		t.Fatal(err)
	}
	g, err := guard.NewGuard(fb.Watch(br), guard.GuardOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(g.Close)
	k := testKeys(t)
	hot, warm := hit(k.Key("uid", "hot"), 2, time.Minute), hit(k.Key("uid", "warm"), 4, time.Minute)
	mustDecide(t, g, hot)
	mustDecide(t, g, hot)
	if d := mustDecide(t, g, hot); d.Allowed || d.Source != window.SourceBackend {
		t.Fatalf("third on a 2/min key: %+v, want Redis's denial", d)
	}
	mustDecide(t, g, warm) // 1 of 4
	s.Stop()
	var last error
	for range guard.DefaultBreakerConnFailures + 1 {
		_, last = g.Decide(context.Background(), []window.Hit{hit(k.Key("uid", "new"), 5, time.Minute)})
	}
	if !errors.Is(last, window.ErrBreakerOpen) {
		t.Fatalf("with Redis stopped: %v, want the breaker open", last)
	}
	if d, err := g.Decide(context.Background(), []window.Hit{hot}); err != nil || d.Allowed || d.Source != window.SourceLocalFull {
		t.Fatalf("the key Redis said full, breaker open: %+v, %v; want the Guard's refusal", d, err)
	}
	// The fallback: warm was at 1 of 4 → ceil(3/2) = 2 locally.
	for i := range 3 {
		if d := mustDecide(t, fb, warm); d.Allowed != (i < 2) {
			t.Fatalf("fallback request %d on a key at 1 of 4, fleet of 2: %+v", i, d)
		}
	}
}

// TestRedisNoScriptReloadsOnce: after Redis lost its scripts (a restart, a
// failover, SCRIPT FLUSH), a burst of checks that all meet NOSCRIPT loads
// the script once, not once per check, and never sends its body with EVAL.
func TestRedisNoScriptReloadsOnce(t *testing.T) {
	s := redistest.Start(t)
	// A connection for each of the burst's checks: with fewer, go-redis's
	// refill of idle connections can race a check's dial and refuse it as
	// "connection pool exhausted" on a loaded machine, which is not what
	// this test is about.
	c := newTestClient(t, ClientConfig{Addrs: []string{s.Addr()}, PoolSize: 64})
	r := newTestRedis(t, c, Options{})
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
			if _, err := r.Decide(context.Background(), []window.Hit{hit(k.Key("u", fmt.Sprint(i)), 5, time.Second)}); err != nil {
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
		var tune func(*pipelineTuning)
		if ap {
			tune = queued // through the batching dispatchers
		}
		r := newTunedRedis(t, c, Options{AutoPipeline: ap}, tune)
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
