package window

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashgate/flashgate/window/redistest"
)

// limiterFactory makes a fresh limiter for one conformance case. client is
// the Redis under it (nil for Memory), for cases that inspect keys.
type limiterFactory struct {
	name  string
	redis bool
	new   func(t *testing.T) (lim Limiter, client redis.UniversalClient)
}

// conformanceCase runs against every implementation with real time: windows
// of 100–400 ms and slack for slow -race runs. keys is unique to the case.
type conformanceCase struct {
	name      string
	redisOnly bool
	run       func(t *testing.T, lim Limiter, client redis.UniversalClient, keys Keys)
}

// slack bounds how far timings measured here may drift from the limiter's
// own clock (scheduling, round trips, -race).
const slack = 40 * time.Millisecond

// TestConformance runs one table against Memory, Redis standalone and
// Redis Cluster.
func TestConformance(t *testing.T) {
	t.Parallel()
	factories := []limiterFactory{
		{name: "memory", new: func(t *testing.T) (Limiter, redis.UniversalClient) {
			m, err := NewMemory(MemoryOptions{})
			if err != nil {
				t.Fatalf("NewMemory: %v", err)
			}
			return m, nil
		}},
	}
	single := redistest.Start(t)
	factories = append(factories, limiterFactory{name: "redis", redis: true, new: func(t *testing.T) (Limiter, redis.UniversalClient) {
		c := newTestClient(t, ClientConfig{Addrs: []string{single.Addr()}})
		return newTestRedis(t, c, RedisOptions{}), c
	}})
	cluster := redistest.StartCluster(t, 3)
	factories = append(factories, limiterFactory{name: "redis-cluster", redis: true, new: func(t *testing.T) (Limiter, redis.UniversalClient) {
		c := newTestClient(t, ClientConfig{Addrs: cluster.Addrs(), Mode: ModeCluster})
		if err := c.Ping(context.Background()).Err(); err != nil { // loads the slot map
			t.Fatalf("PING the cluster: %v", err)
		}
		return newTestRedis(t, c, RedisOptions{}), c
	}})
	for _, f := range factories {
		t.Run(f.name, func(t *testing.T) {
			t.Parallel()
			for _, tc := range conformanceCases {
				if tc.redisOnly && !f.redis {
					continue
				}
				t.Run(tc.name, func(t *testing.T) {
					t.Parallel()
					lim, client := f.new(t)
					tc.run(t, lim, client, testKeys(t))
				})
			}
		})
	}
}

var conformanceCases = []conformanceCase{
	{name: "exact limit", run: func(t *testing.T, lim Limiter, _ redis.UniversalClient, k Keys) {
		h := rhit(k.Key("uid", "u1"), 5, 400*time.Millisecond)
		for i := range 5 {
			d := decideOK(t, lim, h)
			if !d.Allowed || d.Count != i+1 || d.Remaining != 4-i || d.Index != 0 || d.Limit != h.Limit || d.RetryAfter != 0 {
				t.Fatalf("request %d = %+v, want allowed, count %d, remaining %d", i+1, d, i+1, 4-i)
			}
		}
		for i := range 3 {
			d := decideOK(t, lim, h)
			if d.Allowed || d.Count != 5 || d.Remaining != 0 || d.Index != 0 || d.Source != SourceBackend {
				t.Fatalf("request %d over the limit = %+v, want denied with count 5", 6+i, d)
			}
			if d.RetryAfter <= 0 || d.RetryAfter > h.Limit.Window {
				t.Fatalf("retry-after %s outside (0, %s]", d.RetryAfter, h.Limit.Window)
			}
		}
	}},
	{name: "sliding at millisecond scale", run: func(t *testing.T, lim Limiter, _ redis.UniversalClient, k Keys) {
		const w = 200 * time.Millisecond
		h := rhit(k.Key("uid", "u1"), 2, w)
		t0 := time.Now()
		mustAllow(t, lim, "A at 0", h)
		time.Sleep(100 * time.Millisecond)
		t1 := time.Now()
		mustAllow(t, lim, "B at 100ms", h)
		d := mustDeny(t, lim, "C at 100ms", h)
		afterC := time.Now()
		// A leaves at t0+w.
		if want := time.Until(t0.Add(w)); d.RetryAfter < want-slack || d.RetryAfter > want+slack {
			t.Fatalf("C's retry-after %s, want about %s (when A leaves)", d.RetryAfter, want)
		}
		sleepUntil(afterC.Add(d.RetryAfter + 2*time.Millisecond))
		mustAllow(t, lim, "D after A left", h)
		d = mustDeny(t, lim, "E while B and D are in", h)
		if want := time.Until(t1.Add(w)); d.RetryAfter < want-slack || d.RetryAfter > want+slack {
			t.Fatalf("E's retry-after %s, want about %s (when B leaves)", d.RetryAfter, want)
		}
	}},
	{name: "all or nothing", run: func(t *testing.T, lim Limiter, _ redis.UniversalClient, k Keys) {
		const w = 10 * time.Second
		tight, loose, other := rhit(k.Key("uid", "u1"), 1, w), rhit(k.Key("ip", "1.2.3.4"), 5, w), rhit(k.Key("fp", "f1"), 5, w)
		mustAllow(t, lim, "first", tight, loose)
		for i := range 3 {
			d := mustDeny(t, lim, "second", loose, other, tight)
			if d.Index != 2 || d.Limit != tight.Limit || d.Count != 1 {
				t.Fatalf("denial %d = %+v, want hit 2 (the full one) binding with count 1", i, d)
			}
		}
		// Neither loose nor other was recorded by the denials.
		if d := mustAllow(t, lim, "loose alone", loose); d.Count != 2 {
			t.Fatalf("loose count after 3 denied requests = %d, want 2", d.Count)
		}
		if d := mustAllow(t, lim, "other alone", other); d.Count != 1 {
			t.Fatalf("other count after 3 denied requests = %d, want 1", d.Count)
		}
		// The admitted request reports its tightest hit.
		d := mustAllow(t, lim, "loose and other", other, loose)
		if d.Index != 1 || d.Remaining != 2 || d.Count != 3 {
			t.Fatalf("allowed = %+v, want binding hit 1 (loose, 3 of 5)", d)
		}
	}},
	{name: "denied requests are not recorded", run: func(t *testing.T, lim Limiter, _ redis.UniversalClient, k Keys) {
		const w = 200 * time.Millisecond
		h := rhit(k.Key("uid", "u1"), 2, w)
		t0 := time.Now()
		mustAllow(t, lim, "1", h)
		mustAllow(t, lim, "2", h)
		admitted := time.Now()
		for time.Since(t0) < w-slack {
			mustDeny(t, lim, "hammering", h)
			time.Sleep(5 * time.Millisecond)
		}
		sleepUntil(admitted.Add(w + 2*time.Millisecond))
		mustAllow(t, lim, "after the admissions left", h)
		mustAllow(t, lim, "second after the admissions left", h)
	}},
	{name: "retry-after is when the window admits again", run: func(t *testing.T, lim Limiter, _ redis.UniversalClient, k Keys) {
		const w = 300 * time.Millisecond
		h := rhit(k.Key("uid", "u1"), 3, w)
		t0 := time.Now()
		mustAllow(t, lim, "1", h)
		time.Sleep(60 * time.Millisecond)
		mustAllow(t, lim, "2", h)
		mustAllow(t, lim, "3", h)
		d := mustDeny(t, lim, "4", h)
		after4 := time.Now()
		if want := time.Until(t0.Add(w)); d.RetryAfter < want-slack || d.RetryAfter > want+slack {
			t.Fatalf("retry-after %s, want about %s (entry 1 leaves at +%s)", d.RetryAfter, want, w)
		}
		time.Sleep(d.RetryAfter / 3)
		mustDeny(t, lim, "a third of retry-after later", h)
		// Exact: the window admits again once retry-after has passed since
		// the decision (which happened before after4).
		sleepUntil(after4.Add(d.RetryAfter + 2*time.Millisecond))
		mustAllow(t, lim, "after retry-after", h)
		d = mustDeny(t, lim, "next, while 2 and 3 are in", h)
		if d.RetryAfter > w-60*time.Millisecond+slack {
			t.Fatalf("retry-after %s, want at most %s (entry 2 leaves ~60ms after entry 1)", d.RetryAfter, w-60*time.Millisecond+slack)
		}
	}},
	{name: "retry-after with many entries to leave", run: func(t *testing.T, lim Limiter, _ redis.UniversalClient, k Keys) {
		// Ten entries at t0, ten at t0+100ms; limit lowered to 5: the entry
		// that must leave is in the second group.
		const w = 400 * time.Millisecond
		key := k.Key("uid", "u1")
		t0 := time.Now()
		for range 10 {
			mustAllow(t, lim, "early", rhit(key, 20, w))
		}
		time.Sleep(100 * time.Millisecond)
		t1 := time.Now()
		for range 10 {
			mustAllow(t, lim, "late", rhit(key, 20, w))
		}
		d := mustDeny(t, lim, "at 5", rhit(key, 5, w))
		if d.Count != 20 {
			t.Fatalf("count %d, want 20", d.Count)
		}
		if want := time.Until(t1.Add(w)); d.RetryAfter < want-slack || d.RetryAfter > want+slack {
			t.Fatalf("retry-after %s, want about %s (entry 16 of 20, after %s)", d.RetryAfter, want, t1.Sub(t0))
		}
	}},
	{name: "shadow hits never deny and do not grow a full window", run: func(t *testing.T, lim Limiter, _ redis.UniversalClient, k Keys) {
		const w = 10 * time.Second
		enf, sh := rhit(k.Key("ip", "1.2.3.4"), 5, w), rhit(k.Key("uid", "u1"), 1, w)
		sh.Shadow = true
		d := mustAllow(t, lim, "first", enf, sh)
		if d.Shadowed || d.ShadowIndex != -1 {
			t.Fatalf("first = %+v, want not shadowed", d)
		}
		for i := range 2 {
			// The binding hit of an admission is the one with the fewest
			// remaining: the full shadow hit.
			d := mustAllow(t, lim, "over the shadow limit", enf, sh)
			if !d.Shadowed || d.ShadowIndex != 1 || d.Index != 1 || d.Count != 1 || d.Remaining != 0 {
				t.Fatalf("request %d = %+v, want allowed, shadowed and bound at 1 with count 1", 2+i, d)
			}
		}
		if d := mustAllow(t, lim, "enforcing alone", enf); d.Count != 4 {
			t.Fatalf("enforcing count = %d, want 4 (3 requests with the shadow hit, 1 alone)", d.Count)
		}
		// The shadow window stayed at 1 entry: a lone shadow hit is over.
		sh2 := sh
		sh2.Limit.Requests = 2
		if d := mustAllow(t, lim, "shadow at 2", sh2); d.Shadowed || d.Count != 2 {
			t.Fatalf("shadow key at limit 2 = %+v, want admitted with count 2 (1 before)", d)
		}
		// A request denied by an enforcing hit is not recorded in its shadow hits.
		full, sh3 := rhit(k.Key("uid", "full"), 1, w), rhit(k.Key("fp", "f1"), 5, w)
		sh3.Shadow = true
		mustAllow(t, lim, "fill", full)
		mustDeny(t, lim, "denied with a shadow hit", sh3, full)
		if d := mustAllow(t, lim, "shadow alone", sh3); d.Count != 1 {
			t.Fatalf("shadow key after a denied request = %+v, want count 1", d)
		}
	}},
	{name: "invalid hits and no hits", run: func(t *testing.T, lim Limiter, _ redis.UniversalClient, k Keys) {
		for _, h := range []Hit{
			{Key: "", Limit: Limit{Requests: 1, Window: time.Second}},
			{Key: k.Key("r", "v"), Limit: Limit{Requests: 0, Window: time.Second}},
			{Key: k.Key("r", "v"), Limit: Limit{Requests: 1, Window: time.Microsecond}},
		} {
			if _, err := lim.Decide(context.Background(), []Hit{rhit(k.Key("ok", "v"), 1, time.Second), h}); !errors.Is(err, ErrInvalidHit) {
				t.Fatalf("Decide with %+v: %v, want ErrInvalidHit", h, err)
			}
		}
		if d := decideOK(t, lim); !d.Allowed || d.Index != -1 || d.ShadowIndex != -1 {
			t.Fatalf("no hits = %+v, want allowed with index -1", d)
		}
		// The valid hit of the rejected requests was not recorded.
		if d := mustAllow(t, lim, "ok", rhit(k.Key("ok", "v"), 1, time.Second)); d.Count != 1 {
			t.Fatalf("count %d, want 1", d.Count)
		}
	}},
	{name: "keys expire one window after the last admission", redisOnly: true, run: func(t *testing.T, lim Limiter, c redis.UniversalClient, k Keys) {
		ctx := context.Background()
		for _, w := range []time.Duration{100 * time.Millisecond, 1500 * time.Microsecond, 10 * time.Second, time.Hour} {
			key := k.Key("uid", w.String())
			mustAllow(t, lim, "first", rhit(key, 3, w))
			mustAllow(t, lim, "second", rhit(key, 3, w))
			ttl, err := c.PTTL(ctx, key).Result()
			if err != nil {
				t.Fatal(err)
			}
			if ttl == -2 && w < 10*time.Millisecond {
				continue // already expired: fine for a tiny window
			}
			if ttl <= 0 || ttl > w+time.Millisecond {
				t.Fatalf("window %s: PTTL %s, want in (0, window rounded up to ms]", w, ttl)
			}
		}
		key := k.Key("uid", "short")
		mustAllow(t, lim, "short", rhit(key, 3, 50*time.Millisecond))
		time.Sleep(50*time.Millisecond + slack)
		if n, err := c.Exists(ctx, key).Result(); err != nil || n != 0 {
			t.Fatalf("EXISTS one window after the last admission = %d, %v; want 0", n, err)
		}
	}},
	{name: "a retried request is recorded once", redisOnly: true, run: func(t *testing.T, lim Limiter, c redis.UniversalClient, k Keys) {
		r := lim.(*Redis)
		ctx := context.Background()
		hits := []Hit{rhit(k.Key("uid", "u1"), 2, 10*time.Second), rhit(k.Key("ip", "1.2.3.4"), 3, 10*time.Second)}
		member := r.member()
		for i := range 3 {
			d, _, err := r.decideMember(ctx, hits, member)
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
		mustAllow(t, lim, "second request", hits...)
		mustDeny(t, lim, "third request", hits...)
	}},
}

func mustAllow(t *testing.T, lim Limiter, what string, hits ...Hit) Decision {
	t.Helper()
	d := decideOK(t, lim, hits...)
	if !d.Allowed {
		t.Fatalf("%s: denied (%+v), want allowed", what, d)
	}
	return d
}

func mustDeny(t *testing.T, lim Limiter, what string, hits ...Hit) Decision {
	t.Helper()
	d := decideOK(t, lim, hits...)
	if d.Allowed {
		t.Fatalf("%s: allowed (%+v), want denied", what, d)
	}
	return d
}

func sleepUntil(at time.Time) { time.Sleep(time.Until(at)) }
