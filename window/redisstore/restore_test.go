package redisstore

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashgate/flashgate/window"
	"github.com/flashgate/flashgate/window/fallback"
	"github.com/flashgate/flashgate/window/redistest"
	"github.com/flashgate/flashgate/window/testclock"
)

// sidecar is one process's stack for the write-back tests:
// Fallback.Watch(Redis), with failure mode local decided by the Fallback as
// extauthz does.
type sidecar struct {
	f   *fallback.Fallback
	lim window.Limiter
}

func newSidecar(t *testing.T, to fallback.Restorer, r window.Limiter, o fallback.Options) *sidecar {
	t.Helper()
	o.WriteBack = to
	f, err := fallback.New(o)
	if err != nil {
		t.Fatal(err)
	}
	return &sidecar{f: f, lim: f.Watch(r)}
}

// check decides hits through the stack, or locally when the stack fails;
// byRedis tells which.
func (s *sidecar) check(t *testing.T, hits ...window.Hit) (d window.Decision, byRedis bool, err error) {
	t.Helper()
	d, err = s.lim.Decide(context.Background(), hits)
	if err == nil {
		return d, true, nil
	}
	local, ferr := s.f.DecideAfter(context.Background(), hits, err)
	if ferr != nil {
		t.Fatalf("fallback: %v", ferr)
	}
	return local, false, err
}

// untilRedis checks hits until Redis decides one, and returns that decision
// and how many were admitted locally before it. Every failure before it
// must be fallback.ErrRestoring or, while the write-back has not landed, Redis's.
func (s *sidecar) untilRedis(t *testing.T, hits ...window.Hit) (window.Decision, int) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	local := 0
	for {
		d, byRedis, err := s.check(t, hits...)
		if byRedis {
			return d, local
		}
		if d.Allowed {
			local++
		}
		if time.Now().After(deadline) {
			t.Fatalf("no decision by Redis within 15s; last error %v, write-back %+v", err, s.f.WriteBack())
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func zcard(t *testing.T, c redis.UniversalClient, key string) int64 {
	t.Helper()
	n, err := c.ZCard(context.Background(), key).Result()
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// newFleet returns n sidecars on c, each with a store of its own, that
// count a fleet of n on clock and settle for settle after an outage.
func newFleet(t *testing.T, c Client, clock *testclock.Clock, settle time.Duration, n int) []*sidecar {
	t.Helper()
	fleet := make([]*sidecar, n)
	for i := range fleet {
		r := newTestRedis(t, c, Options{})
		fleet[i] = newSidecar(t, r, r, fallback.Options{Now: clock.Now, Size: func() int { return n }, Settle: settle})
	}
	return fleet
}

// admitLocally checks h times times on each sidecar of fleet, Redis being
// down, and returns how many were admitted; a decision by Redis fails t.
func admitLocally(t *testing.T, fleet []*sidecar, h window.Hit, times int) int {
	t.Helper()
	admitted := 0
	for _, sc := range fleet {
		for range times {
			d, byRedis, _ := sc.check(t, h)
			if byRedis {
				t.Fatal("decided by Redis while it was down")
			}
			if d.Allowed {
				admitted++
			}
		}
	}
	return admitted
}

// redisRounds has each sidecar of fleet decide h by Redis, rounds times
// over, and returns the admissions Redis made and those made locally
// before them (see untilRedis).
func redisRounds(t *testing.T, fleet []*sidecar, h window.Hit, rounds int) (byRedis, local int) {
	t.Helper()
	for range rounds {
		for _, sc := range fleet {
			d, l := sc.untilRedis(t, h)
			local += l
			if d.Allowed {
				byRedis++
			}
		}
	}
	return byRedis, local
}

// TestWriteBackBeforeRedisDecides: what a sidecar admitted locally while
// Redis was down is in the key's window before Redis decides the key again,
// at the admissions' times; a retry-after counts from them.
func TestWriteBackBeforeRedisDecides(t *testing.T) {
	s, c := startRedis(t)
	r := newTestRedis(t, c, Options{})
	clock := testclock.New()
	sc := newSidecar(t, r, r, fallback.Options{Now: clock.Now, Settle: -1})
	k := testKeys(t)
	h := hit(k.Key("uid", "hot"), 100, 10*time.Second)
	if d, byRedis, err := sc.check(t, h); !byRedis || !d.Allowed || d.Count != 1 {
		t.Fatalf("first check with Redis up: %+v, by Redis %v, %v", d, byRedis, err)
	}

	s.Kill()
	for i := range 4 {
		d, byRedis, err := sc.check(t, h)
		if byRedis || !d.Allowed {
			t.Fatalf("local check %d with Redis down: %+v, by Redis %v, %v", i, d, byRedis, err)
		}
		clock.Advance(100 * time.Millisecond)
	}
	s.Restart() // empty: the entry admitted before the outage is gone

	d, local := sc.untilRedis(t, h)
	// Redis's first decision counts every local admission: the 4 of the
	// outage and those made while the write-back was on its way.
	if want := 4 + local + 1; !d.Allowed || d.Count != want {
		t.Fatalf("first decision by Redis after the outage: %+v; want count %d (4 + %d local + this one)", d, want, local)
	}
	if st := sc.f.WriteBack(); st.Landed == 0 || st.Pending != 0 || st.Written != uint64(4+local) {
		t.Fatalf("write-back stats %+v: want landed, nothing pending, %d written", st, 4+local)
	}

	// The retry-after of a full key counts from the written-back times:
	// admissions 300, 200 and 100 ms before the write-back (the clock stood
	// still after them).
	full := hit(k.Key("uid", "full"), 3, 10*time.Second)
	s.Kill()
	for range 3 {
		if d, byRedis, _ := sc.check(t, full); byRedis || !d.Allowed {
			t.Fatalf("local check with Redis down: %+v", d)
		}
		clock.Advance(100 * time.Millisecond)
	}
	s.Restart()
	d, local = sc.untilRedis(t, full)
	if local != 0 || d.Allowed || d.Count != 3 {
		t.Fatalf("a key filled locally, after the return: %+v (%d more local admissions); want denied at 3", d, local)
	}
	// The oldest admission is 300 ms old at the write-back: Redis admits
	// again 9.7 s after it, less the time the decision took.
	if want := 9700 * time.Millisecond; d.RetryAfter > want || d.RetryAfter < want-5*time.Second {
		t.Fatalf("retry-after %v, want just under %v", d.RetryAfter, want)
	}
}

// flaky is a fallback.Restorer in front of a real Redis: it fails its first fail
// calls with err, after running them on Redis when ran is set (a reply
// lost on its way back).
type flaky struct {
	r     *Redis
	err   error
	ran   bool
	fail  atomic.Int32
	calls atomic.Int32
}

func (f *flaky) Restore(ctx context.Context, batch []window.Admitted) error {
	f.calls.Add(1)
	if f.fail.Add(-1) < 0 {
		return f.r.Restore(ctx, batch)
	}
	if f.ran {
		if err := f.r.Restore(ctx, batch); err != nil {
			return err
		}
	}
	return f.err
}

func (f *flaky) RunID(ctx context.Context) (string, error) { return f.r.RunID(ctx) }

// TestWriteBackRetriedOnce: a write-back whose reply was lost (it landed,
// then timed out) is sent again and counted once, on exact and bucketed
// keys alike.
func TestWriteBackRetriedOnce(t *testing.T) {
	_, c := startRedis(t)
	r := newTestRedis(t, c, Options{})
	k := testKeys(t)
	for name, lim := range map[string]window.Limit{
		"exact":    {Requests: 50, Window: time.Minute},
		"bucketed": {Requests: 50, Window: time.Minute, Buckets: 6},
	} {
		t.Run(name, func(t *testing.T) {
			to := &flaky{r: r, err: fmt.Errorf("lost reply: %w", context.DeadlineExceeded), ran: true}
			to.fail.Store(2)
			clock := testclock.New()
			sc := newSidecar(t, to, r, fallback.Options{Now: clock.Now, Settle: -1})
			h := window.Hit{Key: k.Key(name, "x"), Rule: name, Limit: lim, Cost: 3}
			for range 2 { // cost 3 each: 6 entries
				if d, _ := sc.f.DecideAfter(context.Background(), []window.Hit{h}, errRefused); !d.Allowed {
					t.Fatalf("local admission: %+v", d)
				}
			}
			one := h
			one.Cost = 1
			d, local := sc.untilRedis(t, one)
			if want := 6 + local + 1; !d.Allowed || d.Count != want {
				t.Fatalf("after a write-back retried twice: %+v; want count %d", d, want)
			}
			if n := to.calls.Load(); n < 3 {
				t.Fatalf("%d write-back calls, want the two lost ones and one more", n)
			}
		})
	}
}

// TestRestoreIdempotent: Redis.Restore run twice with the same batch
// records it once; admissions that have left the window are dropped; a key
// expires one window after its newest admission, never earlier than it
// would have.
func TestRestoreIdempotent(t *testing.T) {
	_, c := startRedis(t)
	r := newTestRedis(t, c, Options{})
	ctx := context.Background()
	k := testKeys(t)
	exact, bucketed := k.Key("e", "1"), k.Key("b", "1")
	win := time.Minute
	batch := []window.Admitted{
		{Key: exact, Limit: window.Limit{Requests: 10, Window: win}, Entries: []window.AdmittedEntry{
			{Age: 2 * win, ID: "\x01old"}, // left the window
			{Age: 20 * time.Second, Cost: 2, ID: "\x01a"},
			{Age: 10 * time.Second, ID: "\x01b"},
		}},
		{Key: bucketed, Limit: window.Limit{Requests: 10, Window: win, Buckets: 6}, Entries: []window.AdmittedEntry{
			{Age: 2 * win, ID: "\x01old"},
			{Age: 20 * time.Second, Cost: 2, ID: "\x01a"},
			{Age: 10 * time.Second, ID: "\x01b"},
		}},
	}
	for range 2 {
		if err := r.Restore(ctx, batch); err != nil {
			t.Fatal(err)
		}
	}
	if n := zcard(t, c, exact); n != 3 {
		t.Fatalf("exact key holds %d entries, want 3 (a, a#2, b)", n)
	}
	ttl := c.PTTL(ctx, exact).Val()
	if ttl > 50*time.Second || ttl < 30*time.Second {
		t.Fatalf("exact key's lifetime %v, want about 50s (the newest, 10s old, leaves then)", ttl)
	}
	for _, hl := range []window.Hit{hit(exact, 10, win), {Key: bucketed, Rule: "b", Limit: window.Limit{Requests: 10, Window: win, Buckets: 6}}} {
		d := mustDecide(t, r, hl)
		if !d.Allowed || d.Count != 4 {
			t.Fatalf("%s after two identical write-backs: %+v, want count 4", hl.Key, d)
		}
	}
	// A longer lifetime already there is not shortened.
	if err := c.PExpire(ctx, exact, time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	more := []window.Admitted{{Key: exact, Limit: window.Limit{Requests: 10, Window: win}, Entries: []window.AdmittedEntry{{Age: 50 * time.Second, ID: "\x01c"}}}}
	if err := r.Restore(ctx, more); err != nil {
		t.Fatal(err)
	}
	if ttl := c.PTTL(ctx, exact).Val(); ttl < 59*time.Minute {
		t.Fatalf("lifetime %v after a write-back of an older admission, want the hour kept", ttl)
	}
	if err := r.Restore(ctx, []window.Admitted{{Key: exact, Limit: window.Limit{Requests: 1, Window: win}, Entries: []window.AdmittedEntry{{ID: "\x00c"}}}}); !errors.Is(err, window.ErrInvalidHit) {
		t.Fatalf("an id beginning with NUL: %v, want window.ErrInvalidHit", err)
	}
}

// TestRestoreBucketedConversions: admissions written back by a bucketed
// rule onto a key of exact entries, and by an exact rule onto a bucketed
// key, are counted by the next decision of either kind.
func TestRestoreBucketedConversions(t *testing.T) {
	_, c := startRedis(t)
	r := newTestRedis(t, c, Options{})
	ctx := context.Background()
	k := testKeys(t)
	win := time.Minute
	ex, bk := window.Limit{Requests: 20, Window: win}, window.Limit{Requests: 20, Window: win, Buckets: 6}
	one := func(key string, l window.Limit) window.Hit { return window.Hit{Key: key, Rule: "r", Limit: l} }
	adm := []window.AdmittedEntry{{Age: 30 * time.Second, Cost: 2, ID: "\x01p"}, {Age: time.Second, ID: "\x01q"}}
	cases := []struct {
		name        string
		before      *window.Limit // the rule that admitted through Redis first, if any
		restoreWith window.Limit
		after       window.Limit
	}{
		{"bucketed onto exact", &ex, bk, bk},
		{"bucketed onto exact, decided exact", &ex, bk, ex},
		{"exact onto bucketed", &bk, ex, bk},
		{"exact onto bucketed, decided exact", &bk, ex, ex},
		{"bucketed onto bucketed", &bk, bk, bk},
		{"bucketed onto nothing", nil, bk, bk},
		{"exact onto nothing", nil, ex, ex},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			key := k.Key("conv", fmt.Sprint(i))
			want := 4 // 3 written back, this one
			if tc.before != nil {
				mustDecide(t, r, one(key, *tc.before))
				want++
			}
			if err := r.Restore(ctx, []window.Admitted{{Key: key, Limit: tc.restoreWith, Entries: adm}}); err != nil {
				t.Fatal(err)
			}
			if d := mustDecide(t, r, one(key, tc.after)); !d.Allowed || d.Count != want {
				t.Fatalf("%+v, want count %d", d, want)
			}
		})
	}
}

// TestWriteBackFailureKeepsLocal: while the write-back fails, the key's
// checks never reach Redis (which stays up and empty): they keep being
// decided locally, at the local allowance. The other keys' checks are held
// off too, since no round has found Redis back after the outage; they go
// to Redis once the write-back lands.
func TestWriteBackFailureKeepsLocal(t *testing.T) {
	_, c := startRedis(t)
	r := newTestRedis(t, c, Options{})
	to := &flaky{r: r, err: errRefused}
	to.fail.Store(1 << 30)
	clock := testclock.New()
	sc := newSidecar(t, to, r, fallback.Options{Now: clock.Now, Settle: -1})
	k := testKeys(t)
	h := hit(k.Key("uid", "a"), 3, time.Minute)
	if d, _ := sc.f.DecideAfter(context.Background(), []window.Hit{h}, errRefused); !d.Allowed {
		t.Fatal("local admission refused")
	}
	for i := range 20 {
		d, byRedis, err := sc.check(t, h)
		if byRedis || !errors.Is(err, fallback.ErrRestoring) || window.Classify(err) != window.KindRestoring {
			t.Fatalf("check %d while the write-back fails: by Redis %v, %v", i, byRedis, err)
		}
		if d.Allowed != (i < 2) {
			t.Fatalf("local check %d of a 3/min key with 1 admitted: %+v", i, d)
		}
	}
	if n := zcard(t, c, h.Key); n != 0 {
		t.Fatalf("the key holds %d entries in Redis: a check reached it", n)
	}
	other := hit(k.Key("uid", "other"), 3, time.Minute)
	if _, byRedis, err := sc.check(t, other); byRedis || !errors.Is(err, fallback.ErrRestoring) {
		t.Fatalf("another key before Redis answered a round: by Redis %v, %v", byRedis, err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for sc.f.WriteBack().Failed < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("write-back not retried: %+v", sc.f.WriteBack())
		}
		time.Sleep(5 * time.Millisecond)
	}
	to.fail.Store(0)
	d, local := sc.untilRedis(t, h)
	if local != 0 || d.Allowed || d.Count != 3 {
		t.Fatalf("once the write-back landed: %+v (%d local); want Redis's denial at 3", d, local)
	}
	if d, byRedis, err := sc.check(t, other); !byRedis || !d.Allowed {
		t.Fatalf("another key once the write-back landed: by Redis %v, %+v, %v", byRedis, d, err)
	}
}

// TestWriteBackUnremembered: past MaxKeys keys waiting, a new key's local
// admissions are counted, not remembered.
func TestWriteBackUnremembered(t *testing.T) {
	_, c := startRedis(t)
	r := newTestRedis(t, c, Options{})
	to := &flaky{r: r, err: errRefused}
	to.fail.Store(1 << 30)
	sc := newSidecar(t, to, r, fallback.Options{Now: testclock.New().Now, MaxKeys: 2, Settle: -1})
	k := testKeys(t)
	for i := range 3 {
		h := hit(k.Key("uid", fmt.Sprint(i)), 3, time.Minute)
		h.Cost = 2
		if d, _ := sc.f.DecideAfter(context.Background(), []window.Hit{h}, errRefused); !d.Allowed {
			t.Fatalf("local admission %d refused", i)
		}
	}
	if st := sc.f.WriteBack(); st.Pending != 2 || st.Unremembered != 2 {
		t.Fatalf("write-back %+v, want 2 keys pending and 2 entries unremembered", st)
	}
}

// TestWriteBackFleetSettles: three sidecars admit locally through an
// outage and Redis comes back empty. None decides by Redis before the
// settle has passed, by which time all three have written back: no span
// holds more than L + N - 1.
func TestWriteBackFleetSettles(t *testing.T) {
	s, c := startRedis(t)
	k := testKeys(t)
	h := hit(k.Key("uid", "hot"), 5, time.Minute) // N = 3: share 2
	clock := testclock.New()
	const settle = time.Second
	fleet := newFleet(t, c, clock, settle, 3)
	s.Kill()
	admitted := admitLocally(t, fleet, h, 3)
	if admitted != 6 {
		t.Fatalf("%d admitted locally by the fleet, want 3 × 2", admitted)
	}
	s.Restart()
	// Sidecar 0 is checked until all three have written back; it never
	// decides by Redis meanwhile.
	deadline := time.Now().Add(15 * time.Second)
	for {
		done := 0
		for _, sc := range fleet {
			if st := sc.f.WriteBack(); st.Pending == 0 && st.Landed > 0 {
				done++
			}
		}
		if done == len(fleet) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the fleet did not write back within 15s")
		}
		d, byRedis, err := fleet[0].check(t, h)
		if byRedis {
			t.Fatalf("sidecar 0 decided by Redis before the fleet wrote back: %+v", d)
		}
		if d.Allowed {
			admitted++
		}
		if err != nil && fleet[0].f.WriteBack().Landed > 0 && !errors.Is(err, fallback.ErrRestoring) {
			t.Fatalf("after its write-back landed: %v, want fallback.ErrRestoring (settling)", err)
		}
		time.Sleep(5 * time.Millisecond)
	}
	// A key this sidecar never admitted locally waits for the settle too.
	if _, byRedis, err := fleet[0].check(t, hit(k.Key("uid", "cold"), 5, time.Minute)); byRedis || !errors.Is(err, fallback.ErrRestoring) {
		t.Fatalf("another key while settling: by Redis %v, %v", byRedis, err)
	}
	clock.Advance(settle)
	byRedis, local := redisRounds(t, fleet, h, 3)
	admitted += byRedis + local
	if admitted > 5+3-1 {
		t.Fatalf("%d admitted in one window across the return, want at most L + N - 1 = 7", admitted)
	}
}

// TestWriteBackOnlyAdmissions: a timed-out request the fallback denied
// still holds its local place, but only admissions are written back: the
// denied ones may have been admitted by Redis already, or by nobody.
func TestWriteBackOnlyAdmissions(t *testing.T) {
	_, c := startRedis(t)
	r := newTestRedis(t, c, Options{})
	sc := newSidecar(t, r, r, fallback.Options{Now: testclock.New().Now, Size: func() int { return 2 }, Settle: -1})
	h := hit(testKeys(t).Key("uid", "t"), 4, time.Minute) // share 2
	for i := range 4 {
		d, err := sc.f.DecideAfter(context.Background(), []window.Hit{h}, errTimeout)
		if err != nil || d.Allowed != (i < 2) {
			t.Fatalf("timed-out request %d: %+v, %v", i, d, err)
		}
	}
	// A timeout holds no call off: wait for the write-back to land.
	deadline := time.Now().Add(10 * time.Second)
	for st := sc.f.WriteBack(); st.Landed == 0 || st.Pending > 0; st = sc.f.WriteBack() {
		if time.Now().After(deadline) {
			t.Fatalf("the write-back never landed: %+v", st)
		}
		time.Sleep(5 * time.Millisecond)
	}
	d, local := sc.untilRedis(t, h)
	if local != 0 || !d.Allowed || d.Count != 3 {
		t.Fatalf("first decision by Redis: %+v (%d local); want count 3 (2 admitted locally, this one)", d, local)
	}
}

// TestRestoreCluster: one write-back pipelines keys of many slots over the
// nodes of a Redis Cluster, on nodes that have never seen the script.
func TestRestoreCluster(t *testing.T) {
	t.Parallel()
	cluster := redistest.StartCluster(t, 3)
	c := newTestClient(t, ClientConfig{Addrs: cluster.Addrs()})
	r := newTestRedis(t, c, Options{})
	k := testKeys(t)
	var batch []window.Admitted
	var hits []window.Hit
	for i := range 30 {
		l := window.Limit{Requests: 10, Window: time.Minute}
		if i%2 == 1 {
			l.Buckets = 6
		}
		key := k.Key("uid", fmt.Sprint(i))
		batch = append(batch, window.Admitted{Key: key, Limit: l, Entries: []window.AdmittedEntry{
			{Age: 2 * time.Second, Cost: 2, ID: "\x01a"}, {Age: time.Second, ID: "\x01b"},
		}})
		hits = append(hits, window.Hit{Key: key, Rule: "uid", Limit: l})
	}
	for range 2 {
		if err := r.Restore(context.Background(), batch); err != nil {
			t.Fatal(err)
		}
	}
	for _, h := range hits {
		if d := mustDecide(t, r, h); !d.Allowed || d.Count != 4 {
			t.Fatalf("%s after its write-back: %+v, want count 4", h.Key, d)
		}
	}
}

// TestWriteBackTimeoutHoldsNothingOff: a request admitted locally because
// its call timed out (Redis slow, not down) is written back, but the key's
// next calls still go to Redis: only an outage holds calls off, so a slow
// Redis does not turn into local decisions.
func TestWriteBackTimeoutHoldsNothingOff(t *testing.T) {
	_, c := startRedis(t)
	r := newTestRedis(t, c, Options{})
	sc := newSidecar(t, r, r, fallback.Options{Now: testclock.New().Now})
	h := hit(testKeys(t).Key("uid", "slow"), 5, time.Minute)
	if d, err := sc.f.DecideAfter(context.Background(), []window.Hit{h}, errTimeout); err != nil || !d.Allowed {
		t.Fatalf("timed-out request: %+v, %v", d, err)
	}
	d, byRedis, err := sc.check(t, h)
	if err != nil || !byRedis {
		t.Fatalf("the key's next check after a timeout: by Redis %v, %v; want Redis to decide", byRedis, err)
	}
	if d.Count < 1 || d.Count > 2 {
		t.Fatalf("Redis's count %d: want 1 (this check) or 2 (the timed-out admission written back first)", d.Count)
	}
}

// TestWriteBackEveryReturnSettles: Redis is killed and restarted empty five
// times. Each time, one sidecar meets the outage without admitting anything
// locally (Redis had just reported the key full to it) while the two others
// admit their share; each time it decides nothing by the empty Redis
// before the others have written back and its settle has passed, and the
// first decision Redis makes for it counts their admissions: every return
// is held as the first is.
func TestWriteBackEveryReturnSettles(t *testing.T) {
	s, c := startRedis(t)
	k := testKeys(t)
	clock := testclock.New()
	const settle = time.Second
	fleet := newFleet(t, c, clock, settle, 3)
	quiet := fleet[2]
	for flap := range 5 {
		h := hit(k.Key("uid", fmt.Sprintf("flap%d", flap)), 5, time.Minute) // N = 3: share 2
		for i := range 6 {
			d, _ := quiet.untilRedis(t, h)
			if d.Allowed != (i < 5) {
				t.Fatalf("flap %d: Redis's decision %d before the outage: %+v", flap, i, d)
			}
		}
		s.Kill()
		if d, byRedis, err := quiet.check(t, h); byRedis || d.Allowed || window.Classify(err) != window.KindConnection {
			t.Fatalf("flap %d: the quiet sidecar with Redis down: %+v, by Redis %v, %v; want a connection error and a local denial", flap, d, byRedis, err)
		}
		if admitted := admitLocally(t, fleet[:2], h, 3); admitted != 4 {
			t.Fatalf("flap %d: %d admitted locally by two sidecars, want 2 × 2", flap, admitted)
		}
		landed := []uint64{fleet[0].f.WriteBack().Landed, fleet[1].f.WriteBack().Landed}
		s.Restart() // empty
		deadline := time.Now().Add(15 * time.Second)
		for {
			if d, byRedis, err := quiet.check(t, h); byRedis || !errors.Is(err, fallback.ErrRestoring) {
				t.Fatalf("flap %d: the quiet sidecar after the return, before the others wrote back: %+v, by Redis %v, %v; want fallback.ErrRestoring", flap, d, byRedis, err)
			}
			a, b, q := fleet[0].f.WriteBack(), fleet[1].f.WriteBack(), quiet.f.WriteBack()
			if a.Pending == 0 && b.Pending == 0 && a.Landed > landed[0] && b.Landed > landed[1] && q.Returns == uint64(flap+1) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("flap %d: the fleet did not write back and find Redis back within 15s: %+v, %+v, %+v", flap, a, b, q)
			}
			time.Sleep(5 * time.Millisecond)
		}
		clock.Advance(settle)
		d, local := quiet.untilRedis(t, h)
		if local != 0 || !d.Allowed || d.Count != 5 {
			t.Fatalf("flap %d: the quiet sidecar's first decision by Redis: %+v (%d local before it); want admitted at 5 (the 4 written back, then this one)", flap, d, local)
		}
	}
}

// settlingSidecar starts a Redis and a sidecar on it that settles for
// settle on clock, and returns them with a hit it decided through Redis.
func settlingSidecar(t *testing.T, settle time.Duration) (*redistest.Server, redis.UniversalClient, *testclock.Clock, *sidecar, window.Hit) {
	t.Helper()
	s, c := startRedis(t)
	r := newTestRedis(t, c, Options{})
	clock := testclock.New()
	sc := newSidecar(t, r, r, fallback.Options{Now: clock.Now, Settle: settle})
	h := hit(testKeys(t).Key("uid", "a"), 5, time.Minute)
	sc.untilRedis(t, h)
	return s, c, clock, sc, h
}

// killSeen kills s and checks h on sc, which meets the connection error.
func killSeen(t *testing.T, s *redistest.Server, sc *sidecar, h window.Hit) {
	t.Helper()
	s.Kill()
	if _, byRedis, err := sc.check(t, h); byRedis || window.Classify(err) != window.KindConnection {
		t.Fatalf("with Redis down: by Redis %v, %v", byRedis, err)
	}
}

// TestWriteBackRestartWhileSettling: Redis restarts again while a sidecar
// settles, when none of its calls reaches Redis to tell; the settle's
// watch sees the new run id, and the settle begins anew from then.
func TestWriteBackRestartWhileSettling(t *testing.T) {
	const settle = time.Second
	s, _, clock, sc, h := settlingSidecar(t, settle)
	killSeen(t, s, sc, h)
	s.Restart()
	waitReturns := func(n uint64) {
		t.Helper()
		deadline := time.Now().Add(15 * time.Second)
		for sc.f.WriteBack().Returns < n {
			if time.Now().After(deadline) {
				t.Fatalf("write-back %+v after 15s: want %d returns", sc.f.WriteBack(), n)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	waitReturns(1)
	clock.Advance(settle / 2)
	s.Kill()
	s.Restart()
	waitReturns(2)
	clock.Advance(settle/2 + time.Millisecond) // past the first settle
	if _, byRedis, err := sc.check(t, h); byRedis || !errors.Is(err, fallback.ErrRestoring) {
		t.Fatalf("past the first settle, within the second: by Redis %v, %v; want fallback.ErrRestoring", byRedis, err)
	}
	clock.Advance(settle / 2)
	if d, _ := sc.untilRedis(t, h); !d.Allowed {
		t.Fatalf("past the second settle: %+v; want Redis's admission", d)
	}
}

// TestLongWindowEmptyReturn: on a 1-minute window, a Redis that comes back
// empty has forgotten what it admitted before the outage. Three sidecars
// fill a key through Redis (L = 3), Redis is killed and restarted empty:
// in the outage and the settle nothing is admitted locally (every sidecar
// saw the key full), and after the return Redis admits L again, no more:
// the minute holds 2L, the bound docs/guarantees.md states for a key the
// fleet saw full, reached only by what Redis forgot.
func TestLongWindowEmptyReturn(t *testing.T) {
	s, c := startRedis(t)
	clock := testclock.New()
	const settle = time.Second
	fleet := newFleet(t, c, clock, settle, 3)
	const limit = 3
	h := hit(testKeys(t).Key("uid", "hot"), limit, time.Minute)
	before := 0
	for _, sc := range fleet {
		for {
			d, _ := sc.untilRedis(t, h)
			if !d.Allowed {
				break
			}
			before++
		}
	}
	if before != limit {
		t.Fatalf("%d admitted by Redis before the outage, want %d", before, limit)
	}
	s.Kill()
	local := admitLocally(t, fleet, h, 3)
	s.Restart() // empty
	deadline := time.Now().Add(15 * time.Second)
	for _, sc := range fleet {
		for sc.f.WriteBack().Returns == 0 {
			if time.Now().After(deadline) {
				t.Fatalf("a sidecar did not find Redis back within 15s: %+v", sc.f.WriteBack())
			}
			if d, byRedis, _ := sc.check(t, h); byRedis {
				t.Fatal("decided by Redis before finding it back")
			} else if d.Allowed {
				local++
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	clock.Advance(settle)
	after, l := redisRounds(t, fleet, h, 3)
	local += l
	if local != 0 {
		t.Fatalf("%d admitted locally: every sidecar saw the key full, want none", local)
	}
	if after != limit {
		t.Fatalf("Redis admitted %d after the return, want %d: it holds only what was written back (nothing)", after, limit)
	}
	if n := zcard(t, c, h.Key); n != limit {
		t.Fatalf("the key holds %d entries after the return, want %d", n, limit)
	}
	t.Logf("admitted in the minute: %d before the outage (forgotten), %d locally, %d after the return: %d = 2L", before, local, after, before+local+after)
}

// TestFallbackCloseStopsWriteBack: Close ends the write-back's rounds and
// retries while Redis is down and waits for them; no round runs after it,
// so what waited is not written back when Redis returns.
func TestFallbackCloseStopsWriteBack(t *testing.T) {
	s, c := startRedis(t)
	r := newTestRedis(t, c, Options{})
	sc := newSidecar(t, r, r, fallback.Options{Settle: -1})
	h := hit(testKeys(t).Key("uid", "hot"), 100, time.Minute)
	s.Kill()
	if d, byRedis, _ := sc.check(t, h); byRedis || !d.Allowed {
		t.Fatalf("check with Redis down: %+v, by Redis %v", d, byRedis)
	}
	for deadline := time.Now().Add(15 * time.Second); sc.f.WriteBack().Failed < 2; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the write-back did not retry within 15s: %+v", sc.f.WriteBack())
		}
	}
	sc.f.Close()
	before := sc.f.WriteBack()
	s.Restart()
	for range 10 {
		_, _, _ = sc.check(t, h)
		time.Sleep(50 * time.Millisecond)
	}
	if st := sc.f.WriteBack(); st.Failed != before.Failed || st.Landed != 0 || st.Pending == 0 {
		t.Fatalf("write-back after Close: %+v, want it stopped at %+v", st, before)
	}
	sc.f.Close() // again: nothing
}

// TestSettlesKeepLatest: the settle's end kept is the latest proposed, on
// Redis's clock; a read proposes nothing.
func TestSettlesKeepLatest(t *testing.T) {
	_, c := startRedis(t)
	s := NewSettles(c, testKeys(t).Settle("d"))
	ctx := context.Background()
	if rem, err := s.SettleEnd(ctx, 0); err != nil || rem != 0 {
		t.Fatalf("read before any proposal: %v, %v; want 0", rem, err)
	}
	for _, tc := range []struct {
		propose, want time.Duration
	}{
		{time.Minute, time.Minute},
		{30 * time.Second, time.Minute},
		{0, time.Minute},
		{90 * time.Second, 90 * time.Second},
	} {
		// The calls take a moment of Redis's clock: allow a few seconds.
		if rem, err := s.SettleEnd(ctx, tc.propose); err != nil || rem > tc.want || rem < tc.want-5*time.Second {
			t.Fatalf("propose %v: %v from now, %v; want about %v", tc.propose, rem, err, tc.want)
		}
	}
}

// TestWriteBackSharedSettle: two sidecars find Redis back at different
// moments; sharing the settle's end, both keep their failure mode until the
// later one's settle ends, and turn back to Redis together.
func TestWriteBackSharedSettle(t *testing.T) {
	s, c := startRedis(t)
	k := testKeys(t)
	clock := testclock.New()
	const settle = time.Second
	var fleet []*sidecar
	for range 2 {
		r := newTestRedis(t, c, Options{})
		fleet = append(fleet, newSidecar(t, r, r, fallback.Options{
			Now: clock.Now, Size: func() int { return 2 }, Settle: settle, SharedSettle: NewSettles(c, k.Settle("d")),
		}))
	}
	a, b := fleet[0], fleet[1]
	h := hit(k.Key("uid", "shared"), 5, time.Minute)
	s.Kill()
	for _, sc := range fleet {
		if _, byRedis, err := sc.check(t, h); byRedis || window.Classify(err) != window.KindConnection {
			t.Fatalf("with Redis down: by Redis %v, %v", byRedis, err)
		}
	}
	// a's write-back rounds find Redis back first; b's wait while its
	// clock moves on.
	s.Restart()
	waitReturn := func(sc *sidecar) {
		t.Helper()
		deadline := time.Now().Add(15 * time.Second)
		for sc.f.WriteBack().Returns == 0 {
			if time.Now().After(deadline) {
				t.Fatalf("write-back %+v after 15s: Redis not found back", sc.f.WriteBack())
			}
			_, _, _ = sc.check(t, h) // pokes a round
			time.Sleep(5 * time.Millisecond)
		}
	}
	waitReturn(a)
	waitReturn(b) // b may have found Redis at once too: the clock has not moved
	clock.Advance(settle / 2)
	// b proposes a later end, as a sidecar returning half a settle later
	// would; a's settle watch takes it.
	own := a.f.WriteBack().SettleEnd
	if _, err := NewSettles(c, k.Settle("d")).SettleEnd(context.Background(), settle); err != nil {
		t.Fatal(err)
	}
	// a's settle watch (every 100 ms) takes the later end: about half a
	// settle past its own.
	deadline := time.Now().Add(15 * time.Second)
	for !a.f.WriteBack().SettleEnd.After(own.Add(settle / 4)) {
		if time.Now().After(deadline) {
			t.Fatalf("a settles until %v after 15s; want the fleet's later end, about %v", a.f.WriteBack().SettleEnd, own.Add(settle/2))
		}
		time.Sleep(5 * time.Millisecond)
	}
	clock.Advance(settle/2 + time.Millisecond) // past a's own settle
	if _, byRedis, err := a.check(t, h); byRedis || !errors.Is(err, fallback.ErrRestoring) {
		t.Fatalf("past its own settle, within the fleet's: by Redis %v, %v; want fallback.ErrRestoring", byRedis, err)
	}
	clock.Advance(settle / 2)
	for i, sc := range fleet {
		if d, local := sc.untilRedis(t, h); local != 0 || d.Count == 0 {
			t.Fatalf("sidecar %d past the fleet's settle: Redis decided %+v after %d local admissions; want Redis at once, counting what was written back", i, d, local)
		}
	}
}

// TestWriteBackSettleTailAdmitsNothing: in the settle's last moments a
// check held off is denied locally, so that the fleet has written back all
// it admitted when it turns back to Redis.
func TestWriteBackSettleTailAdmitsNothing(t *testing.T) {
	s, c := startRedis(t)
	r := newTestRedis(t, c, Options{})
	clock := testclock.New()
	const settle = time.Second
	sc := newSidecar(t, r, r, fallback.Options{Now: clock.Now, Settle: settle})
	k := testKeys(t)
	s.Kill()
	if _, byRedis, err := sc.check(t, hit(k.Key("uid", "a"), 5, time.Minute)); byRedis || window.Classify(err) != window.KindConnection {
		t.Fatalf("with Redis down: by Redis %v, %v", byRedis, err)
	}
	s.Restart()
	deadline := time.Now().Add(15 * time.Second)
	for sc.f.WriteBack().Returns == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("write-back %+v after 15s: Redis not found back", sc.f.WriteBack())
		}
		time.Sleep(5 * time.Millisecond)
	}
	fresh := hit(k.Key("uid", "fresh"), 5, time.Minute)
	if d, byRedis, err := sc.check(t, fresh); byRedis || !errors.Is(err, fallback.ErrRestoring) || !d.Allowed {
		t.Fatalf("early in the settle: %+v, by Redis %v, %v; want a local admission", d, byRedis, err)
	}
	clock.Advance(settle - 50*time.Millisecond)
	if d, byRedis, err := sc.check(t, fresh); byRedis || !errors.Is(err, fallback.ErrRestoring) || d.Allowed {
		t.Fatalf("in the settle's last 50 ms: %+v, by Redis %v, %v; want a local denial", d, byRedis, err)
	}
	for sc.f.WriteBack().Pending != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("write-back %+v after 15s: the early admission not written back", sc.f.WriteBack())
		}
		time.Sleep(5 * time.Millisecond)
	}
	clock.Advance(100 * time.Millisecond)
	if d, local := sc.untilRedis(t, fresh); local != 0 || !d.Allowed || d.Count != 2 {
		t.Fatalf("past the settle: %+v after %d local admissions; want Redis's admission at 2 (the one written back, this one)", d, local)
	}
}

// slots is a fallback.Outstanding that always holds the same entries: a
// lease's slots scored a while ahead.
type slots struct{ batch []window.Admitted }

func (s slots) Outstanding() []window.Admitted { return s.batch }

// TestWriteBackAlsoEachReturn: WriteBackAlso's entries are written back
// in the round that finds Redis back after an outage, at their ages
// (after now for a negative one), and again when a settle finds Redis
// restarted unseen; not while Redis stays up.
func TestWriteBackAlsoEachReturn(t *testing.T) {
	const settle = time.Second
	s, c, clock, sc, h := settlingSidecar(t, settle)
	held := window.Admitted{Key: testKeys(t).Key("global", ""), Limit: window.Limit{Requests: 10, Window: time.Minute},
		Entries: []window.AdmittedEntry{{Age: -30 * time.Second, Cost: 1, ID: "\x02slot#1"}, {Age: -30 * time.Second, Cost: 1, ID: "\x02slot#2"}}}
	sc.f.WriteBackAlso(slots{[]window.Admitted{held}})
	if n := zcard(t, c, held.Key); n != 0 {
		t.Fatalf("with Redis up all along, %d entries written", n)
	}
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(15 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within 15s: %+v", what, sc.f.WriteBack())
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	before, err := c.Time(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	killSeen(t, s, sc, h)
	s.Restart()
	waitFor("the first return", func() bool { return sc.f.WriteBack().Returns >= 1 })
	if n := zcard(t, c, held.Key); n != 2 {
		t.Fatalf("after the return the key holds %d entries, want the 2 written back", n)
	}
	zs, err := c.ZRangeWithScores(context.Background(), held.Key, 0, 0).Result()
	if err != nil {
		t.Fatal(err)
	}
	if at := time.UnixMicro(int64(zs[0].Score)); at.Before(before.Add(30 * time.Second)) {
		t.Fatalf("written back at %v: want 30s after the write-back's now, after %v", at, before.Add(30*time.Second))
	}
	clock.Advance(settle / 2)
	s.Kill()
	s.Restart() // empty again, unseen by any call
	waitFor("the second return", func() bool { return sc.f.WriteBack().Returns >= 2 })
	// The count follows the write-back's call: wait for both.
	waitFor("the entries written again", func() bool { return zcard(t, c, held.Key) == 2 && sc.f.WriteBack().Outstanding >= 4 })
	if n := sc.f.WriteBack().Outstanding; n != 4 {
		t.Fatalf("%d entries written back in all, want 2 at each return", n)
	}
}
