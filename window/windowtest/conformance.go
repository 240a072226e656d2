package windowtest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashgate/flashgate/window"
)

// Factory makes a fresh [Store] of one implementation for each case.
type Factory struct {
	Name string
	New  func(t *testing.T) Store
}

// Store is a limiter under test and what the cases need to look under it.
type Store struct {
	Limiter window.Limiter
	// Client is the Redis under Limiter, for the cases that inspect keys;
	// nil for an in-process limiter, which skips them.
	Client redis.UniversalClient
	// DecideAs decides hits as the request of member id member (a retry
	// repeats one), and Member returns a new id; nil where requests have no
	// ids, which skips the cases of retries.
	DecideAs func(ctx context.Context, hits []window.Hit, member string) (window.Decision, error)
	Member   func() string
}

// conformanceCase runs against every implementation with real time
// (Redis time cannot be injected): windows of 50–400 ms. keys is unique to
// the attempt. run returns false when the machine was too slow for the
// scenario's timing (a check could not be made); it is then tried again
// with fresh keys, up to conformanceAttempts times.
type conformanceCase struct {
	name      string
	redisOnly bool
	run       func(t *testing.T, st Store, keys window.Keys) bool
}

// conformanceAttempts is generous: an attempt lasts well under a second, and
// a loaded box can stall several in a row.
const conformanceAttempts = 10

// slack is extra time waited for an expiry to happen.
const slack = 40 * time.Millisecond

// interval brackets the instant a limiter decided: the decision happened
// after start and before end, on the limiter's clock, which is this
// machine's clock for Memory and for the harness's Redis.
type interval struct{ start, end time.Time }

// before reports whether the decision surely happened before t.
func (i interval) before(t time.Time) bool { return i.end.Before(t) }

// timedDecide decides hits and brackets the instant of the decision.
func timedDecide(t *testing.T, lim window.Limiter, hits ...window.Hit) (window.Decision, interval) {
	t.Helper()
	start := time.Now()
	d := MustDecide(t, lim, hits...)
	return d, interval{start: start, end: time.Now()}
}

// checkRetryAfter checks a denial's retry-after against the instants of the
// entry that must leave (entry) and of the denial (at) (see checkLeave).
func checkRetryAfter(t *testing.T, what string, d window.Decision, entry, at interval, w time.Duration) {
	t.Helper()
	checkLeave(t, what, "retry-after", d.RetryAfter, entry, at, w)
}

// leaveSlack covers the microsecond rounding of Redis scores and the
// stores' wall clock (Unix time), which a VM's time sync may step against
// the monotonic clock the test's intervals read: a few milliseconds, far
// below the spacing of the cases' admissions (tens of milliseconds).
const leaveSlack = 4 * time.Millisecond

// checkLeave checks got, how long from a decision (at) until an entry made
// within entry leaves a window of w: it must lie within
// [entry.start+w-at.end, entry.end+w-at.start], give or take leaveSlack.
func checkLeave(t *testing.T, what, name string, got time.Duration, entry, at interval, w time.Duration) {
	t.Helper()
	lo := entry.start.Add(w).Sub(at.end) - leaveSlack
	hi := entry.end.Add(w).Sub(at.start) + leaveSlack
	if got < lo || got > hi {
		t.Fatalf("%s: %s %s, want within [%s, %s]", what, name, got, lo, hi)
	}
}

// Run runs the conformance table against every factory's stores, each
// case in parallel with fresh keys (see [Keys]).
func Run(t *testing.T, factories ...Factory) {
	for _, f := range factories {
		t.Run(f.Name, func(t *testing.T) {
			t.Parallel()
			cases := append(conformanceCases[:len(conformanceCases):len(conformanceCases)], bucketedCases...)
			for _, tc := range append(cases, resetCases...) {
				t.Run(tc.name, func(t *testing.T) {
					t.Parallel()
					st := f.New(t)
					if tc.redisOnly && st.Client == nil {
						t.Skip("a case of Redis keys")
					}
					for attempt := range conformanceAttempts {
						if tc.run(t, st, Keys(t)) {
							return
						}
						t.Logf("attempt %d: too slow for the scenario's timing; again with fresh keys", attempt+1)
					}
					t.Fatalf("%d attempts were all too slow for the scenario's timing", conformanceAttempts)
				})
			}
		})
	}
}

var conformanceCases = []conformanceCase{
	{name: "exact limit", run: func(t *testing.T, st Store, k window.Keys) bool {
		lim := st.Limiter
		const w = 400 * time.Millisecond
		h := Hit(k.Key("uid", "u1"), 5, w)
		t0 := time.Now()
		for i := range 5 {
			d := MustDecide(t, lim, h)
			if !d.Allowed || d.Count != i+1 || d.Remaining != 4-i || d.Index != 0 || d.Limit != h.Limit || d.RetryAfter != 0 {
				t.Fatalf("request %d = %+v, want allowed, count %d, remaining %d", i+1, d, i+1, 4-i)
			}
		}
		for i := range 3 {
			d, at := timedDecide(t, lim, h)
			if !at.before(t0.Add(w)) {
				return false // the first admissions may have left
			}
			if d.Allowed || d.Count != 5 || d.Remaining != 0 || d.Index != 0 || d.Source != window.SourceBackend {
				t.Fatalf("request %d over the limit = %+v, want denied with count 5", 6+i, d)
			}
			if d.RetryAfter <= 0 || d.RetryAfter > w {
				t.Fatalf("retry-after %s outside (0, %s]", d.RetryAfter, w)
			}
		}
		return true
	}},
	{name: "sliding at millisecond scale", run: func(t *testing.T, st Store, k window.Keys) bool {
		lim := st.Limiter
		const w = 200 * time.Millisecond
		h := Hit(k.Key("uid", "u1"), 2, w)
		dA, a := timedDecide(t, lim, h)
		time.Sleep(100 * time.Millisecond)
		dB, b := timedDecide(t, lim, h)
		dC, c := timedDecide(t, lim, h)
		if !dA.Allowed || !dB.Allowed {
			t.Fatalf("A, B = %+v, %+v; want both allowed", dA, dB)
		}
		if !c.before(a.start.Add(w)) {
			return false // A may have left before C
		}
		if dC.Allowed {
			t.Fatalf("C with A and B in the window: %+v, want denied", dC)
		}
		checkRetryAfter(t, "C (until A leaves)", dC, a, c, w)
		// A has left once C's retry-after has passed since C.
		sleepUntil(c.end.Add(dC.RetryAfter + time.Millisecond))
		dD, _ := timedDecide(t, lim, h)
		if !dD.Allowed {
			t.Fatalf("D after A left: %+v, want allowed", dD)
		}
		dE, e := timedDecide(t, lim, h)
		if !e.before(b.start.Add(w)) {
			return false // B may have left before E
		}
		if dE.Allowed {
			t.Fatalf("E with B and D in the window: %+v, want denied", dE)
		}
		checkRetryAfter(t, "E (until B leaves)", dE, b, e, w)
		return true
	}},
	{name: "all or nothing", run: func(t *testing.T, st Store, k window.Keys) bool {
		lim := st.Limiter
		const w = 10 * time.Second
		tight, loose, other := Hit(k.Key("uid", "u1"), 1, w), Hit(k.Key("ip", "1.2.3.4"), 5, w), Hit(k.Key("fp", "f1"), 5, w)
		MustAllow(t, lim, "first", tight, loose)
		for i := range 3 {
			d := MustDeny(t, lim, "second", loose, other, tight)
			if d.Index != 2 || d.Limit != tight.Limit || d.Count != 1 {
				t.Fatalf("denial %d = %+v, want hit 2 (the full one) binding with count 1", i, d)
			}
		}
		// Neither loose nor other was recorded by the denials.
		if d := MustAllow(t, lim, "loose alone", loose); d.Count != 2 {
			t.Fatalf("loose count after 3 denied requests = %d, want 2", d.Count)
		}
		if d := MustAllow(t, lim, "other alone", other); d.Count != 1 {
			t.Fatalf("other count after 3 denied requests = %d, want 1", d.Count)
		}
		// The admitted request reports its tightest hit.
		d := MustAllow(t, lim, "loose and other", other, loose)
		if d.Index != 1 || d.Remaining != 2 || d.Count != 3 {
			t.Fatalf("allowed = %+v, want binding hit 1 (loose, 3 of 5)", d)
		}
		return true
	}},
	{name: "denied requests are not recorded", run: func(t *testing.T, st Store, k window.Keys) bool {
		lim := st.Limiter
		const w = 200 * time.Millisecond
		h := Hit(k.Key("uid", "u1"), 2, w)
		_, first := timedDecide(t, lim, h)
		_, second := timedDecide(t, lim, h)
		last := second.end // the latest instant anything may have been admitted
		for time.Now().Before(first.start.Add(w - 20*time.Millisecond)) {
			d, at := timedDecide(t, lim, h)
			if at.before(first.start.Add(w)) && d.Allowed {
				t.Fatalf("admitted while both admissions are in the window: %+v", d)
			}
			if d.Allowed {
				// A slow call reached the store after the first left: a
				// legitimate admission, which holds its own place.
				last = at.end
			}
			time.Sleep(5 * time.Millisecond)
		}
		// Had the denials been recorded, these would be denied.
		sleepUntil(last.Add(w + time.Millisecond))
		MustAllow(t, lim, "after the admissions left", h)
		MustAllow(t, lim, "second after the admissions left", h)
		return true
	}},
	{name: "retry-after is when the window admits again", run: func(t *testing.T, st Store, k window.Keys) bool {
		lim := st.Limiter
		const w = 300 * time.Millisecond
		h := Hit(k.Key("uid", "u1"), 3, w)
		_, e1 := timedDecide(t, lim, h)
		time.Sleep(60 * time.Millisecond)
		_, e2 := timedDecide(t, lim, h)
		MustAllow(t, lim, "3", h)
		d, at := timedDecide(t, lim, h)
		if !at.before(e1.start.Add(w)) {
			return false
		}
		if d.Allowed {
			t.Fatalf("4th within the window: %+v, want denied", d)
		}
		checkRetryAfter(t, "4th (until entry 1 leaves)", d, e1, at, w)
		time.Sleep(d.RetryAfter / 3)
		if dd, x := timedDecide(t, lim, h); x.before(e1.start.Add(w)) && dd.Allowed {
			t.Fatalf("a third of retry-after later: %+v, want denied", dd)
		}
		// Exact: the window admits again once retry-after has passed since
		// the decision.
		sleepUntil(at.end.Add(d.RetryAfter + time.Millisecond))
		MustAllow(t, lim, "after retry-after", h)
		d, at = timedDecide(t, lim, h)
		if !at.before(e2.start.Add(w)) {
			return false
		}
		if d.Allowed {
			t.Fatalf("next with entries 2, 3 and 5 in: %+v, want denied", d)
		}
		checkRetryAfter(t, "next (until entry 2 leaves)", d, e2, at, w)
		return true
	}},
	{name: "retry-after with many entries to leave", run: func(t *testing.T, st Store, k window.Keys) bool {
		lim := st.Limiter
		// Ten entries, then ten more 100ms later; at a limit of 5 the entry
		// that must leave is the 16th (the 6th of the second group).
		const w = 400 * time.Millisecond
		key := k.Key("uid", "u1")
		_, early := timedDecide(t, lim, Hit(key, 20, w))
		for range 9 {
			MustAllow(t, lim, "early", Hit(key, 20, w))
		}
		time.Sleep(100 * time.Millisecond)
		var late interval
		for i := range 10 {
			_, x := timedDecide(t, lim, Hit(key, 20, w))
			if i == 0 {
				late.start = x.start
			}
			late.end = x.end
		}
		d, at := timedDecide(t, lim, Hit(key, 5, w))
		if !at.before(early.start.Add(w)) {
			return false
		}
		if d.Allowed || d.Count != 20 {
			t.Fatalf("at limit 5 = %+v, want denied with count 20", d)
		}
		checkRetryAfter(t, "at limit 5 (until the 16th leaves)", d, late, at, w)
		return true
	}},
	{name: "shadow hits never deny and do not grow a full window", run: func(t *testing.T, st Store, k window.Keys) bool {
		lim := st.Limiter
		const w = 10 * time.Second
		enf, sh := Hit(k.Key("ip", "1.2.3.4"), 5, w), Hit(k.Key("uid", "u1"), 1, w)
		sh.Shadow = true
		d := MustAllow(t, lim, "first", enf, sh)
		if d.Shadowed || d.ShadowIndex != -1 {
			t.Fatalf("first = %+v, want not shadowed", d)
		}
		for i := range 2 {
			// The binding hit of an admission is the one with the fewest
			// remaining: the full shadow hit.
			d := MustAllow(t, lim, "over the shadow limit", enf, sh)
			if !d.Shadowed || d.ShadowIndex != 1 || d.Index != 1 || d.Count != 1 || d.Remaining != 0 {
				t.Fatalf("request %d = %+v, want allowed, shadowed and bound at 1 with count 1", 2+i, d)
			}
		}
		if d := MustAllow(t, lim, "enforcing alone", enf); d.Count != 4 {
			t.Fatalf("enforcing count = %d, want 4 (3 requests with the shadow hit, 1 alone)", d.Count)
		}
		// The shadow window stayed at 1 entry: a lone shadow hit is over.
		sh2 := sh
		sh2.Limit.Requests = 2
		if d := MustAllow(t, lim, "shadow at 2", sh2); d.Shadowed || d.Count != 2 {
			t.Fatalf("shadow key at limit 2 = %+v, want admitted with count 2 (1 before)", d)
		}
		// A request denied by an enforcing hit is not recorded in its shadow hits.
		full, sh3 := Hit(k.Key("uid", "full"), 1, w), Hit(k.Key("fp", "f1"), 5, w)
		sh3.Shadow = true
		MustAllow(t, lim, "fill", full)
		MustDeny(t, lim, "denied with a shadow hit", sh3, full)
		if d := MustAllow(t, lim, "shadow alone", sh3); d.Count != 1 {
			t.Fatalf("shadow key after a denied request = %+v, want count 1", d)
		}
		return true
	}},
	{name: "the same key twice in a request counts once", run: func(t *testing.T, st Store, k window.Keys) bool {
		lim := st.Limiter
		h := Hit(k.Key("uid", "u1"), 2, 10*time.Second)
		if d := MustAllow(t, lim, "twice", h, h); d.Count != 1 {
			t.Fatalf("first = %+v, want count 1", d)
		}
		if d := MustAllow(t, lim, "twice again", h, h); d.Count != 2 {
			t.Fatalf("second = %+v, want count 2", d)
		}
		if d := MustDeny(t, lim, "full", h, h); d.Index != 0 || d.Count != 2 {
			t.Fatalf("third = %+v, want denied on hit 0 with count 2", d)
		}
		return true
	}},
	{name: "a hit's cost counts as that many requests", run: func(t *testing.T, st Store, k window.Keys) bool {
		lim := st.Limiter
		const w = 10 * time.Second
		key := k.Key("uid", "u1")
		costly := func(cost int) window.Hit { h := Hit(key, 5, w); h.Cost = cost; return h }
		if d := MustAllow(t, lim, "cost 3", costly(3)); d.Count != 3 || d.Remaining != 2 {
			t.Fatalf("cost 3 = %+v, want count 3, remaining 2", d)
		}
		if d := MustDeny(t, lim, "cost 3 with 2 left", costly(3)); d.Count != 3 || d.RetryAfter <= 0 || d.RetryAfter > w {
			t.Fatalf("cost 3 with 2 left = %+v, want denied with count 3 and retry-after in (0, %s]", d, w)
		}
		if d := MustAllow(t, lim, "cost 2 with 2 left", costly(2)); d.Count != 5 || d.Remaining != 0 {
			t.Fatalf("cost 2 with 2 left = %+v, want count 5", d)
		}
		if d := MustDeny(t, lim, "cost 0 (one) when full", costly(0)); d.Count != 5 {
			t.Fatalf("cost 0 when full = %+v, want denied with count 5", d)
		}
		// More than the window can hold: never admitted, nothing recorded.
		big := Hit(k.Key("uid", "u2"), 5, w)
		big.Cost = 6
		if d := MustDeny(t, lim, "cost 6 at limit 5", big); d.Count != 0 || d.RetryAfter != w {
			t.Fatalf("cost 6 at limit 5 = %+v, want denied with count 0 and retry-after %s", d, w)
		}
		// All or nothing across hits of different costs.
		a, b := Hit(k.Key("uid", "u3"), 5, w), Hit(k.Key("ip", "u3"), 2, w)
		a.Cost, b.Cost = 3, 3
		if d := MustDeny(t, lim, "cost 3 at limits 5 and 2", a, b); d.Index != 1 {
			t.Fatalf("cost 3 at limits 5 and 2 = %+v, want denied on hit 1", d)
		}
		a.Cost = 5
		if d := MustAllow(t, lim, "cost 5 on the untouched key", a); d.Count != 5 {
			t.Fatalf("cost 5 after the denial = %+v, want count 5 (the denial recorded nothing)", d)
		}
		return true
	}},
	{name: "retry-after when a cost needs several entries to leave", run: func(t *testing.T, st Store, k window.Keys) bool {
		lim := st.Limiter
		const w = 400 * time.Millisecond
		key := k.Key("uid", "u1")
		var at [5]interval
		for i := range at {
			_, at[i] = timedDecide(t, lim, Hit(key, 5, w))
			time.Sleep(20 * time.Millisecond)
		}
		h := Hit(key, 5, w)
		h.Cost = 3 // the 3rd entry must leave
		d, x := timedDecide(t, lim, h)
		if !x.before(at[0].start.Add(w)) {
			return false
		}
		if d.Allowed || d.Count != 5 {
			t.Fatalf("cost 3 on a full window = %+v, want denied with count 5", d)
		}
		checkRetryAfter(t, "cost 3 (until the 3rd leaves)", d, at[2], x, w)
		return true
	}},
	{name: "each hit reports its own window", run: func(t *testing.T, st Store, k window.Keys) bool {
		lim := st.Limiter
		var ra, rb window.HitReport
		a, b := Hit(k.Key("uid", "u1"), 5, 10*time.Second), Hit(k.Key("ip", "u1"), 3, 10*time.Second)
		a.Tag, b.Tag = reportTo{&ra}, reportTo{&rb}
		for range 3 {
			MustAllow(t, lim, "under both", a, b)
		}
		// Reset: until the first admission leaves (the reset cases check it).
		if want := (window.HitReport{Known: true, Count: 3, Remaining: 2, Reset: ra.Reset}); ra != want || ra.Reset <= 0 || ra.Reset > 10*time.Second {
			t.Fatalf("hit 0 after 3 admissions reports %+v, want %+v with a reset in (0, 10s]", ra, want)
		}
		if want := (window.HitReport{Known: true, Count: 3, Remaining: 0, Reset: rb.Reset}); rb != want || rb.Reset <= 0 || rb.Reset > 10*time.Second {
			t.Fatalf("hit 1 after 3 admissions reports %+v, want %+v with a reset in (0, 10s]", rb, want)
		}
		d := MustDeny(t, lim, "hit 1 full", a, b)
		if d.Index != 1 {
			t.Fatalf("denial %+v, want on hit 1", d)
		}
		if want := (window.HitReport{Known: true, Count: 3, Remaining: 2}); ra != want {
			t.Fatalf("hit 0 of the denied request reports %+v, want %+v (nothing added)", ra, want)
		}
		if !rb.Known || !rb.Over || rb.Count != 3 || rb.Remaining != 0 || rb.RetryAfter <= 0 || rb.RetryAfter > 10*time.Second {
			t.Fatalf("hit 1 of the denied request reports %+v, want over with count 3 and a retry-after", rb)
		}
		return true
	}},
	{name: "a key hit twice at different costs counts once, at the larger", run: func(t *testing.T, st Store, k window.Keys) bool {
		lim := st.Limiter
		const w = 10 * time.Minute
		key := k.Key("uid", "u1")
		small, big := Hit(key, 10, w), Hit(key, 10, w)
		big.Cost = 5
		if d := MustAllow(t, lim, "cost 1 then 5", small, big); d.Count != 5 {
			t.Fatalf("cost 1 then 5 = %+v, want count 5", d)
		}
		if d := MustAllow(t, lim, "cost 5 then 1", big, small); d.Count != 10 {
			t.Fatalf("cost 5 then 1 = %+v, want count 10 (the larger cost, whatever the order)", d)
		}
		if d := MustDeny(t, lim, "full", small); d.Count != 10 {
			t.Fatalf("a single request on the full key = %+v, want denied with count 10", d)
		}
		return true
	}},
	{name: "invalid hits and no hits", run: func(t *testing.T, st Store, k window.Keys) bool {
		lim := st.Limiter
		for _, h := range []window.Hit{
			{Key: "", Limit: window.Limit{Requests: 1, Window: time.Second}},
			{Key: k.Key("r", "v"), Limit: window.Limit{Requests: 0, Window: time.Second}},
			{Key: k.Key("r", "v"), Limit: window.Limit{Requests: 1, Window: time.Microsecond}},
		} {
			if _, err := lim.Decide(context.Background(), []window.Hit{Hit(k.Key("ok", "v"), 1, time.Second), h}); !errors.Is(err, window.ErrInvalidHit) {
				t.Fatalf("Decide with %+v: %v, want window.ErrInvalidHit", h, err)
			}
		}
		if d := MustDecide(t, lim); !d.Allowed || d.Index != -1 || d.ShadowIndex != -1 {
			t.Fatalf("no hits = %+v, want allowed with index -1", d)
		}
		// The valid hit of the rejected requests was not recorded.
		if d := MustAllow(t, lim, "ok", Hit(k.Key("ok", "v"), 1, time.Second)); d.Count != 1 {
			t.Fatalf("count %d, want 1", d.Count)
		}
		return true
	}},
	{name: "keys expire one window after the last admission", redisOnly: true, run: func(t *testing.T, st Store, k window.Keys) bool {
		lim, c := st.Limiter, st.Client
		ctx := context.Background()
		for _, w := range []time.Duration{100 * time.Millisecond, 1500 * time.Microsecond, 10 * time.Second, time.Hour} {
			key := k.Key("uid", w.String())
			MustAllow(t, lim, "first", Hit(key, 3, w))
			MustAllow(t, lim, "second", Hit(key, 3, w))
			ttl, err := c.PTTL(ctx, key).Result()
			if err != nil {
				t.Fatal(err)
			}
			if w < 10*time.Millisecond && (ttl == -2 || ttl == 0) {
				continue // (nearly) expired already: fine for a tiny window
			}
			if ttl <= 0 || ttl > w+time.Millisecond {
				t.Fatalf("window %s: PTTL %s, want in (0, window rounded up to ms]", w, ttl)
			}
		}
		key := k.Key("uid", "short")
		MustAllow(t, lim, "short", Hit(key, 3, 50*time.Millisecond))
		time.Sleep(50*time.Millisecond + slack)
		if n, err := c.Exists(ctx, key).Result(); err != nil || n != 0 {
			t.Fatalf("EXISTS one window after the last admission = %d, %v; want 0", n, err)
		}
		return true
	}},
	{name: "a retried request is recorded once", redisOnly: true, run: func(t *testing.T, st Store, k window.Keys) bool {
		lim, c := st.Limiter, st.Client
		ctx := context.Background()
		hits := []window.Hit{Hit(k.Key("uid", "u1"), 2, 10*time.Second), Hit(k.Key("ip", "1.2.3.4"), 3, 10*time.Second)}
		member := st.Member()
		for i := range 3 {
			d, err := st.DecideAs(ctx, hits, member)
			if err != nil {
				t.Fatal(err)
			}
			if !d.Allowed || d.Count != 1 || d.Index != 0 || d.Remaining != 1 {
				t.Fatalf("attempt %d = %+v, want allowed, count 1 on hit 0", i+1, d)
			}
		}
		for _, h := range hits {
			if n := c.ZCard(ctx, h.Key).Val(); n != 1 {
				t.Fatalf("%s holds %d entries after 3 attempts of one request, want 1", h.Key, n)
			}
		}
		MustAllow(t, lim, "second request", hits...)
		MustDeny(t, lim, "third request", hits...)
		return true
	}},
	{name: "a retried request of cost 3 is recorded once", redisOnly: true, run: func(t *testing.T, st Store, k window.Keys) bool {
		c := st.Client
		ctx := context.Background()
		h := Hit(k.Key("uid", "u1"), 5, 10*time.Second)
		h.Cost = 3
		member := st.Member()
		for i := range 3 {
			d, err := st.DecideAs(ctx, []window.Hit{h}, member)
			if err != nil {
				t.Fatal(err)
			}
			if !d.Allowed || d.Count != 3 {
				t.Fatalf("attempt %d = %+v, want allowed with count 3", i+1, d)
			}
		}
		if n := c.ZCard(ctx, h.Key).Val(); n != 3 {
			t.Fatalf("%s holds %d entries after 3 attempts of one request of cost 3, want 3", h.Key, n)
		}
		return true
	}},
	{name: "a retry that is denied removes what its first attempt recorded", redisOnly: true, run: func(t *testing.T, st Store, k window.Keys) bool {
		lim, c := st.Limiter, st.Client
		ctx := context.Background()
		hits := []window.Hit{Hit(k.Key("uid", "u1"), 5, 10*time.Second), Hit(k.Key("ip", "1.2.3.4"), 1, 10*time.Second)}
		member := st.Member()
		if d, err := st.DecideAs(ctx, hits, member); err != nil || !d.Allowed {
			t.Fatalf("first attempt = %+v, %v; want allowed", d, err)
		}
		// The ip key loses the member (as if trimmed) and fills up with
		// another request: the retry is denied there, and must take its
		// member out of the uid key, where there is still room.
		if err := c.ZRem(ctx, hits[1].Key, member).Err(); err != nil {
			t.Fatal(err)
		}
		MustAllow(t, lim, "another request", hits[1])
		d, err := st.DecideAs(ctx, hits, member)
		if err != nil {
			t.Fatal(err)
		}
		if d.Allowed || d.Index != 1 {
			t.Fatalf("retry = %+v, want denied on hit 1", d)
		}
		if n := c.ZCard(ctx, hits[0].Key).Val(); n != 0 {
			t.Fatalf("the uid key holds %d entries after the denied retry, want 0", n)
		}
		return true
	}},
}

// bucketedCases are conformanceCases of the bounded-memory window
// (Limit.Buckets). Timed checks hold on any machine speed: a decision is
// required to deny only if it surely happened before the instant its
// sub-window ends, and to admit only if it surely happened after.
var bucketedCases = []conformanceCase{
	{name: "bucketed: the oldest sub-window counts whole until it ends", run: func(t *testing.T, st Store, k window.Keys) bool {
		lim := st.Limiter
		const w, width = time.Second, 500 * time.Millisecond
		h := Bucketed(k.Key("uid", "u1"), 3, w, 2)
		b0 := nextSubWindow(width)
		var last interval
		for i := range 3 {
			d, at := timedDecide(t, lim, h)
			if !d.Allowed || d.Count != i+1 {
				t.Fatalf("admission %d = %+v", i+1, d)
			}
			last = at
		}
		if !last.before(b0.Add(width)) {
			return false // not all in one sub-window
		}
		end := b0.Add(width + w) // when the sub-window leaves the window
		check := func(what string) bool {
			d, at := timedDecide(t, lim, h)
			if !at.before(end) {
				return false
			}
			if d.Allowed || d.Count != 3 {
				t.Fatalf("%s = %+v, want denied with count 3", what, d)
			}
			lo, hi := end.Sub(at.end)-time.Millisecond, end.Sub(at.start)+time.Millisecond
			if d.RetryAfter < lo || d.RetryAfter > hi {
				t.Fatalf("%s: retry-after %s, want within [%s, %s] (until the sub-window ends)", what, d.RetryAfter, lo, hi)
			}
			return true
		}
		if !check("4th") {
			return false
		}
		// The exact log would admit now: every admission has left.
		sleepUntil(last.end.Add(w + 20*time.Millisecond))
		if !check("past the exact window") {
			return false
		}
		sleepUntil(end.Add(time.Millisecond))
		if d := MustAllow(t, lim, "once the sub-window ended", h); d.Count != 1 {
			t.Fatalf("after the sub-window ended = %+v, want count 1", d)
		}
		return true
	}},
	{name: "bucketed: all or nothing with exact hits, cost, shadow, the same key twice", run: func(t *testing.T, st Store, k window.Keys) bool {
		lim := st.Limiter
		const w = 10 * time.Second
		tight, loose := Hit(k.Key("uid", "u1"), 1, w), Bucketed(k.Key("ip", "1.2.3.4"), 5, w, 5)
		MustAllow(t, lim, "first", tight, loose)
		for range 3 {
			if d := MustDeny(t, lim, "second", loose, tight); d.Index != 1 || d.Count != 1 {
				t.Fatalf("denied = %+v, want the exact hit binding with count 1", d)
			}
		}
		if d := MustAllow(t, lim, "bucketed alone", loose, loose); d.Count != 2 || d.Remaining != 3 {
			t.Fatalf("bucketed after 3 denied requests, twice in one = %+v, want count 2", d)
		}
		costly := func(cost int) window.Hit { h := Bucketed(k.Key("uid", "u2"), 5, w, 5); h.Cost = cost; return h }
		if d := MustAllow(t, lim, "cost 3", costly(3)); d.Count != 3 || d.Remaining != 2 {
			t.Fatalf("cost 3 = %+v, want count 3", d)
		}
		if d := MustDeny(t, lim, "cost 3 with 2 left", costly(3)); d.Count != 3 || d.RetryAfter <= 0 || d.RetryAfter > w+w/5 {
			t.Fatalf("cost 3 with 2 left = %+v, want denied with retry-after in (0, %s]", d, w+w/5)
		}
		if d := MustAllow(t, lim, "cost 2 with 2 left", costly(2)); d.Count != 5 || d.Remaining != 0 {
			t.Fatalf("cost 2 with 2 left = %+v, want count 5", d)
		}
		big := Bucketed(k.Key("uid", "u3"), 5, w, 5)
		big.Cost = 6
		if d := MustDeny(t, lim, "cost 6 at limit 5", big); d.Count != 0 || d.RetryAfter != w {
			t.Fatalf("cost 6 at limit 5 = %+v, want denied with count 0 and retry-after %s", d, w)
		}
		// A full shadow bucketed hit is reported, not grown, and never denies.
		enf, sh := Hit(k.Key("fp", "f1"), 5, w), Bucketed(k.Key("uid", "u4"), 1, w, 5)
		sh.Shadow = true
		MustAllow(t, lim, "shadow first", enf, sh)
		if d := MustAllow(t, lim, "shadow over", enf, sh); !d.Shadowed || d.ShadowIndex != 1 || d.Count != 1 {
			t.Fatalf("shadow over = %+v, want shadowed with count 1", d)
		}
		return true
	}},
	{name: "bucketed: a key hit exact and bucketed in one request is counted once, never over", run: func(t *testing.T, st Store, k window.Keys) bool {
		lim := st.Limiter
		// Two hits on one key (an RLS limit override beside the bucketed
		// config rule of the same entries and window) once admitted twice
		// the limit and more on Redis: each hit converted the key to its
		// own kind and the admission went to the stale one.
		const w = time.Minute
		for _, tc := range []struct {
			name string
			hits func(key string) []window.Hit
		}{
			{"exact first", func(key string) []window.Hit { return []window.Hit{Hit(key, 5, w), Bucketed(key, 5, w, 6)} }},
			{"bucketed first", func(key string) []window.Hit { return []window.Hit{Bucketed(key, 5, w, 6), Hit(key, 5, w)} }},
			{"two widths", func(key string) []window.Hit { return []window.Hit{Bucketed(key, 5, w, 3), Bucketed(key, 5, w, 7)} }},
		} {
			key := k.Key("mixed", tc.name)
			admitted := 0
			for range 10 {
				if MustDecide(t, lim, tc.hits(key)...).Allowed {
					admitted++
				}
			}
			// Per-slot mode (Cluster) decides each hit on its own and may
			// count a request twice (conservative), never more than once
			// over: at most the limit, at least half of it.
			if admitted > 5 || admitted < 3 {
				t.Fatalf("%s: %d admitted in one window, limit 5", tc.name, admitted)
			}
			if d := MustDeny(t, lim, tc.name+": exact alone", Hit(key, 5, w)); d.Count < 5 {
				t.Fatalf("%s: exact alone = %+v, want count at least 5", tc.name, d)
			}
			if d := MustDeny(t, lim, tc.name+": bucketed alone", Bucketed(key, 5, w, 6)); d.Count < 5 {
				t.Fatalf("%s: bucketed alone = %+v, want count at least 5", tc.name, d)
			}
		}
		return true
	}},
	{name: "bucketed: an exact hit on a bucketed key keeps its count", run: func(t *testing.T, st Store, k window.Keys) bool {
		lim := st.Limiter
		// A reload that makes a rule exact again, a rollout where sidecars
		// disagree, or an exact override of a bucketed rule's key: the
		// counters become entries, so the exact log stays full.
		const w = time.Hour
		key := k.Key("uid", "u1")
		b := Bucketed(key, 5, w, 6)
		b.Cost = 4
		MustAllow(t, lim, "bucketed cost 4", b)
		if d := MustAllow(t, lim, "exact", Hit(key, 5, w)); d.Count != 5 {
			t.Fatalf("exact after a bucketed cost 4 = %+v, want count 5", d)
		}
		d := MustDeny(t, lim, "exact full", Hit(key, 5, w))
		if d.Count != 5 || d.RetryAfter < w-time.Minute || d.RetryAfter > w+w/6 {
			t.Fatalf("exact full = %+v, want count 5, retry-after about an hour", d)
		}
		if d := MustDeny(t, lim, "bucketed again", Bucketed(key, 5, w, 6)); d.Count != 5 {
			t.Fatalf("bucketed again = %+v, want count 5", d)
		}
		return true
	}},
	{name: "bucketed: keys expire one window and a sub-window after the last admission", redisOnly: true, run: func(t *testing.T, st Store, k window.Keys) bool {
		lim, c := st.Limiter, st.Client
		ctx := context.Background()
		key := k.Key("uid", "hour")
		MustAllow(t, lim, "hour", Bucketed(key, 3, time.Hour, 60))
		if ttl, err := c.PTTL(ctx, key).Result(); err != nil || ttl <= time.Hour || ttl > time.Hour+time.Minute {
			t.Fatalf("PTTL %s, %v; want in (1h, 1h1m]", ttl, err)
		}
		key = k.Key("uid", "short")
		MustAllow(t, lim, "short", Bucketed(key, 3, 50*time.Millisecond, 5))
		time.Sleep(60*time.Millisecond + slack)
		if n, err := c.Exists(ctx, key).Result(); err != nil || n != 0 {
			t.Fatalf("EXISTS after window + width = %d, %v; want 0", n, err)
		}
		return true
	}},
	{name: "bucketed: a retried request is counted once, a denied retry takes its count back", redisOnly: true, run: func(t *testing.T, st Store, k window.Keys) bool {
		lim, c := st.Limiter, st.Client
		ctx := context.Background()
		b := Bucketed(k.Key("uid", "u1"), 10, 10*time.Second, 5)
		b.Cost = 3
		e := Hit(k.Key("ip", "1.2.3.4"), 1, 10*time.Second)
		member := st.Member()
		for i := range 3 {
			if d, err := st.DecideAs(ctx, []window.Hit{b, e}, member); err != nil || !d.Allowed {
				t.Fatalf("attempt %d = %+v, %v; want allowed", i+1, d, err)
			}
		}
		one := Bucketed(b.Key, 10, 10*time.Second, 5)
		if d := MustAllow(t, lim, "alone", one); d.Count != 4 {
			t.Fatalf("count after 3 attempts of one request of cost 3 and one more = %d, want 4", d.Count)
		}
		// The exact key loses the member and fills up: the retry is denied
		// there, and takes its 3 back from the bucketed key.
		if err := c.ZRem(ctx, e.Key, member).Err(); err != nil {
			t.Fatal(err)
		}
		MustAllow(t, lim, "another request", e)
		if d, err := st.DecideAs(ctx, []window.Hit{b, e}, member); err != nil || d.Allowed || d.Index != 1 {
			t.Fatalf("denied retry = %+v, %v; want denied on hit 1", d, err)
		}
		if d := MustAllow(t, lim, "alone after the denied retry", one); d.Count != 2 {
			t.Fatalf("count = %d, want 2 (the retry's 3 taken back)", d.Count)
		}
		return true
	}},
}

// MustAllow decides hits, failing the test on an error or a denial.
func MustAllow(t testing.TB, lim window.Limiter, what string, hits ...window.Hit) window.Decision {
	t.Helper()
	d := MustDecide(t, lim, hits...)
	if !d.Allowed {
		t.Fatalf("%s: denied (%+v), want allowed", what, d)
	}
	return d
}

// MustDeny decides hits, failing the test on an error or an admission.
func MustDeny(t testing.TB, lim window.Limiter, what string, hits ...window.Hit) window.Decision {
	t.Helper()
	d := MustDecide(t, lim, hits...)
	if d.Allowed {
		t.Fatalf("%s: allowed (%+v), want denied", what, d)
	}
	return d
}

func sleepUntil(at time.Time) { time.Sleep(time.Until(at)) }

// nextSubWindow waits until just after the next start of a sub-window of
// width and returns that start. Sub-windows are aligned on the Unix epoch,
// on the limiter's clock: this machine's.
func nextSubWindow(width time.Duration) time.Time {
	b0 := time.Now().Truncate(width).Add(width)
	sleepUntil(b0.Add(10 * time.Millisecond))
	return b0
}

// reportTo is a hit's Tag that keeps the hit's own outcome in *r.
type reportTo struct{ r *window.HitReport }

func (t reportTo) ReportHit(r window.HitReport) { *t.r = r }
