package redisstore

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashgate/flashgate/window"
	"github.com/flashgate/flashgate/window/guard"
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

// TestRedisClusterPipelined runs the per-master auto-pipelines against a
// 3-master cluster: a request's keys on one master are one script call
// there, keys on several masters one call each with a denial undone on the
// others, a slot moved behind go-redis's back is decided right through the
// redirects, and a master down fails only the checks it holds keys of.
func TestRedisClusterPipelined(t *testing.T) {
	t.Parallel()
	cluster, cc, r := pipelinedCluster(t, 3, queued)
	ctx := context.Background()
	if err := r.Warm(ctx, 1); err != nil {
		t.Fatalf("Warm: %v", err)
	}

	t.Run("a request's keys on one master are one call", func(t *testing.T) {
		k := testKeys(t)
		keys := keysOnOneNode(t, cc, k, 3)
		hits := []window.Hit{hit(keys[0], 2, time.Minute), hit(keys[1], 2, time.Minute), hit(keys[2], 1, time.Minute)}
		resetStats(t, cc)
		mustAllow(t, r, "three keys on one master", hits...)
		d := mustDeny(t, r, "again: the third is full", hits...)
		if d.Index != 2 {
			t.Fatalf("second request = %+v, want denied on hit 2", d)
		}
		calls := masterCalls(t, cc)
		node := nodeOf(t, cc, keys[0])
		for addr, m := range calls {
			want := int64(0)
			if addr == node {
				want = 2
			}
			if m["evalsha"] != want || m["eval"] != 0 {
				t.Errorf("master %s ran %v, want %d EVALSHA", addr, m, want)
			}
		}
		for _, key := range keys[:2] {
			if n := cc.ZCard(ctx, key).Val(); n != 1 {
				t.Errorf("%s holds %d entries, want 1 (the denied request recorded nowhere)", key, n)
			}
		}
	})

	t.Run("keys on three masters: one call each, a denial undone on the others", func(t *testing.T) {
		k := testKeys(t)
		a := k.Key("uid", "a")
		b := keyOnOtherNode(t, cc, k, a)
		var cKey string
		for i := 0; ; i++ {
			cKey = k.Key("fp", fmt.Sprint(i))
			if n := nodeOf(t, cc, cKey); n != nodeOf(t, cc, a) && n != nodeOf(t, cc, b) {
				break
			}
		}
		ha, hb, hc := hit(a, 5, time.Minute), hit(b, 5, time.Minute), hit(cKey, 1, time.Minute)
		mustAllow(t, r, "fill c", hc)
		resetStats(t, cc)
		if d := mustDeny(t, r, "a, b, then full c", ha, hb, hc); d.Index != 2 {
			t.Fatalf("denial = %+v, want on hit 2", d)
		}
		for addr, m := range masterCalls(t, cc) {
			if m["evalsha"] != 1 {
				t.Errorf("master %s ran %v, want one EVALSHA", addr, m)
			}
		}
		for _, key := range []string{a, b} {
			if n := cc.ZCard(ctx, key).Val(); n != 0 {
				t.Errorf("%s holds %d entries after a denied request, want 0", key, n)
			}
		}
		if d := mustAllow(t, r, "a and b", ha, hb); d.Count != 1 {
			t.Errorf("a and b = %+v, want count 1", d)
		}
	})

	t.Run("a slot moved under concurrent batches", func(t *testing.T) {
		k := testKeys(t)
		keys := keysOnOneNode(t, cc, k, 25)
		moved := keys[0]
		src := nodeOf(t, cc, moved)
		slot := int(cc.ClusterKeySlot(ctx, moved).Val())
		dst := 0
		for i, n := range cluster.Nodes() {
			if n.Addr() != src {
				dst = i
				break
			}
		}
		mustAllow(t, r, "one before the move", hit(moved, 5, time.Minute))
		// go-redis keeps its slot map: the pipeline of src gets the moved
		// key until a redirect reloads it.
		if err := cluster.MoveSlot(ctx, slot, dst); err != nil {
			t.Fatalf("MoveSlot: %v", err)
		}
		// 24 requests at once, each a fresh key of src's and the moved key
		// (limit 5, one admitted already): the moved key is declared first
		// (MOVED) or second (the script meets a key its master lost).
		const n = 24
		allowed := make([]bool, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() {
				hs := []window.Hit{hit(keys[1+i], 1, time.Minute), hit(moved, 5, time.Minute)}
				if i%2 == 0 {
					hs[0], hs[1] = hs[1], hs[0]
				}
				d, err := r.Decide(ctx, hs)
				if err != nil {
					t.Errorf("request %d: %v", i, err)
					return
				}
				allowed[i] = d.Allowed
			})
		}
		wg.Wait()
		admitted := 0
		for i, ok := range allowed {
			want := int64(0)
			if ok {
				admitted++
				want = 1
			}
			if got := cc.ZCard(ctx, keys[1+i]).Val(); got != want {
				t.Errorf("request %d (allowed %v): its own key holds %d entries, want %d", i, ok, got, want)
			}
		}
		if admitted != 4 {
			t.Errorf("%d of %d requests admitted, want 4 (limit 5, one before the move)", admitted, n)
		}
		dstClient := redis.NewClient(&redis.Options{Addr: cluster.Nodes()[dst].Addr(), Protocol: 2, DisableIdentity: true})
		defer dstClient.Close()
		if got, err := dstClient.ZCard(ctx, moved).Result(); err != nil || got != 5 {
			t.Errorf("the moved key holds %d entries on its new master (%v), want 5", got, err)
		}
	})

	// Last: it kills a master.
	t.Run("a master down fails only the checks it holds keys of", func(t *testing.T) {
		k := testKeys(t)
		a := k.Key("uid", "a")
		b := keyOnOtherNode(t, cc, k, a)
		down := nodeOf(t, cc, b)
		for _, n := range cluster.Nodes() {
			if n.Addr() == down {
				n.Kill()
			}
		}
		d, err := r.Decide(ctx, []window.Hit{hit(a, 5, time.Minute), hit(b, 5, time.Minute)})
		if err == nil {
			t.Fatalf("Decide with b's master down = %+v, want an error", d)
		}
		if k := window.Classify(err); k != window.KindMasterDown {
			t.Errorf("Decide with b's master down: %v, of kind %s, want %s", err, k, window.KindMasterDown)
		}
		if n, err := cc.ZCard(ctx, a).Result(); err != nil || n != 0 {
			t.Fatalf("a holds %d entries (%v) after a request that failed on b, want 0", n, err)
		}
		// A key that a live master says is full decides the request: a
		// denial, never an error that a failure mode could admit.
		full := k.Key("uid", "full")
		for i := 0; nodeOf(t, cc, full) == down; i++ {
			full = k.Key("uid", fmt.Sprint("full", i))
		}
		mustAllow(t, r, "fill full", hit(full, 1, time.Minute))
		if d, err := r.Decide(ctx, []window.Hit{hit(full, 1, time.Minute), hit(b, 100, time.Minute)}); err != nil || d.Allowed || d.Index != 0 {
			t.Fatalf("full key on a live master with b's master down = %+v, %v; want denied on hit 0", d, err)
		}
		// Behind serve's breaker (its defaults), the checks on the other
		// masters keep being decided by Redis while b's fail in runs of
		// three, the breaker's run of connection errors: master_down is
		// not in that run. The failure rate, 3 in 4, stays under the
		// breaker's 0.8 however the calls fall into its buckets (a busy
		// machine spreads them), so only the run could open it.
		br, err := guard.NewBreaker(r, guard.BreakerOptions{})
		if err != nil {
			t.Fatalf("NewBreaker: %v", err)
		}
		for i := range 40 {
			if i%4 == 3 {
				if d := mustAllow(t, br, "a alone", hit(a, 50, time.Minute)); d.Count != (i+1)/4 {
					t.Fatalf("a alone = %+v, want count %d", d, (i+1)/4)
				}
				continue
			}
			if _, err := br.Decide(ctx, []window.Hit{hit(b, 100, time.Minute)}); window.Classify(err) != window.KindMasterDown {
				t.Fatalf("check %d on b's master: %v, want an error of kind %s", i, err, window.KindMasterDown)
			}
		}
	})
}

// keysOnOneNode returns n of k's "uid" keys in different slots of one
// master.
func keysOnOneNode(t *testing.T, cc *redis.ClusterClient, k window.Keys, n int) []string {
	t.Helper()
	first := k.Key("uid", "0")
	node := nodeOf(t, cc, first)
	slots := map[int64]bool{cc.ClusterKeySlot(context.Background(), first).Val(): true}
	keys := []string{first}
	for i := 1; len(keys) < n; i++ {
		key := k.Key("uid", fmt.Sprint(i))
		s := cc.ClusterKeySlot(context.Background(), key).Val()
		if nodeOf(t, cc, key) == node && !slots[s] {
			slots[s] = true
			keys = append(keys, key)
		}
	}
	return keys
}

// resetStats runs CONFIG RESETSTAT on every master.
func resetStats(t *testing.T, cc *redis.ClusterClient) {
	t.Helper()
	if err := cc.ForEachMaster(context.Background(), func(ctx context.Context, m *redis.Client) error {
		return m.ConfigResetStat(ctx).Err()
	}); err != nil {
		t.Fatalf("CONFIG RESETSTAT: %v", err)
	}
}

// masterCalls returns per master (by address) its commandCalls.
func masterCalls(t *testing.T, cc *redis.ClusterClient) map[string]map[string]int64 {
	t.Helper()
	var mu sync.Mutex
	out := map[string]map[string]int64{}
	if err := cc.ForEachMaster(context.Background(), func(ctx context.Context, m *redis.Client) error {
		calls := commandCalls(t, m)
		mu.Lock()
		out[m.Options().Addr] = calls
		mu.Unlock()
		return nil
	}); err != nil {
		t.Fatalf("INFO commandstats: %v", err)
	}
	return out
}

// TestRedisClusterPrunesMastersThatLeft empties one master of a 2-master
// cluster into the other: prune closes the pipeline of the master that left
// the slot map, its keys are decided on their new master, and the store,
// now of one master, counts that master's failure as the store's outage
// (connection), not as one master of several down.
func TestRedisClusterPrunesMastersThatLeft(t *testing.T) {
	t.Parallel()
	cluster, cc, r := pipelinedCluster(t, 2, nil)
	ctx := context.Background()
	k := testKeys(t)
	a := k.Key("uid", "a")
	b := keyOnOtherNode(t, cc, k, a)
	mustAllow(t, r, "a", hit(a, 5, time.Minute))
	mustAllow(t, r, "b", hit(b, 5, time.Minute))
	if n := r.nodes.masters(); n != 2 {
		t.Fatalf("%d masters with a pipeline after checks on both, want 2", n)
	}

	stay, leave := cluster.Nodes()[0], cluster.Nodes()[1]
	if nodeOf(t, cc, a) != stay.Addr() {
		stay, leave = leave, stay
	}
	left := (*r.nodes.byAddr.Load())[leave.Addr()].pipe
	moveAllSlots(t, leave.Addr(), stay.Addr())
	if err := r.nodes.prune(ctx); err != nil {
		t.Fatalf("prune: %v", err)
	}
	if n := r.nodes.masters(); n != 1 {
		t.Fatalf("%d masters with a pipeline after one left the slot map, want 1", n)
	}
	if _, ok := (*r.nodes.byAddr.Load())[leave.Addr()]; ok {
		t.Fatal("the master that left still has a pipeline")
	}
	left.mu.Lock()
	closed := left.closed
	left.mu.Unlock()
	if !closed {
		t.Fatal("the pipeline of the master that left is not closed")
	}
	if d := mustAllow(t, r, "b on its new master", hit(b, 5, time.Minute)); d.Count != 1 {
		t.Fatalf("b on its new master = %+v, want count 1 (its old master was emptied)", d)
	}

	stay.Kill()
	d, err := r.Decide(ctx, []window.Hit{hit(a, 5, time.Minute)})
	if err == nil {
		t.Fatalf("Decide with the only master down = %+v, want an error", d)
	}
	if k := window.Classify(err); k != window.KindConnection {
		t.Fatalf("Decide with the only master down: %v, of kind %s, want %s", err, k, window.KindConnection)
	}
}

// pipelinedCluster starts a Cluster of masters and an auto-pipelined store
// on it, its tuning changed by tune (nil: the default), closed at the end of t.
func pipelinedCluster(t *testing.T, masters int, tune func(*pipelineTuning)) (*redistest.Cluster, *redis.ClusterClient, *Redis) {
	t.Helper()
	cluster := redistest.StartCluster(t, masters)
	c := newTestClient(t, ClientConfig{Addrs: cluster.Addrs(), Mode: ModeCluster})
	r := newTunedRedis(t, c, Options{AutoPipeline: true}, tune)
	t.Cleanup(r.Close)
	if r.nodes == nil {
		t.Fatal("a cluster client with AutoPipeline got no per-master pipelines")
	}
	return cluster, c.(*redis.ClusterClient), r
}

// moveAllSlots gives every slot of the master at from, emptied first, to
// the master at to (CLUSTER SETSLOT NODE on both), and waits until both
// report to as the only master serving slots.
func moveAllSlots(t *testing.T, from, to string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	src := redis.NewClient(&redis.Options{Addr: from, Protocol: 2, DisableIdentity: true})
	defer src.Close()
	dst := redis.NewClient(&redis.Options{Addr: to, Protocol: 2, DisableIdentity: true})
	defer dst.Close()
	id, err := dst.Do(ctx, "CLUSTER", "MYID").Text()
	if err != nil {
		t.Fatalf("CLUSTER MYID: %v", err)
	}
	if err := src.FlushAll(ctx).Err(); err != nil {
		t.Fatalf("FLUSHALL: %v", err)
	}
	slots, err := src.ClusterSlots(ctx).Result()
	if err != nil {
		t.Fatalf("CLUSTER SLOTS: %v", err)
	}
	// dst's claim must win over from's in gossip: without a newer config
	// epoch, from's older one can take the slots back.
	if err := dst.Do(ctx, "CLUSTER", "BUMPEPOCH").Err(); err != nil {
		t.Fatalf("CLUSTER BUMPEPOCH: %v", err)
	}
	for _, s := range slots {
		if len(s.Nodes) == 0 || s.Nodes[0].Addr != from {
			continue
		}
		for _, cl := range []*redis.Client{dst, src} {
			pipe := cl.Pipeline()
			for slot := s.Start; slot <= s.End; slot++ {
				pipe.Do(ctx, "CLUSTER", "SETSLOT", slot, "NODE", id)
			}
			if _, err := pipe.Exec(ctx); err != nil {
				// A master that has lost its last slot (gossip from dst
				// may tell it first) turns into dst's replica, which
				// refuses SETSLOT: it knows the move already.
				if cl == src && strings.Contains(err.Error(), "only with masters") {
					continue
				}
				t.Fatalf("CLUSTER SETSLOT %d-%d NODE on %s: %v", s.Start, s.End, cl.Options().Addr, err)
			}
		}
	}
	for _, cl := range []*redis.Client{src, dst} {
		for {
			slots, err := cl.ClusterSlots(ctx).Result()
			only := err == nil && len(slots) > 0
			for _, s := range slots {
				only = only && len(s.Nodes) > 0 && s.Nodes[0].Addr == to
			}
			// A node answers CLUSTERDOWN until it sees every slot served
			// again: wait for its cluster_state too.
			if only && cl == dst {
				info, err := cl.ClusterInfo(ctx).Result()
				only = err == nil && strings.Contains(info, "cluster_state:ok")
			}
			if only {
				break
			}
			if ctx.Err() != nil {
				t.Fatalf("%s never reported %s as the only master (last: %v %v)", cl.Options().Addr, to, slots, err)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}
