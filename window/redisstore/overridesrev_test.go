package redisstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashgate/flashgate/window/overrides"
	"github.com/flashgate/flashgate/window/redistest"
)

// startOverrides starts a Redis and returns it, a client and the
// overrides on it.
func startOverrides(t *testing.T) (*redistest.Server, redis.UniversalClient, *Overrides) {
	t.Helper()
	srv, c := startRedis(t)
	store, err := NewOverrides(c, testKeys(t))
	if err != nil {
		t.Fatal(err)
	}
	return srv, c, store
}

// ovSidecar is a follower that a test can pause (a partition: it misses
// what happens meanwhile, keeping its Book) and resume.
type ovSidecar struct {
	t      *testing.T
	book   *overrides.Book
	f      *Follower
	mu     sync.Mutex
	cancel context.CancelFunc
	done   chan struct{}
}

func newOvSidecar(t *testing.T, store *Overrides, now func() time.Time) *ovSidecar {
	t.Helper()
	return newOvSidecarOf(t, store, overrides.NewBook(now))
}

// newOvSidecarOf is newOvSidecar on book (its OnSkip set, say).
func newOvSidecarOf(t *testing.T, store *Overrides, book *overrides.Book) *ovSidecar {
	t.Helper()
	s := &ovSidecar{t: t, book: book}
	f, err := store.NewFollower(s.book, FollowerOptions{Resync: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	s.f = f
	s.resume()
	t.Cleanup(s.pause)
	select {
	case <-f.Synced():
	case <-time.After(10 * time.Second):
		t.Fatal("not synced within 10 s")
	}
	return s
}

func (s *ovSidecar) resume() {
	s.mu.Lock()
	defer s.mu.Unlock()
	ctx, cancel := context.WithCancel(context.Background())
	s.cancel, s.done = cancel, make(chan struct{})
	done := s.done
	go func() { defer close(done); s.f.Run(ctx) }()
}

func (s *ovSidecar) pause() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cancel()
	<-s.done
}

// requests returns the limit of the override in force for target in the
// sidecar's Book, 0 for none.
func (s *ovSidecar) requests(t overrides.Target) int {
	if o := s.book.Lookup(t.Domain, t.Rule); o != nil {
		return o.Requests
	}
	return 0
}

// TestOverridesOutrankOnRestore: when Redis restarts empty, the sidecars
// write back what they know and the highest revision wins, whichever
// writes back first: a sidecar partitioned through a clear (or through a
// newer set) does not bring the older override back to the fleet.
func TestOverridesOutrankOnRestore(t *testing.T) {
	t.Parallel()
	target := overrides.Target{Domain: "shop", Rule: "coupon"}
	set := func(t *testing.T, store *Overrides, n int) {
		t.Helper()
		now := time.Now()
		o := &overrides.Override{Target: target, Mode: overrides.ModeLimit, Requests: n, Set: now, Until: now.Add(time.Hour), By: "test"}
		if err := store.Set(context.Background(), o); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name string
		// change happens while the stale sidecar is partitioned: a clear,
		// or a newer set; want is the limit in force after it (0: none).
		change func(t *testing.T, store *Overrides)
		want   int
		// staleFirst: the stale sidecar writes back before the one that
		// saw the change.
		staleFirst bool
	}{
		{"clear, stale first", func(t *testing.T, s *Overrides) { clearTarget(t, s, target) }, 0, true},
		{"clear, informed first", func(t *testing.T, s *Overrides) { clearTarget(t, s, target) }, 0, false},
		{"replaced, stale first", func(t *testing.T, s *Overrides) { set(t, s, 2) }, 2, true},
		{"replaced, informed first", func(t *testing.T, s *Overrides) { set(t, s, 2) }, 2, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv, c, store := startOverrides(t)
			informed, stale := newOvSidecar(t, store, nil), newOvSidecar(t, store, nil)
			set(t, store, 5)
			for _, s := range []*ovSidecar{informed, stale} {
				until(t, "the override learnt", func() bool { return s.requests(target) == 5 })
			}
			stale.pause()
			tc.change(t, store)
			until(t, "the change learnt", func() bool { return informed.requests(target) == tc.want })

			first, second := informed, stale
			if tc.staleFirst {
				first, second = stale, informed
				informed.pause()
			}
			srv.Restart()
			if tc.staleFirst {
				stale.resume()
				until(t, "the stale sidecar's write-back", func() bool {
					got, err := store.Get(context.Background(), target)
					return err == nil && got != nil && got.Requests == 5
				})
				informed.resume()
			} else {
				until(t, "the informed sidecar's write-back", func() bool {
					return c.HExists(context.Background(), store.hash, field(target)).Val()
				})
				stale.resume()
			}
			until(t, "the fleet agrees on the newest", func() bool {
				got, err := store.Get(context.Background(), target)
				have := 0
				if got != nil {
					have = got.Requests
				}
				return err == nil && have == tc.want && first.requests(target) == tc.want && second.requests(target) == tc.want
			})
		})
	}
}

func clearTarget(t *testing.T, store *Overrides, target overrides.Target) {
	t.Helper()
	if _, err := store.Clear(context.Background(), target, "test", "orders back"); err != nil {
		t.Fatal(err)
	}
}

// TestOverridesOlderEntryOutranked: Redis holding an older entry than
// the sidecars (a failover to a replica that missed the clear: the hash
// and its epoch are there, the clear is not) is met by a write-back of the
// newer one, not by the sidecars applying the older.
func TestOverridesOlderEntryOutranked(t *testing.T) {
	t.Parallel()
	_, c, store := startOverrides(t)
	ctx := context.Background()
	target := overrides.Target{Domain: "shop", Rule: "coupon"}
	a, b := newOvSidecar(t, store, nil), newOvSidecar(t, store, nil)
	now := time.Now()
	if err := store.Set(ctx, &overrides.Override{Target: target, Mode: overrides.ModeLimit, Requests: 5, Set: now, Until: now.Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	until(t, "the override learnt", func() bool { return a.requests(target) == 5 && b.requests(target) == 5 })
	older, err := c.HGet(ctx, store.hash, field(target)).Result()
	if err != nil {
		t.Fatal(err)
	}
	clearTarget(t, store, target)
	until(t, "the clear learnt", func() bool { return a.requests(target) == 0 && b.requests(target) == 0 })
	if err := c.HSet(ctx, store.hash, field(target), older).Err(); err != nil {
		t.Fatal(err)
	}
	if err := c.Publish(ctx, store.Channel(), "set "+target.String()).Err(); err != nil {
		t.Fatal(err)
	}
	until(t, "the tombstone written back", func() bool {
		v, err := c.HGet(ctx, store.hash, field(target)).Result()
		return err == nil && strings.Contains(v, `"cleared":true`)
	})
	if a.requests(target) != 0 || b.requests(target) != 0 {
		t.Fatal("the older override applied")
	}
}

// TestOverridesSetAfterLossOutranks: a set made after Redis lost the hash
// outranks an older override a sidecar writes back later (the revision
// follows Redis's clock, not a counter Redis lost).
func TestOverridesSetAfterLossOutranks(t *testing.T) {
	t.Parallel()
	srv, _, store := startOverrides(t)
	target := overrides.Target{Domain: "shop", Rule: "coupon"}
	ctx := context.Background()
	stale := newOvSidecar(t, store, nil)
	now := time.Now()
	// Several sets, so that a counter would stand above a fresh one.
	for n := 9; n >= 5; n-- {
		if err := store.Set(ctx, &overrides.Override{Target: target, Mode: overrides.ModeLimit, Requests: n, Set: now, Until: now.Add(time.Hour)}); err != nil {
			t.Fatal(err)
		}
	}
	until(t, "the override learnt", func() bool { return stale.requests(target) == 5 })
	stale.pause()
	srv.Restart()
	if err := store.Set(ctx, &overrides.Override{Target: target, Mode: overrides.ModeLimit, Requests: 1, Set: now, Until: now.Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	stale.resume()
	until(t, "the stale sidecar learns the newer set", func() bool { return stale.requests(target) == 1 })
	if got, err := store.Get(ctx, target); err != nil || got == nil || got.Requests != 1 {
		t.Fatalf("Get = %+v, %v; want the newer set", got, err)
	}
}

// skips records the entries a Book skipped.
type skips struct {
	mu  sync.Mutex
	got []overrides.Skip
}

func (s *skips) add(k overrides.Skip) {
	s.mu.Lock()
	s.got = append(s.got, k)
	s.mu.Unlock()
}

func (s *skips) reasons() map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := make(map[string]int)
	for _, k := range s.got {
		m[k.Reason]++
	}
	return m
}

// TestOverridesFromRedisChecked: entries of the hash written by hand (or
// by an older or buggy writer) are checked like the ones Set writes: the
// ones that break the bounds are not applied, and each is reported once,
// with a bounded name, however often the hash is read again.
func TestOverridesFromRedisChecked(t *testing.T) {
	t.Parallel()
	_, c, store := startOverrides(t)
	ctx := context.Background()
	now := time.Now()
	entry := func(rule, mode string, requests int, set, until time.Time, extra string) string {
		return fmt.Sprintf(`{"rev":1,"domain":"shop","rule":%q,"mode":%q,"requests":%d,"set":%q,"until":%q%s}`,
			rule, mode, requests, set.Format(time.RFC3339Nano), until.Format(time.RFC3339Nano), extra)
	}
	hour := now.Add(time.Hour)
	long := strings.Repeat("x", 10_000)
	bad := map[string]struct{ value, reason string }{
		"too long":      {entry("too long", "limit", 1, now, now.Add(25*time.Hour), ""), overrides.SkipDuration},
		"set ahead":     {entry("set ahead", "limit", 1, now.Add(time.Hour), now.Add(2*time.Hour), ""), overrides.SkipEnd},
		"ends before":   {entry("ends before", "limit", 1, now, now.Add(-time.Hour), ""), overrides.SkipDuration},
		"shadow":        {entry("shadow", "shadow", 0, now, hour, ""), overrides.SkipRaise},
		"no requests":   {entry("no requests", "limit", 0, now, hour, ""), overrides.SkipLimit},
		"turbo":         {entry("turbo", "turbo", 1, now, hour, ""), overrides.SkipMode},
		"not json":      {`{"rev":1,"domain":"shop",`, overrides.SkipMalformed},
		"wrong field":   {entry("other", "limit", 1, now, hour, ""), overrides.SkipMalformed},
		long:            {entry(long, "limit", 1, now, hour, ""), overrides.SkipMalformed},
		"control\x07":   {entry("control\x07", "limit", 1, now, hour, ""), overrides.SkipMalformed},
		"a long reason": {entry("a long reason", "limit", 1, now, hour, `,"reason":"`+long+`"`), overrides.SkipMalformed},
	}
	args := []any{}
	want := map[string]int{}
	for rule, b := range bad {
		args = append(args, "shop\x00"+rule, b.value)
		want[b.reason]++
	}
	// One past the bound of overrides in force: the one that ends last is
	// not applied.
	for i := range overrides.MaxInForce + 1 {
		args = append(args, fmt.Sprintf("shop\x00bulk%d", i), entry(fmt.Sprintf("bulk%d", i), "limit", 1, now, now.Add(time.Hour+time.Duration(i)*time.Second), ""))
	}
	want[overrides.SkipBound]++
	if err := c.HSet(ctx, store.hash, args...).Err(); err != nil {
		t.Fatal(err)
	}

	book := overrides.NewBook(nil)
	var got skips
	book.OnSkip(got.add)
	f, err := store.NewFollower(book, FollowerOptions{Resync: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	wg.Go(func() { f.Run(runCtx) })
	select {
	case <-f.Synced():
	case <-time.After(10 * time.Second):
		t.Fatal("not synced within 10 s")
	}
	if book.Lookup("shop", "bulk0") == nil || book.Lookup("shop", fmt.Sprintf("bulk%d", overrides.MaxInForce)) != nil {
		t.Fatal("the bound: want the soonest to end applied, the last left out")
	}
	for rule := range bad {
		if book.Lookup("shop", rule) != nil {
			t.Errorf("%.40q applied, want it skipped", rule)
		}
	}
	// Read again (a clear nudges every sidecar): nothing is reported
	// twice, and the override the bound left out is applied now.
	clearTarget(t, store, overrides.Target{Domain: "shop", Rule: "bulk0"})
	until(t, "the clear learnt", func() bool { return book.Lookup("shop", fmt.Sprintf("bulk%d", overrides.MaxInForce)) != nil })
	if g := got.reasons(); fmt.Sprint(g) != fmt.Sprint(want) {
		t.Errorf("skipped by reason %v, want %v", g, want)
	}
	got.mu.Lock()
	defer got.mu.Unlock()
	for _, k := range got.got {
		if len(k.What) > 128 || len(k.Err.Error()) > 512 || strings.ContainsAny(k.What+k.Err.Error(), "\x00\x07") {
			t.Errorf("a skip is reported unbounded or unprintable: %.200q: %.200q", k.What, k.Err)
		}
	}
	// The operator's view skips them too.
	if list, err := store.List(ctx); err != nil || len(list) != overrides.MaxInForce {
		t.Errorf("List: %d overrides (%v), want the %d valid ones", len(list), err, overrides.MaxInForce)
	}
}

// TestOverridesEndOnRedisClock: sidecars whose clocks are a minute ahead
// of and behind Redis's run on Redis's clock once they read the hash, and
// end an override together, on it.
func TestOverridesEndOnRedisClock(t *testing.T) {
	t.Parallel()
	_, _, store := startOverrides(t)
	ctx := context.Background()
	skewed := func(d time.Duration) func() time.Time { return func() time.Time { return time.Now().Add(d) } }
	ahead, behind, right := newOvSidecar(t, store, skewed(time.Minute)), newOvSidecar(t, store, skewed(-time.Minute)), newOvSidecar(t, store, nil)
	sidecars := []*ovSidecar{ahead, behind, right}
	target := overrides.Target{Domain: "shop", Rule: "coupon"}
	// The operator's clock is off too: Set puts the end on Redis's.
	set := func(n int, d time.Duration) {
		t.Helper()
		opNow := time.Now().Add(-2 * time.Minute)
		if err := store.Set(ctx, &overrides.Override{Target: target, Mode: overrides.ModeLimit, Requests: n, Set: opNow, Until: opNow.Add(d)}); err != nil {
			t.Fatal(err)
		}
	}
	set(5, time.Hour)
	for _, s := range sidecars {
		until(t, "the override learnt by every clock", func() bool { return s.requests(target) == 5 })
	}
	// Each Book runs on Redis's clock, give or take the read's round trip
	// (far less than the skew on any machine).
	for i, s := range sidecars {
		redisNow, err := store.Now(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if d := s.book.Now().Sub(redisNow); d < -10*time.Second || d > 10*time.Second {
			t.Errorf("sidecar %d: its Book's clock is %s off Redis's", i, d)
		}
	}
	// A short override replaces it: every sidecar has to learn it and
	// end it on Redis's clock (the one behind would hold it a minute
	// longer on its own).
	set(3, 2*time.Second)
	for _, s := range sidecars {
		until(t, "the short override ended on every clock", func() bool { return s.requests(target) == 0 })
	}
}

// TestOverridesMissedSetWrittenBack: a failover to a replica that holds
// the hash and its epoch but missed the first set of a rule (no field for
// it) is met by a write-back of the set, not by the fleet dropping it.
func TestOverridesMissedSetWrittenBack(t *testing.T) {
	t.Parallel()
	_, c, store := startOverrides(t)
	ctx := context.Background()
	old := overrides.Target{Domain: "shop", Rule: "old"}
	missed := overrides.Target{Domain: "shop", Rule: "coupon"}
	a, b := newOvSidecar(t, store, nil), newOvSidecar(t, store, nil)
	now := time.Now()
	for _, tg := range []overrides.Target{old, missed} {
		if err := store.Set(ctx, &overrides.Override{Target: tg, Mode: overrides.ModeLimit, Requests: 5, Set: now, Until: now.Add(time.Hour)}); err != nil {
			t.Fatal(err)
		}
	}
	until(t, "the overrides learnt", func() bool { return a.requests(missed) == 5 && b.requests(missed) == 5 })
	// The replica promoted has the epoch and the older rule, not the newest set.
	if err := c.HDel(ctx, store.hash, field(missed)).Err(); err != nil {
		t.Fatal(err)
	}
	if err := c.Publish(ctx, store.Channel(), "x").Err(); err != nil {
		t.Fatal(err)
	}
	until(t, "the missed set written back", func() bool {
		got, err := store.Get(ctx, missed)
		return err == nil && got != nil && got.Requests == 5
	})
	if a.requests(missed) != 5 || b.requests(missed) != 5 {
		t.Fatalf("the sidecars apply %d and %d, want 5", a.requests(missed), b.requests(missed))
	}
}

// handEntry returns an override of target written by hand with revision
// rev, set at now for an hour.
func handEntry(target overrides.Target, rev int64, requests int, now time.Time) string {
	return fmt.Sprintf(`{"rev":%d,"domain":%q,"rule":%q,"mode":"limit","requests":%d,"set":%q,"until":%q}`, rev, target.Domain, target.Rule,
		requests, now.UTC().Format(time.RFC3339Nano), now.Add(time.Hour).UTC().Format(time.RFC3339Nano))
}

// storedRev returns the revision of target's entry in the hash.
func storedRev(t *testing.T, c redis.UniversalClient, store *Overrides, target overrides.Target) (rev int64, cleared bool) {
	t.Helper()
	v, err := c.HGet(context.Background(), store.hash, field(target)).Result()
	if err != nil {
		t.Fatal(err)
	}
	var e struct {
		Rev     int64 `json:"rev"`
		Cleared bool  `json:"cleared"`
	}
	if err := json.Unmarshal([]byte(v), &e); err != nil {
		t.Fatal(err)
	}
	return e.Rev, e.Cleared
}

// TestOverridesClearOutranksField: a clear outranks the entry its rule's
// field holds, even one whose revision is above the hash's "~rev" (written
// by hand a little ahead of Redis's clock): the sidecars that applied it
// drop it and do not write it back over the clear.
func TestOverridesClearOutranksField(t *testing.T) {
	t.Parallel()
	_, c, store := startOverrides(t)
	ctx := context.Background()
	target := overrides.Target{Domain: "shop", Rule: "coupon"}
	a := newOvSidecar(t, store, nil)
	now, err := store.Now(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ahead := now.UnixMilli() + (overrides.ClockSlack - 10*time.Second).Milliseconds()
	if err := c.HSet(ctx, store.hash, field(target), handEntry(target, ahead, 7, now)).Err(); err != nil {
		t.Fatal(err)
	}
	if err := c.Publish(ctx, store.Channel(), "x").Err(); err != nil {
		t.Fatal(err)
	}
	until(t, "the entry applied", func() bool { return a.requests(target) == 7 })
	clearTarget(t, store, target)
	if rev, cleared := storedRev(t, c, store, target); !cleared || rev <= ahead {
		t.Fatalf("after the clear the field holds revision %d (cleared %v), want a tombstone above %d", rev, cleared, ahead)
	}
	until(t, "the clear learnt", func() bool { return a.requests(target) == 0 })
}

// TestOverridesRevisionAboveNowSkipped: an entry whose revision is above
// Redis's now plus the clock slack (no writer gave it) is skipped, and
// neither it nor such a "~rev" holds back a later set or clear.
func TestOverridesRevisionAboveNowSkipped(t *testing.T) {
	t.Parallel()
	_, c, store := startOverrides(t)
	ctx := context.Background()
	target := overrides.Target{Domain: "shop", Rule: "coupon"}
	book := overrides.NewBook(nil)
	var got skips
	book.OnSkip(got.add)
	a := newOvSidecarOf(t, store, book)
	now, err := store.Now(ctx)
	if err != nil {
		t.Fatal(err)
	}
	const huge = 9_000_000_000_000_000
	if err := c.HSet(ctx, store.hash, field(target), handEntry(target, huge, 7, now), revField, huge).Err(); err != nil {
		t.Fatal(err)
	}
	if err := c.Publish(ctx, store.Channel(), "x").Err(); err != nil {
		t.Fatal(err)
	}
	until(t, "the entry skipped", func() bool { return got.reasons()[overrides.SkipRevision] == 1 })
	if a.requests(target) != 0 {
		t.Fatal("an entry of a revision above Redis's now applied")
	}
	o := &overrides.Override{Target: target, Mode: overrides.ModeLimit, Requests: 3, Set: now, Until: now.Add(time.Hour)}
	if err := store.Set(ctx, o); err != nil {
		t.Fatal(err)
	}
	if o.Rev >= huge || o.Rev < now.UnixMilli() {
		t.Fatalf("a set after the entry got revision %d, want Redis's now in ms", o.Rev)
	}
	until(t, "the set learnt", func() bool { return a.requests(target) == 3 })
	clearTarget(t, store, target)
	until(t, "the clear learnt", func() bool { return a.requests(target) == 0 })
	if rev, cleared := storedRev(t, c, store, target); !cleared || rev <= o.Rev || rev >= huge {
		t.Fatalf("after the clear the field holds revision %d (cleared %v), want a tombstone above %d", rev, cleared, o.Rev)
	}
}

// TestOverridesSkipErrBounded: the error of an entry that does not parse
// is cut short where it is made, however long the value (a JSON error
// quotes it).
func TestOverridesSkipErrBounded(t *testing.T) {
	t.Parallel()
	target := overrides.Target{Domain: "d", Rule: "r"}
	now := time.Now()
	long := strings.Repeat("A", 1<<20)
	for name, v := range map[string]string{
		"set":  `{"rev":1,"domain":"d","rule":"r","mode":"limit","requests":1,"set":"` + long + `","until":"x"}`,
		"mode": `{"rev":1,"domain":"d","rule":"r","mode":"` + long + `","requests":1}`,
		"ctl":  `{"rev":1,"domain":"d","rule":"r","mode":"limit","requests":1,"set":"\u0007` + long + `"}`,
	} {
		r := parse(map[string]string{field(target): v}, now)
		if len(r.skipped) != 1 {
			t.Fatalf("%s: %d skipped, want 1", name, len(r.skipped))
		}
		err := r.skipped[0].skip.Err
		if n := len(err.Error()); n > 300 || strings.ContainsAny(err.Error(), "\x00\x07") {
			t.Errorf("%s: the skip's error is %d bytes: %.120q", name, n, err)
		}
		if name == "mode" && !errors.Is(err, overrides.ErrMode) {
			t.Errorf("mode: %v does not wrap ErrMode", err)
		}
	}
}

// TestOverridesWriteRetried: a set or clear whose script runs again (the
// client retried after a lost reply) writes once: one revision, one
// history entry, one message.
func TestOverridesWriteRetried(t *testing.T) {
	t.Parallel()
	_, c, store := startOverrides(t)
	ctx := context.Background()
	target := overrides.Target{Domain: "shop", Rule: "coupon"}
	now, err := store.Now(ctx)
	if err != nil {
		t.Fatal(err)
	}
	o := &overrides.Override{Target: target, Mode: overrides.ModeLimit, Requests: 3, Set: now, Until: now.Add(time.Hour)}
	ev := overrides.Event{Op: "set", At: now, Override: o}
	var revs []int64
	for range 2 {
		rev, err := store.writeOnce(ctx, "req1", o, ev, "set "+target.String())
		if err != nil {
			t.Fatal(err)
		}
		revs = append(revs, rev)
	}
	top, err := c.HGet(ctx, store.hash, revField).Int64()
	if err != nil {
		t.Fatal(err)
	}
	if revs[0] != revs[1] || top != revs[0] {
		t.Fatalf("revisions %v, ~rev %d: want one", revs, top)
	}
	if rev, _ := storedRev(t, c, store, target); rev != revs[0] {
		t.Fatalf("the field holds revision %d, want %d", rev, revs[0])
	}
	if n, err := c.LLen(ctx, store.log).Result(); err != nil || n != 1 {
		t.Fatalf("%d history entries (%v), want 1", n, err)
	}
	// Another request writes again.
	if rev, err := store.writeOnce(ctx, "req2", o, ev, "set "+target.String()); err != nil || rev <= revs[0] {
		t.Fatalf("another request: revision %d (%v), want above %d", rev, err, revs[0])
	}
}
