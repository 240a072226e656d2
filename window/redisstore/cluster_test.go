package redisstore

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashgate/flashgate/window"
	"github.com/flashgate/flashgate/window/redistest"
)

// TestRedisCluster runs the per-slot mode against a 3-master cluster: keys
// spread over slots and nodes, hostile values stay bounded and distinct,
// partial admissions are undone, and an empty script cache is survived.
func TestRedisCluster(t *testing.T) {
	t.Parallel()
	cluster := redistest.StartCluster(t, 3)
	c := newTestClient(t, ClientConfig{Addrs: cluster.Addrs()})
	cc, ok := c.(*redis.ClusterClient)
	if !ok {
		t.Fatalf("NewClient with 3 addresses = %T, want *redis.ClusterClient", c)
	}
	ctx := context.Background()
	r := newTestRedis(t, c, Options{})
	if !r.perKey {
		t.Fatal("a cluster client did not get per-key mode")
	}
	if err := r.Ping(ctx); err != nil {
		t.Fatalf("Ping: %v", err)
	}

	t.Run("hostile keys", func(t *testing.T) {
		k := testKeys(t)
		huge := strings.Repeat("a", 1<<20)
		values := []string{
			"", "a", "b", "a:b", "a::b", ":", "{", "}", "{}", "{x}", "{x}y", "x{y}", "}{", "{{x}}",
			"a\x00b", "a\x00", "\x00", "\xff\xfe", "\xc3\x28", "日本", "a b", "a/b", "a%00b",
			huge, huge + "b", huge[1:], strings.Repeat("x", window.MaxVerbatim), strings.Repeat("x", window.MaxVerbatim+1),
		}
		rules := []string{"uid", "uid:a", "u{id}", "", "a", "a:b", "\x00", strings.Repeat("r", 1000)}
		seen := map[string]string{}
		var keys []string
		for _, rule := range rules {
			for _, v := range values {
				key := k.Key(rule, v)
				if len(key) > window.MaxKeyLen {
					t.Fatalf("key of (%.20q, %.20q) is %d bytes, want ≤ %d", rule, v, len(key), window.MaxKeyLen)
				}
				id := fmt.Sprintf("(%.20q, %.20q len %d)", rule, v, len(v))
				if prev, dup := seen[key]; dup {
					t.Fatalf("%s and %s share the key %q", prev, id, key)
				}
				seen[key] = id
				// The only hash tag is the server's: "{" right after the
				// prefix, six hex digits, "}".
				if i := strings.IndexByte(key, '{'); i != len(k.Prefix())+1 || key[i+7] != '}' {
					t.Fatalf("key %q: the first '{' is not the server's hash tag", key)
				}
				keys = append(keys, key)
			}
		}
		// Every one of them works through the cluster (no CROSSSLOT,
		// MOVED handled), as a single request of many hits.
		var hits []window.Hit
		for _, key := range keys[:40] {
			hits = append(hits, hit(key, 1, time.Minute))
		}
		mustAllow(t, r, "40 hostile hits", hits...)
		d := mustDeny(t, r, "40 hostile hits again", hits...)
		if d.Index != 0 {
			t.Fatalf("second request = %+v, want denied on hit 0", d)
		}
	})

	t.Run("keys spread over slots", func(t *testing.T) {
		k := testKeys(t)
		const n = 2000
		pipe := cc.Pipeline()
		cmds := make([]*redis.IntCmd, n)
		for i := range n {
			// A value trying to pin every key to one slot.
			cmds[i] = pipe.ClusterKeySlot(ctx, k.Key("uid", fmt.Sprintf("{pinned}%d", i)))
		}
		if _, err := pipe.Exec(ctx); err != nil {
			t.Fatalf("CLUSTER KEYSLOT: %v", err)
		}
		slots := map[int64]bool{}
		var perNode [3]int
		for _, c := range cmds {
			s := c.Val()
			slots[s] = true
			perNode[min(int(s)/(16384/3), 2)]++
		}
		if len(slots) < n*8/10 {
			t.Fatalf("%d keys fell in %d slots, want at least %d", n, len(slots), n*8/10)
		}
		for i, m := range perNode {
			if m < n/5 {
				t.Fatalf("node %d holds %d of %d keys (%v), want at least %d", i, m, n, perNode, n/5)
			}
		}
	})

	t.Run("a later denial undoes earlier admissions", func(t *testing.T) {
		k := testKeys(t)
		// Find two keys on different nodes.
		a := k.Key("uid", "a")
		b := keyOnOtherNode(t, cc, k, a)
		ha, hb := hit(a, 5, time.Minute), hit(b, 1, time.Minute)
		sh := hit(k.Key("fp", "f"), 5, time.Minute)
		sh.Shadow = true
		mustAllow(t, r, "fill b", hb)
		for range 3 {
			mustDeny(t, r, "a, shadow, then full b", ha, sh, hb)
		}
		for _, key := range []string{a, sh.Key} {
			if n := cc.ZCard(ctx, key).Val(); n != 0 {
				t.Fatalf("%s holds %d entries after denied requests, want 0", key, n)
			}
		}
		if d := mustAllow(t, r, "a alone", ha); d.Count != 1 {
			t.Fatalf("a alone = %+v, want count 1", d)
		}
	})

	t.Run("exact under concurrency with partial admissions", func(t *testing.T) {
		// Requests of two hits: a per-user key (often full, so the shared
		// key's admission is often undone), then a shared key, last so
		// that the hammer reads its node's time.
		k := testKeys(t)
		const (
			limit = 10
			win   = 100 * time.Millisecond
		)
		shared := k.Key("ip", "shared")
		var limiters []*Redis
		for range 3 {
			limiters = append(limiters, newTestRedis(t, newTestClient(t, ClientConfig{Addrs: cluster.Addrs(), PoolSize: 16}), Options{}))
		}
		ts := hammer(t, limiters, 16, 4*win, func(ts []int64) bool { return len(ts) >= limit }, func(g, i int) []window.Hit {
			return []window.Hit{hit(k.Key("uid", fmt.Sprint((g+i)%8)), 1, win), hit(shared, limit, win)}
		})
		checkSliding(t, ts, limit, win.Microseconds())
		if len(ts) < limit {
			t.Fatalf("%d admissions, want at least %d", len(ts), limit)
		}
		t.Logf("%d admissions over %dµs at %d/%s on the shared key", len(ts), ts[len(ts)-1]-ts[0], limit, win)
	})

	t.Run("empty script cache", func(t *testing.T) {
		k := testKeys(t)
		hits := []window.Hit{hit(k.Key("uid", "u"), 5, time.Minute), hit(k.Key("ip", "i"), 5, time.Minute), hit(k.Key("fp", "f"), 5, time.Minute)}
		mustAllow(t, r, "before the flush", hits...)
		if err := cc.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
			return m.ScriptFlush(ctx).Err()
		}); err != nil {
			t.Fatalf("SCRIPT FLUSH: %v", err)
		}
		if d := mustAllow(t, r, "after the flush", hits...); d.Count != 2 {
			t.Fatalf("after the flush = %+v, want count 2", d)
		}
		if d := mustAllow(t, r, "one key after the flush", hits[0]); d.Count != 3 {
			t.Fatalf("one key = %+v, want count 3", d)
		}
	})

	// Last: it kills a node.
	t.Run("a failed key undoes the others", func(t *testing.T) {
		k := testKeys(t)
		nodes := cluster.Nodes()
		a := k.Key("uid", "a")
		b := keyOnOtherNode(t, cc, k, a)
		for _, n := range nodes {
			if n.Addr() == nodeOf(t, cc, b) {
				n.Kill()
			}
		}
		if d, err := r.Decide(ctx, []window.Hit{hit(a, 5, time.Minute), hit(b, 5, time.Minute)}); err == nil {
			t.Fatalf("Decide with b's node down = %+v, want an error", d)
		}
		if n, err := cc.ZCard(ctx, a).Result(); err != nil || n != 0 {
			t.Fatalf("a holds %d entries (%v) after a request that failed on b, want 0", n, err)
		}
	})
}

// nodeOf returns the address of the master serving key.
// keyOnOtherNode returns the first of k's "ip" keys whose master is not
// a's.
func keyOnOtherNode(t *testing.T, cc *redis.ClusterClient, k window.Keys, a string) string {
	t.Helper()
	for i := 0; ; i++ {
		if b := k.Key("ip", fmt.Sprint(i)); nodeOf(t, cc, b) != nodeOf(t, cc, a) {
			return b
		}
	}
}

func nodeOf(t *testing.T, cc *redis.ClusterClient, key string) string {
	t.Helper()
	m, err := cc.MasterForKey(context.Background(), key)
	if err != nil {
		t.Fatalf("MasterForKey: %v", err)
	}
	return m.Options().Addr
}
