package redisstore

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashgate/flashgate/window"
	"github.com/flashgate/flashgate/window/redistest"
	"github.com/flashgate/flashgate/window/testclock"
)

// newLeaseStore returns a store on a fresh redis-server whose clock is
// clk (ClockLocal), so that a test moves the script's now, and its client.
func newLeaseStore(t *testing.T, clk *testclock.Clock) (*Redis, redis.UniversalClient) {
	t.Helper()
	rs := redistest.Start(t)
	c := newTestClient(t, ClientConfig{Addrs: []string{rs.Addr()}})
	r, err := New(c, Options{Clock: ClockLocal, Now: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	return r, c
}

func mustLease(t *testing.T, r *Redis, c LeaseCall) Grant {
	t.Helper()
	g, err := r.Lease(context.Background(), c)
	if err != nil {
		t.Fatalf("Lease(want %d): %v", c.Want, err)
	}
	return g
}

const testLease = 50 * time.Millisecond

var leaseLimit = window.Limit{Requests: 10, Window: time.Second}

// TestLeaseGrantsWithinLimit: grants never take the key past its limit,
// count with plain admissions, are scored at the lease's end and keep the
// key alive until they leave the window.
func TestLeaseGrantsWithinLimit(t *testing.T) {
	t.Parallel()
	clk := testclock.New()
	r, c := newLeaseStore(t, clk)
	ctx := context.Background()
	for i, want := range []int{4, 4, 2, 0} {
		g := mustLease(t, r, LeaseCall{Key: "lk", Limit: leaseLimit, For: testLease, ID: r.LeaseID(), Want: 4})
		if g.Slots != want {
			t.Fatalf("grant %d: %d slots, want %d", i, g.Slots, want)
		}
		if want == 0 && g.RetryAfter != leaseLimit.Window+testLease {
			t.Fatalf("full: retry after %s, want the window plus the lease", g.RetryAfter)
		}
	}
	zs, err := c.ZRangeWithScores(ctx, "lk", 0, -1).Result()
	if err != nil {
		t.Fatal(err)
	}
	end := float64(clk.Now().Add(testLease).UnixMicro())
	for _, z := range zs {
		if z.Score != end {
			t.Fatalf("slot %q scored %f, want the lease's end %f", z.Member, z.Score, end)
		}
	}
	if ttl := c.PTTL(ctx, "lk").Val(); ttl < leaseLimit.Window+testLease-10*time.Millisecond {
		t.Fatalf("key lives %s: shorter than the window plus the lease", ttl)
	}
	d, err := r.Decide(ctx, []window.Hit{{Key: "lk", Limit: leaseLimit}})
	if err != nil || d.Allowed {
		t.Fatalf("a plain check on a key full of slots: %+v, %v; want denied", d, err)
	}
}

// TestLeaseSlotsCountUntilTheLeaseEndLeaves: a slot reserved at t counts
// until t + lease + window, not t + window.
func TestLeaseSlotsCountUntilTheLeaseEndLeaves(t *testing.T) {
	t.Parallel()
	clk := testclock.New()
	r, _ := newLeaseStore(t, clk)
	if g := mustLease(t, r, LeaseCall{Key: "lk", Limit: leaseLimit, For: testLease, ID: r.LeaseID(), Want: 10}); g.Slots != 10 {
		t.Fatalf("first grant: %d", g.Slots)
	}
	clk.Advance(leaseLimit.Window)
	g := mustLease(t, r, LeaseCall{Key: "lk", Limit: leaseLimit, For: testLease, ID: r.LeaseID(), Want: 1})
	if g.Slots != 0 || g.RetryAfter != testLease {
		t.Fatalf("a window later: %+v; want nothing, retry after the lease", g)
	}
	clk.Advance(testLease)
	if g := mustLease(t, r, LeaseCall{Key: "lk", Limit: leaseLimit, For: testLease, ID: r.LeaseID(), Want: 10}); g.Slots != 10 {
		t.Fatalf("a window after the lease's end: %d slots, want 10", g.Slots)
	}
}

// TestLeaseReturnsAreIdempotent: unused slots go back once; returning
// them again, or retrying a grant, counts nothing twice.
func TestLeaseReturnsAreIdempotent(t *testing.T) {
	t.Parallel()
	clk := testclock.New()
	r, c := newLeaseStore(t, clk)
	id := r.LeaseID()
	first := mustLease(t, r, LeaseCall{Key: "lk", Limit: leaseLimit, For: testLease, ID: id, Want: 6})
	again := mustLease(t, r, LeaseCall{Key: "lk", Limit: leaseLimit, For: testLease, ID: id, Want: 6})
	if first.Slots != 6 || again.Slots != 6 || again.Count != 6 {
		t.Fatalf("grant %+v then its retry %+v: want 6 slots once", first, again)
	}
	// Slots 3 to 6 were not used.
	back := LeaseCall{Key: "lk", Limit: leaseLimit, For: testLease, BackID: id, BackFrom: 3, BackTo: 6}
	for i, want := range []int{4, 0} {
		g := mustLease(t, r, back)
		if g.Returned != want || g.Count != 2 {
			t.Fatalf("return %d: %+v; want %d returned, 2 left", i, g, want)
		}
	}
	if n := c.ZCard(context.Background(), "lk").Val(); n != 2 {
		t.Fatalf("key holds %d entries, want the 2 used slots", n)
	}
	if g := mustLease(t, r, LeaseCall{Key: "lk", Limit: leaseLimit, For: testLease, ID: r.LeaseID(), Want: 10}); g.Slots != 8 {
		t.Fatalf("after the return: %d slots, want 8", g.Slots)
	}
}

// TestLeaseRedisClockStep: a forward step of Redis's clock by δ forgets
// only the entries scored within δ of leaving the window: the bound of
// docs/design.md, L plus those.
func TestLeaseRedisClockStep(t *testing.T) {
	t.Parallel()
	clk := testclock.New()
	r, _ := newLeaseStore(t, clk)
	lease := func(want int) Grant {
		return mustLease(t, r, LeaseCall{Key: "lk", Limit: leaseLimit, For: testLease, ID: r.LeaseID(), Want: want})
	}
	lease(3) // scored t0 + 50ms
	clk.Advance(100 * time.Millisecond)
	lease(7) // scored t0 + 150ms
	clk.Advance(leaseLimit.Window - 100*time.Millisecond)
	if g := lease(10); g.Slots != 0 {
		t.Fatalf("a window after the first lease, before its end left: %d slots", g.Slots)
	}
	const step = 60 * time.Millisecond // the first lease's entries are within it of leaving; not the second's
	clk.Advance(step)
	if g := lease(10); g.Slots != 3 {
		t.Fatalf("after a step of %s: %d slots, want the 3 scored within the step of leaving", step, g.Slots)
	}
}

// TestLeaseLeastGrant: with less room than Least nothing is granted, and
// the retry-after is when Least entries fit.
func TestLeaseLeastGrant(t *testing.T) {
	t.Parallel()
	clk := testclock.New()
	r, _ := newLeaseStore(t, clk)
	lease := func(want, least int) Grant {
		return mustLease(t, r, LeaseCall{Key: "lk", Limit: leaseLimit, For: testLease, ID: r.LeaseID(), Want: want, Least: least})
	}
	lease(6, 6) // scored t0 + 50ms
	clk.Advance(100 * time.Millisecond)
	lease(2, 2) // scored t0 + 150ms: 8 of 10
	if g := lease(4, 3); g.Slots != 0 || g.RetryAfter != leaseLimit.Window+testLease-100*time.Millisecond {
		t.Fatalf("room for 2, least 3: %+v; want nothing until the first lease's slots leave", g)
	}
	if g := lease(4, 2); g.Slots != 2 {
		t.Fatalf("room for 2, least 2: %d slots, want 2", g.Slots)
	}
}

// TestInspectLeases: Inspect lists the slots of running leases by the
// sidecar that reserved them, with their leases' ends; a lease that ended
// is counted but not listed, and a returned slot leaves the list.
func TestInspectLeases(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, c := startRedis(t)
	a, b := newTestRedis(t, c, Options{}), newTestRedis(t, c, Options{})
	// An ended lease, reserved a while ago by a sidecar on a local clock.
	old := newTestRedis(t, c, Options{Clock: ClockLocal, Now: func() time.Time { return time.Now().Add(-30 * time.Second) }})
	key := testKeys(t).Key("r", "leased")
	lim := window.Limit{Requests: 20, Window: time.Minute}
	const d = time.Minute // long enough to be running when Inspect reads, on a loaded box
	mustLease(t, old, LeaseCall{Key: key, Limit: lim, For: time.Second, ID: old.LeaseID(), Want: 1})
	a1, a2, b1 := a.LeaseID(), a.LeaseID(), b.LeaseID()
	before := time.Now()
	mustLease(t, a, LeaseCall{Key: key, Limit: lim, For: d, ID: a1, Want: 3})
	mustLease(t, a, LeaseCall{Key: key, Limit: lim, For: d, ID: a2, Want: 2})
	mustLease(t, b, LeaseCall{Key: key, Limit: lim, For: d, ID: b1, Want: 4})
	mustLease(t, b, LeaseCall{Key: key, Limit: lim, For: d, BackID: b1, BackFrom: 4, BackTo: 4})
	after := time.Now()

	st, err := Inspect(ctx, c, key, lim)
	if err != nil {
		t.Fatal(err)
	}
	if st.Count != 1+3+2+3 {
		t.Fatalf("count %d, want 9 (an ended lease's slot and 8 running)", st.Count)
	}
	got := map[string]int{}
	for _, l := range st.Leases {
		got[l.Lease] += l.Slots
		if l.Sidecar != l.Lease[:16] || (l.Sidecar != a.ID() && l.Sidecar != b.ID()) {
			t.Errorf("lease %+v: not from sidecar %s or %s", l, a.ID(), b.ID())
		}
		if l.Ends.Before(before.Add(d-time.Second)) || l.Ends.After(after.Add(d+time.Second)) {
			t.Errorf("lease %+v ends outside [%v, %v] + %s", l, before, after, d)
		}
	}
	want := map[string]int{a1[1:]: 3, a2[1:]: 2, b1[1:]: 3}
	if len(got) != len(want) || got[a1[1:]] != 3 || got[a2[1:]] != 2 || got[b1[1:]] != 3 {
		t.Fatalf("leases %+v, want slots %v", st.Leases, want)
	}
}

// TestLeaseLargeLimitStaysExact: a leased limit above AutoBucketsAbove is
// an exact log (docs/design.md): sidecars leasing 20,000/1s with a 50 ms
// lease, each using part of its grant and returning the rest when the
// lease ends, never admit more than the limit in any span of the window,
// however the uses are placed in their leases.
func TestLeaseLargeLimitStaysExact(t *testing.T) {
	t.Parallel()
	clk := testclock.New()
	r, c := newLeaseStore(t, clk)
	lim := window.Limit{Requests: 20_000, Window: time.Second}
	if lim.Requests <= window.AutoBucketsAbove {
		t.Fatalf("%s is not above the bucketing threshold %d", lim, window.AutoBucketsAbove)
	}
	const (
		sidecars = 6
		step     = 20 * time.Millisecond
		run      = 2500 * time.Millisecond
	)
	share := (lim.Requests + sidecars - 1) / sidecars
	type lease struct {
		from, end time.Time // on the script's clock: the reservation and the lease's end
		id        string
		granted   int
		used      int
	}
	var (
		all  []lease
		open [sidecars]*lease
		rnd  = rand.New(rand.NewPCG(1, 2))
	)
	start := clk.Now()
	for clk.Now().Sub(start) < run {
		for i := range sidecars {
			l := open[i]
			if l != nil && clk.Now().Before(l.end) {
				continue
			}
			call := LeaseCall{Key: "big", Limit: lim, For: testLease, ID: r.LeaseID(), Want: share, Least: share / 2}
			if l != nil && l.used < l.granted {
				call.BackID, call.BackFrom, call.BackTo = l.id, l.used+1, l.granted
			}
			g := mustLease(t, r, call)
			open[i] = nil
			if g.Slots == 0 {
				continue
			}
			// A busy sidecar uses most of a lease, sometimes all of it.
			n := &lease{from: clk.Now(), end: clk.Now().Add(testLease), id: call.ID, granted: g.Slots, used: g.Slots - rnd.IntN(g.Slots/4+1)}
			all, open[i] = append(all, *n), n
		}
		clk.Advance(step)
	}
	// Every use may lie anywhere in its lease: the worst span [s, s+W)
	// holds every slot used in a lease that overlaps it; the most such
	// start at some lease's end.
	worst, admitted := 0, 0
	for _, a := range all {
		admitted += a.used
		n := 0
		for _, b := range all {
			if !b.end.Before(a.end) && b.from.Before(a.end.Add(lim.Window)) {
				n += b.used
			}
		}
		worst = max(worst, n)
	}
	if worst > lim.Requests {
		t.Fatalf("a span of %s may hold %d admissions: the limit is %d", lim.Window, worst, lim.Requests)
	}
	if n := c.ZCard(context.Background(), "big").Val(); n > int64(lim.Requests) {
		t.Fatalf("the key holds %d entries, over the limit %d", n, lim.Requests)
	}
	mem, _ := c.MemoryUsage(context.Background(), "big").Result()
	t.Logf("%d leases, %d admitted in %s (%.0f/s), the worst span %d of %d; the key holds %d bytes",
		len(all), admitted, run, float64(admitted)/run.Seconds(), worst, lim.Requests, mem)
}

// TestLeaseRefusalsTakeTurns: callers refused by a full window are told
// successive lumps of room, each when its least fits beyond the room told
// to those refused before it, and each is granted at its time.
func TestLeaseRefusalsTakeTurns(t *testing.T) {
	t.Parallel()
	clk := testclock.New()
	r, _ := newLeaseStore(t, clk)
	lease := func(want, least int) Grant {
		return mustLease(t, r, LeaseCall{Key: "lk", Limit: leaseLimit, For: testLease, ID: r.LeaseID(), Want: want, Least: least})
	}
	lease(4, 4) // slots 0-3, scored t0 + 50ms
	clk.Advance(100 * time.Millisecond)
	lease(4, 4) // slots 4-7, t0 + 150ms
	clk.Advance(100 * time.Millisecond)
	lease(2, 2) // slots 8-9, t0 + 250ms: full
	left := func(at time.Duration) time.Duration { return at + leaseLimit.Window - 200*time.Millisecond }
	for i, c := range []struct {
		want, least int
		after       time.Duration
	}{
		{4, 4, left(50 * time.Millisecond)},  // the first lump
		{4, 2, left(150 * time.Millisecond)}, // beyond the first's
		{2, 2, left(250 * time.Millisecond)}, // beyond both
		{2, 2, left(250 * time.Millisecond)}, // past the window's entries: the last
	} {
		if g := lease(c.want, c.least); g.Slots != 0 || g.RetryAfter != c.after {
			t.Fatalf("refused caller %d: %+v; want nothing, retry after %s", i, g, c.after)
		}
	}
	clk.Advance(left(50 * time.Millisecond))
	if g := lease(4, 4); g.Slots != 4 {
		t.Fatalf("the first caller at its time: %d slots, want 4", g.Slots)
	}
	clk.Advance(100 * time.Millisecond)
	if g := lease(4, 2); g.Slots != 4 {
		t.Fatalf("the second caller at its time: %d slots, want 4", g.Slots)
	}
}

// TestLeaseQueueKey: the refusals' queue shares its key's hash slot, or
// there is none.
func TestLeaseQueueKey(t *testing.T) {
	t.Parallel()
	for key, want := range map[string]string{
		"fg:{abc123}:global:x": "fg:{abc123}:global:x:lq",
		"lk":                   "{lk}:lq",
		"a{}b":                 "",
		"a}b":                  "",
	} {
		if got := queueKey(key); got != want {
			t.Errorf("queueKey(%q) = %q, want %q", key, got, want)
		}
	}
}
