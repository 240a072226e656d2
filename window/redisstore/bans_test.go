package redisstore

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashgate/flashgate/window"
	"github.com/flashgate/flashgate/window/bans"
)

// newTestBans starts a redis-server and returns a FleetBans on it, with its
// key builder and client.
func newTestBans(t *testing.T) (*FleetBans, window.Keys, redis.UniversalClient) {
	t.Helper()
	_, c := startRedis(t)
	keys := testKeys(t)
	b, err := NewFleetBans(c, keys, FleetBansOptions{})
	if err != nil {
		t.Fatalf("NewFleetBans: %v", err)
	}
	return b, keys, c
}

// subscribe returns the messages published on b's channel from now on.
func subscribe(t *testing.T, c redis.UniversalClient, b *FleetBans) <-chan *redis.Message {
	t.Helper()
	ps := c.Subscribe(context.Background(), b.Channel())
	t.Cleanup(func() { _ = ps.Close() })
	if _, err := ps.Receive(context.Background()); err != nil {
		t.Fatalf("subscribe: %v", err)
	}
	return ps.Channel()
}

func nextMessage(t *testing.T, ch <-chan *redis.Message) string {
	t.Helper()
	select {
	case m := <-ch:
		return m.Payload
	case <-time.After(10 * time.Second):
		t.Fatal("no message on the bans channel in 10 s")
		return ""
	}
}

func TestFleetBansAddGetListLift(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b, keys, c := newTestBans(t)
	msgs := subscribe(t, c, b)
	k := keys.Key("coupon_uid", "u1")
	other := keys.Key("coupon_uid", strings.Repeat("x", 100)) // hashed value

	until := time.Now().Add(time.Hour).Truncate(time.Millisecond)
	if err := b.Add(ctx, k, until); err != nil {
		t.Fatalf("Add: %v", err)
	}
	if got, want := nextMessage(t, msgs), "ban "+itoa(until.UnixMilli())+" "+k+" hand"; got != want {
		t.Fatalf("message %q, want %q", got, want)
	}
	if err := b.Add(ctx, other, until.Add(time.Minute)); err != nil {
		t.Fatalf("Add: %v", err)
	}
	nextMessage(t, msgs)

	got, banned, err := b.Get(ctx, k)
	if err != nil || !banned || !got.Equal(until) {
		t.Fatalf("Get = %v, %v, %v; want %v, true", got, banned, err, until)
	}
	if ttl := c.PTTL(ctx, k+banSuffix).Val(); ttl <= 0 || ttl > time.Hour {
		t.Fatalf("ban key's TTL %v, want until the ban ends", ttl)
	}
	list, err := b.List(ctx)
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	if len(list) != 2 || list[0].Key != k || !list[0].Until.Equal(until) || list[1].Key != other {
		t.Fatalf("List = %+v, want %s then %s", list, k, other)
	}

	// Lift with the window reset: the ban, its counter and the window go.
	c.Set(ctx, k+counterSuffix, 3, time.Minute)
	c.ZAdd(ctx, k, redis.Z{Score: 1, Member: "m"})
	if err := b.Lift(ctx, k, true); err != nil {
		t.Fatalf("Lift: %v", err)
	}
	if got, want := nextMessage(t, msgs), "lift "+k; got != want {
		t.Fatalf("message %q, want %q", got, want)
	}
	if n := c.Exists(ctx, k, k+banSuffix, k+counterSuffix).Val(); n != 0 {
		t.Fatalf("%d of the key, its ban and counter remain after a lift with reset", n)
	}
	if _, banned, err := b.Get(ctx, k); banned || err != nil {
		t.Fatalf("Get after Lift = %v, %v; want not banned", banned, err)
	}
	// Without the reset the window stays.
	c.ZAdd(ctx, other, redis.Z{Score: 1, Member: "m"})
	if err := b.Lift(ctx, other, false); err != nil {
		t.Fatalf("Lift: %v", err)
	}
	if c.Exists(ctx, other).Val() != 1 {
		t.Fatal("Lift without reset deleted the window")
	}
	if list, err := b.List(ctx); err != nil || len(list) != 0 {
		t.Fatalf("List after lifts = %+v, %v; want none", list, err)
	}
	// Lifting what is not banned is fine.
	if err := b.Lift(ctx, k, false); err != nil {
		t.Fatalf("Lift of an unbanned key: %v", err)
	}
}

func TestBanEntryRuleValue(t *testing.T) {
	t.Parallel()
	keys := testKeys(t)
	for name, tc := range map[string]struct {
		rule, value string
		verbatim    bool
	}{
		"verbatim": {"coupon_per_uid", "u-1.x", true},
		"hashed":   {"coupon_per_uid", strings.Repeat("v", 100), false},
		"unsafe":   {"per_ip", "2001:db8::1", false},
		"rls":      {"rls.flashsale", "k1_v1", true},
	} {
		e := bans.Entry{Key: keys.Key(tc.rule, tc.value)}
		if got := e.Rule(); got != tc.rule {
			t.Errorf("%s: Rule() = %q, want %q", name, got, tc.rule)
		}
		v, ok := e.Value()
		if ok != tc.verbatim || ok && v != tc.value {
			t.Errorf("%s: Value() = %q, %v; want %q, %v", name, v, ok, tc.value, tc.verbatim)
		}
	}
}

func TestFleetBansListPrunes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b, keys, c := newTestBans(t)
	stale, live := keys.Key("r", "stale"), keys.Key("r", "live")
	c.ZAdd(ctx, b.Channel(), redis.Z{Score: float64(time.Now().Add(-time.Minute).UnixMilli()), Member: stale})
	if err := b.Add(ctx, live, time.Now().Add(time.Hour)); err != nil {
		t.Fatalf("Add: %v", err)
	}
	list, err := b.List(ctx)
	if err != nil || len(list) != 1 || list[0].Key != live {
		t.Fatalf("List = %+v, %v; want only %s", list, err, live)
	}
	if _, err := c.ZScore(ctx, b.Channel(), stale).Result(); err != redis.Nil {
		t.Fatalf("stale member still indexed (err %v)", err)
	}
}

func TestFleetBansRejects(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b, keys, _ := newTestBans(t)
	k := keys.Key("r", "v")
	for name, err := range map[string]error{
		"past":         b.Add(ctx, k, time.Now().Add(-time.Second)),
		"over a year":  b.Add(ctx, k, time.Now().Add(window.MaxBanDuration+time.Hour)),
		"past 2262":    b.Add(ctx, k, time.Now().Add(2562047*time.Hour)),
		"other prefix": b.Add(ctx, "zz:{000000}:r:v", time.Now().Add(time.Hour)),
		"space":        b.Lift(ctx, k+" x", false),
		"empty":        b.Lift(ctx, "", false),
	} {
		if err == nil {
			t.Errorf("%s: no error", name)
		}
	}
	if _, _, err := b.Get(ctx, "nope"); err == nil {
		t.Error("Get of a foreign key: no error")
	}
	if _, err := NewFleetBans(nil, keys, FleetBansOptions{}); err == nil {
		t.Error("NewFleetBans(nil): no error")
	}
}

func TestBanMessages(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		msg  string
		ok   bool
		want banEvent
	}{
		"threshold": {"ban 1700000000000 fg:{abcdef}:r:v threshold", true, banEvent{key: "fg:{abcdef}:r:v", until: time.UnixMilli(1700000000000)}},
		"hand":      {"ban 1700000000000 fg:{abcdef}:r:v hand", true, banEvent{key: "fg:{abcdef}:r:v", until: time.UnixMilli(1700000000000), by: bans.ByHand}},
		"bare":      {"ban 1700000000000 fg:{abcdef}:r:v", true, banEvent{key: "fg:{abcdef}:r:v", until: time.UnixMilli(1700000000000)}},
		"lift":      {"lift fg:{abcdef}:r:v", true, banEvent{lift: true, key: "fg:{abcdef}:r:v"}},
		"bad time":  {"ban soon fg:{abcdef}:r:v", false, banEvent{}},
		"other":     {"hello", false, banEvent{}},
	} {
		got, ok := parseBanMessage(tc.msg)
		if ok != tc.ok || got.key != tc.want.key || got.lift != tc.want.lift || !got.until.Equal(tc.want.until) || got.by != tc.want.by {
			t.Errorf("%s: parse(%q) = %+v, %v; want %+v, %v", name, tc.msg, got, ok, tc.want, tc.ok)
		}
	}
}

func TestInspect(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, c := startRedis(t)
	r := newTestRedis(t, c, Options{})
	keys := testKeys(t)
	for name, h := range map[string]window.Hit{
		"exact":    hit(keys.Key("r", "exact"), 4, time.Minute),
		"bucketed": bucketed(keys.Key("r", "bucketed"), 4, time.Minute, 6),
	} {
		st, err := Inspect(ctx, c, h.Key, h.Limit)
		if err != nil {
			t.Fatalf("%s: Inspect: %v", name, err)
		}
		if st.Count != 0 || st.Full() || !st.Oldest.IsZero() || st.Now.IsZero() {
			t.Fatalf("%s: empty key inspected as %+v", name, st)
		}
		before := time.Now()
		for range 3 {
			mustAllow(t, r, name, h)
		}
		st, err = Inspect(ctx, c, h.Key, h.Limit)
		if err != nil {
			t.Fatalf("%s: Inspect: %v", name, err)
		}
		if st.Count != 3 || st.Full() || st.Bucketed != (h.Limit.Buckets > 0) || st.Newest.Before(st.Oldest) {
			t.Fatalf("%s: after 3 admissions inspected as %+v", name, st)
		}
		if h.Limit.Buckets == 0 && (st.Oldest.Before(before.Add(-time.Minute)) || st.Newest.After(st.Now)) {
			t.Fatalf("%s: oldest %v, newest %v outside [%v, %v]", name, st.Oldest, st.Newest, before, st.Now)
		}
		// The next check confirms the count.
		d := mustAllow(t, r, name, h)
		if d.Count != st.Count+1 {
			t.Fatalf("%s: the check after Inspect counted %d, Inspect %d", name, d.Count, st.Count)
		}
		st, err = Inspect(ctx, c, h.Key, h.Limit)
		if err != nil {
			t.Fatalf("%s: Inspect: %v", name, err)
		}
		if st.Count != 4 || !st.Full() {
			t.Fatalf("%s: a full window inspected as %+v", name, st)
		}
		// A denial after it says to wait no longer than Inspect said.
		d = mustDeny(t, r, name, h)
		if wait := st.AdmitsAt.Sub(st.Now); d.RetryAfter <= 0 || d.RetryAfter > wait {
			t.Fatalf("%s: retry-after %v after Inspect said admits in %v", name, d.RetryAfter, wait)
		}
	}
	if _, err := Inspect(ctx, c, "", window.Limit{Requests: 1, Window: time.Second}); err == nil {
		t.Fatal("Inspect of an empty key: no error")
	}
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }
