package redisstore

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashgate/flashgate/window"
	"github.com/flashgate/flashgate/window/testclock"
)

// nowClock returns a settable clock at the real time: bans end at Redis's
// PXAT, which must lie in Redis's future.
func nowClock() *testclock.Clock {
	c := testclock.New()
	c.Advance(time.Until(c.Now()) * -1)
	return c
}

func TestReporterRaisesAndRenews(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, c := startRedis(t)
	keys := testKeys(t)
	clock := nowClock()
	b, err := NewFleetBans(c, keys, FleetBansOptions{Clock: ClockLocal, Now: clock.Now})
	if err != nil {
		t.Fatalf("NewFleetBans: %v", err)
	}
	r, err := b.NewReporter(ReporterOptions{})
	if err != nil {
		t.Fatalf("NewReporter: %v", err)
	}
	msgs := subscribe(t, c, b)
	k, quiet := keys.Key("r", "abuser"), keys.Key("r", "quiet")
	ban := window.Ban{Threshold: 3, Window: 10 * time.Second, Duration: time.Minute}
	deny := func(key string, n int) {
		for range n {
			r.Denied(key, ban)
		}
	}

	deny(k, 2)
	deny(quiet, 1)
	r.Flush(ctx)
	deny(k, 1) // 3 in total: not above the threshold
	r.Flush(ctx)
	if _, banned, _ := b.Get(ctx, k); banned {
		t.Fatal("banned at the threshold, want only above it")
	}
	if ttl := c.PTTL(ctx, k+counterSuffix).Val(); ttl <= 0 || ttl > 10*time.Second {
		t.Fatalf("denial counter's TTL %v, want the ban window", ttl)
	}
	deny(k, 1)
	r.Flush(ctx)
	want := clock.Now().Add(time.Minute).UnixMilli()
	if got, want := nextMessage(t, msgs), "ban "+itoa(want)+" "+k+" threshold"; got != want {
		t.Fatalf("message %q, want %q", got, want)
	}
	if until, banned, err := b.Get(ctx, k); !banned || err != nil || until.UnixMilli() != want {
		t.Fatalf("Get = %v, %v, %v; want banned until %d", until, banned, err, want)
	}
	if list, _ := b.List(ctx); len(list) != 1 || list[0].Key != k {
		t.Fatalf("index %+v, want %s", list, k)
	}
	if st := r.Stats(); st.Raised != 1 || st.Sent != 5 {
		t.Fatalf("stats %+v, want 1 raised, 5 sent", st)
	}

	// A banned key is reported at most once a second, and renewed then.
	deny(k, 10)
	r.Flush(ctx)
	if st := r.Stats(); st.Sent != 5 {
		t.Fatalf("a banned key reported again within its second: %+v", st)
	}
	clock.Advance(1500 * time.Millisecond)
	r.Flush(ctx)
	want = clock.Now().Add(time.Minute).UnixMilli()
	if got, want := nextMessage(t, msgs), "ban "+itoa(want)+" "+k+" threshold"; got != want {
		t.Fatalf("renewal message %q, want %q", got, want)
	}
	if st := r.Stats(); st.Renewed != 1 || st.Sent != 15 {
		t.Fatalf("stats %+v, want 1 renewed, 15 sent", st)
	}
	// Nothing pending: the keys are forgotten once their second is out.
	clock.Advance(2 * time.Second)
	r.Flush(ctx)
	if n := r.pendingKeys(); n != 0 {
		t.Fatalf("%d keys pending after everything was reported", n)
	}
}

func (r *Reporter) pendingKeys() int {
	n := 0
	for i := range r.shards {
		r.shards[i].mu.Lock()
		n += len(r.shards[i].pending)
		r.shards[i].mu.Unlock()
	}
	return n
}

func TestReporterBoundedAndRedisDown(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, c := startRedis(t)
	keys := testKeys(t)
	b, err := NewFleetBans(c, keys, FleetBansOptions{})
	if err != nil {
		t.Fatalf("NewFleetBans: %v", err)
	}
	r, err := b.NewReporter(ReporterOptions{MaxKeys: reportShards})
	if err != nil {
		t.Fatalf("NewReporter: %v", err)
	}
	for i := range 200 {
		r.Denied(keys.Key("r", itoa(int64(i))), window.DefaultBan)
	}
	if n := r.pendingKeys(); n > reportShards {
		t.Fatalf("%d keys pending, bound %d", n, reportShards)
	}
	if st := r.Stats(); st.Dropped != uint64(200-r.pendingKeys()) {
		t.Fatalf("stats %+v: want the %d denials beyond the bound dropped", st, 200-r.pendingKeys())
	}
	pending := r.pendingKeys()
	s.Kill()
	r.Flush(ctx)
	if st := r.Stats(); st.Failed != uint64(pending) || st.Sent != 0 {
		t.Fatalf("stats %+v with Redis down: want %d failed", st, pending)
	}
}

// applied is a BanApplier that records the bans in effect.
type applied struct {
	mu   sync.Mutex
	bans map[string]time.Time
}

func (a *applied) Ban(key string, until time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.bans[key] = until
}

func (a *applied) Lift(key string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.bans, key)
}

func (a *applied) get(key string) (time.Time, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	u, ok := a.bans[key]
	return u, ok
}

// events records a Subscriber's events.
type events struct {
	mu     sync.Mutex
	raised []string
	lifted []string
}

func (e *events) Raised(rule string, by BanOrigin) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.raised = append(e.raised, rule+"/"+by.String())
}

func (e *events) Lifted(rule string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.lifted = append(e.lifted, rule)
}

func (e *events) String() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return "raised " + strings.Join(e.raised, ",") + "; lifted " + strings.Join(e.lifted, ",")
}

// eventually polls cond every 20 ms for up to 10 s.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 10 s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func startSubscriber(t *testing.T, b *FleetBans, opts SubscriberOptions) (*Subscriber, *applied) {
	t.Helper()
	a := &applied{bans: make(map[string]time.Time)}
	s, err := b.NewSubscriber(a, opts)
	if err != nil {
		t.Fatalf("NewSubscriber: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); s.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	select {
	case <-s.Synced():
	case <-time.After(10 * time.Second):
		t.Fatal("subscriber not synced within 10 s")
	}
	return s, a
}

func TestSubscriberFollowsTheFleet(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b, keys, c := newTestBans(t)
	before, later := keys.Key("rule_a", "before"), keys.Key("rule_b", "later")
	until := time.Now().Add(time.Hour).Truncate(time.Millisecond)
	if err := b.Add(ctx, before, until); err != nil {
		t.Fatalf("Add: %v", err)
	}
	ev := &events{}
	s, a := startSubscriber(t, b, SubscriberOptions{Events: ev, Resync: -1, OnError: func(err error) { t.Logf("%s %v", time.Now().Format("05.000"), err) }})
	if u, ok := a.get(before); !ok || !u.Equal(until) {
		t.Fatalf("after the first sync: ban %v, %v; want until %v", u, ok, until)
	}
	if err := b.Add(ctx, later, until); err != nil {
		t.Fatalf("Add: %v", err)
	}
	eventually(t, "a ban added after the sync applied", func() bool { _, ok := a.get(later); return ok })
	if err := b.Lift(ctx, before, false); err != nil {
		t.Fatalf("Lift: %v", err)
	}
	eventually(t, "the lift applied", func() bool { _, ok := a.get(before); return !ok })
	if got, want := ev.String(), "raised rule_b/hand; lifted rule_a"; got != want {
		t.Fatalf("events %q, want %q", got, want)
	}
	inForce := map[string]int{}
	s.InForce(func(rule string, n int) { inForce[rule] = n })
	if len(inForce) != 1 || inForce["rule_b"] != 1 {
		t.Fatalf("in force %v, want rule_b: 1", inForce)
	}

	// Lifted while the subscriber was away (no message reaches it): the
	// resync after its reconnection lifts it.
	c.ZRem(ctx, b.Channel(), later)
	c.Del(ctx, later+banSuffix)
	if err := c.Do(ctx, "CLIENT", "KILL", "TYPE", "pubsub").Err(); err != nil {
		t.Fatalf("CLIENT KILL: %v", err)
	}
	eventually(t, "a ban lifted while away lifted on resync", func() bool { _, ok := a.get(later); return !ok })
}

// TestSubscriberRestoresLostBans: Redis restarted empty; every ban the
// subscriber held that is still in force is written back.
func TestSubscriberRestoresLostBans(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv, c := startRedis(t)
	keys := testKeys(t)
	b, err := NewFleetBans(c, keys, FleetBansOptions{})
	if err != nil {
		t.Fatalf("NewFleetBans: %v", err)
	}
	k := keys.Key("r", "abuser")
	until := time.Now().Add(time.Hour).Truncate(time.Millisecond)
	if err := b.Add(ctx, k, until); err != nil {
		t.Fatalf("Add: %v", err)
	}
	_, a := startSubscriber(t, b, SubscriberOptions{})
	srv.Restart() // empty: persistence is off
	if n := c.Exists(ctx, k+banSuffix).Val(); n != 0 {
		t.Fatal("the restarted Redis still holds the ban")
	}
	eventually(t, "the lost ban written back", func() bool {
		u, banned, err := b.Get(ctx, k)
		return err == nil && banned && u.Equal(until)
	})
	eventually(t, "the lost ban indexed again", func() bool {
		list, err := b.List(ctx)
		return err == nil && len(list) == 1 && list[0].Key == k
	})
	if u, ok := a.get(k); !ok || !u.Equal(until) {
		t.Fatalf("the sidecar's ban %v, %v; want until %v throughout", u, ok, until)
	}
	// The index's epoch is not a ban.
	if n := c.ZCard(ctx, b.Channel()).Val(); n != 2 {
		t.Fatalf("index holds %d members, want the ban and the epoch", n)
	}
}

// BenchmarkReporterDenied is what a fleet reporter adds to a refusal on the
// check path: one key denied from every core.
func BenchmarkReporterDenied(b *testing.B) {
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}) // never contacted
	defer c.Close()
	fb, err := NewFleetBans(c, window.Keys{}, FleetBansOptions{})
	if err != nil {
		b.Fatal(err)
	}
	r, err := fb.NewReporter(ReporterOptions{})
	if err != nil {
		b.Fatal(err)
	}
	k := window.Keys{}.Key("rule", "abuser")
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			r.Denied(k, window.DefaultBan)
		}
	})
}
