package redisstore

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashgate/flashgate/window"
	"github.com/flashgate/flashgate/window/bans"
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

func (e *events) Raised(rule string, by bans.Origin) {
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

// TestSubscriberNoticesFlush: Redis loses the index without dropping the
// subscription (FLUSHALL): the periodic check of the epoch finds it and the
// bans held are written back.
func TestSubscriberNoticesFlush(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b, keys, c := newTestBans(t)
	k := keys.Key("r", "abuser")
	until := time.Now().Add(time.Hour).Truncate(time.Millisecond)
	if err := b.Add(ctx, k, until); err != nil {
		t.Fatalf("Add: %v", err)
	}
	startSubscriber(t, b, SubscriberOptions{Resync: 50 * time.Millisecond})
	if err := c.FlushAll(ctx).Err(); err != nil {
		t.Fatalf("FLUSHALL: %v", err)
	}
	eventually(t, "the flushed ban written back", func() bool {
		u, banned, err := b.Get(ctx, k)
		list, lerr := b.List(ctx)
		return err == nil && banned && u.Equal(until) && lerr == nil && len(list) == 1
	})
}

// BenchmarkReporterDenied is Reporter.Denied alone: one key denied from
// every core at once (its shard's lock contended).
func BenchmarkReporterDenied(b *testing.B) {
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}) // never contacted: nothing is flushed
	defer c.Close()
	fb, err := NewFleetBans(c, window.Keys{}, FleetBansOptions{})
	if err != nil {
		b.Fatal(err)
	}
	r, err := fb.NewReporter(ReporterOptions{})
	if err != nil {
		b.Fatal(err)
	}
	k := window.Keys{}.Key("coupon_per_uid", "abuser")
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			r.Denied(k, window.DefaultBan)
		}
	})
}

// TestLongBanOutlivesFlush: a day's ban held by a sidecar, then FLUSHALL
// while the key keeps being denied. The denials raise the rule's 5-minute
// box on the empty Redis; the sidecar keeps the day and writes it back, so
// Redis, its index and the sidecar all say the day again.
func TestLongBanOutlivesFlush(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b, keys, c := newTestBans(t)
	k := keys.Key("r", "abuser")
	day := time.Now().Add(24 * time.Hour).Truncate(time.Millisecond)
	if err := b.Add(ctx, k, day); err != nil {
		t.Fatalf("Add: %v", err)
	}
	// Resync never: the channel alone must carry it.
	_, a := startSubscriber(t, b, SubscriberOptions{Resync: -1})
	eventually(t, "the day's ban applied", func() bool { u, ok := a.get(k); return ok && u.Equal(day) })
	r, err := b.NewReporter(ReporterOptions{})
	if err != nil {
		t.Fatalf("NewReporter: %v", err)
	}
	if err := c.FlushAll(ctx).Err(); err != nil {
		t.Fatalf("FLUSHALL: %v", err)
	}
	for range 10 {
		r.Denied(k, window.DefaultBan)
	}
	r.Flush(ctx)
	if st := r.Stats(); st.Raised != 1 {
		t.Fatalf("reporter stats %+v: want the 5-minute ban raised on the empty Redis", st)
	}
	wantHeldEverywhere(t, b, a, k, day)
}

// TestSyncKeepsLongBanOverShorterRaise: Redis is flushed and, before the
// sidecar's next sync, a fresh count raised a 5-minute ban it did not hear
// of (written here in the flush's own transaction): the sync finds the
// epoch changed and writes the day back over the 5 minutes.
func TestSyncKeepsLongBanOverShorterRaise(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b, keys, c := newTestBans(t)
	k := keys.Key("r", "abuser")
	day := time.Now().Add(24 * time.Hour).Truncate(time.Millisecond)
	if err := b.Add(ctx, k, day); err != nil {
		t.Fatalf("Add: %v", err)
	}
	_, a := startSubscriber(t, b, SubscriberOptions{Resync: 50 * time.Millisecond})
	eventually(t, "the day's ban applied", func() bool { u, ok := a.get(k); return ok && u.Equal(day) })
	five := time.Now().Add(5 * time.Minute).UnixMilli()
	if _, err := c.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.FlushAll(ctx)
		p.Do(ctx, "SET", k+banSuffix, five, "PXAT", five)
		p.ZAdd(ctx, b.Channel(), redis.Z{Score: float64(five), Member: k})
		return nil
	}); err != nil {
		t.Fatalf("FLUSHALL and a 5-minute ban: %v", err)
	}
	wantHeldEverywhere(t, b, a, k, day)
}

// wantHeldEverywhere waits until Redis's ban of k and its index say until,
// and checks that the sidecar a held until throughout.
func wantHeldEverywhere(t *testing.T, b *FleetBans, a *applied, k string, until time.Time) {
	t.Helper()
	ctx := context.Background()
	eventually(t, "the held ban written back", func() bool {
		u, banned, err := b.Get(ctx, k)
		list, lerr := b.List(ctx)
		return err == nil && banned && u.Equal(until) && lerr == nil && len(list) == 1 && list[0].Until.Equal(until)
	})
	if u, ok := a.get(k); !ok || !u.Equal(until) {
		t.Fatalf("the sidecar's ban %v, %v; want %v", u, ok, until)
	}
}

// TestReporterSleepsWhenQuiet: a running reporter with nothing pending
// waits for a denial instead of ticking; a denial wakes it and is reported,
// and once its key is forgotten (nothing pending, no renewal to wait out)
// the reporter waits again.
func TestReporterSleepsWhenQuiet(t *testing.T) {
	t.Parallel()
	b, keys, _ := newTestBans(t)
	r, err := b.NewReporter(ReporterOptions{Interval: 10 * time.Millisecond})
	if err != nil {
		t.Fatalf("NewReporter: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); r.Run(ctx) }()
	defer func() { cancel(); <-done }()
	eventually(t, "the reporter waits with nothing pending", r.idle.Load)
	r.Denied(keys.Key("r", "one"), window.Ban{Threshold: 3, Window: 10 * time.Second, Duration: time.Minute})
	eventually(t, "the denial reported", func() bool { return r.Stats().Sent == 1 })
	eventually(t, "the reporter waits again", func() bool { return r.idle.Load() && r.pendingKeys() == 0 })
}
