package redisstore

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashgate/flashgate/window"
	"github.com/flashgate/flashgate/window/redistest"
)

// TestLeaseClusterSentinel runs the reserving script where serve runs it
// besides a standalone Redis: through Sentinel, and on a 3-master Cluster
// (one key per call, its KEYS declared, keys spread over the masters), with
// and without the auto-pipeline. Two sidecars lease each key to its limit,
// a retried grant counts nothing twice, returns are idempotent, Inspect
// lists who holds what, and a request decided under WithMember is undone
// on every node it touched.
func TestLeaseClusterSentinel(t *testing.T) {
	t.Parallel()
	sentinel := redistest.StartSentinel(t, redistest.Start(t), "fgmaster")
	cluster := redistest.StartCluster(t, 3)
	for name, tc := range map[string]struct {
		cfg  ClientConfig
		opts Options
	}{
		"sentinel":             {ClientConfig{Addrs: []string{sentinel.Addr()}, MasterName: "fgmaster"}, Options{}},
		"cluster":              {ClientConfig{Addrs: cluster.Addrs()}, Options{}},
		"cluster-autopipeline": {ClientConfig{Addrs: cluster.Addrs()}, Options{AutoPipeline: true}},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			c := newTestClient(t, tc.cfg)
			a, b := newTestRedis(t, c, tc.opts), newTestRedis(t, c, tc.opts)
			t.Cleanup(a.Close)
			t.Cleanup(b.Close)
			ctx := context.Background()
			lim := window.Limit{Requests: 10, Window: time.Minute}
			const d = 30 * time.Second // running when Inspect reads, on a loaded box
			k := testKeys(t)
			nodes := map[string]bool{}
			for i := range 6 {
				key := k.Key("global", fmt.Sprint(i))
				if cc, ok := c.(*redis.ClusterClient); ok {
					nodes[nodeOf(t, cc, key)] = true
				}
				a1, b1, a2 := a.LeaseID(), b.LeaseID(), a.LeaseID()
				for j, step := range []struct {
					r    *Redis
					id   string
					want int
				}{{a, a1, 4}, {b, b1, 4}, {a, a2, 2}, {a, a1, 4}, {b, b.LeaseID(), 0}} {
					g := mustLease(t, step.r, LeaseCall{Key: key, Limit: lim, For: d, ID: step.id, Want: 4})
					if g.Slots != step.want || g.Count != 10 && j >= 2 {
						t.Fatalf("%s: grant %d: %+v; want %d slots", key, j, g, step.want)
					}
					if step.want == 0 && g.RetryAfter < d {
						t.Fatalf("%s: full: retry after %s, want at least the lease", key, g.RetryAfter)
					}
				}
				for j, want := range []int{2, 0} {
					g := mustLease(t, b, LeaseCall{Key: key, Limit: lim, For: d, BackID: b1, BackFrom: 3, BackTo: 4})
					if g.Returned != want || g.Count != 8 {
						t.Fatalf("%s: return %d: %+v; want %d returned, 8 left", key, j, g, want)
					}
				}
				st, err := Inspect(ctx, c, key, lim)
				if err != nil {
					t.Fatal(err)
				}
				held := map[string]int{}
				for _, l := range st.Leases {
					held[l.Sidecar] += l.Slots
				}
				if st.Count != 8 || held[a.ID()] != 6 || held[b.ID()] != 2 {
					t.Fatalf("%s: inspected %+v; want 6 slots held by %s and 2 by %s", key, st, a.ID(), b.ID())
				}
			}
			if _, ok := c.(*redis.ClusterClient); ok && len(nodes) < 2 {
				t.Fatalf("the keys fell on %d masters: the test needs them spread", len(nodes))
			}

			// A request's other hits, decided under a member id of the
			// caller's, leave nothing after Undo, on whichever node.
			hits := []window.Hit{hit(k.Key("user", "u1"), 5, time.Minute), hit(k.Key("user", "u2"), 5, time.Minute), hit(k.Key("user", "u3"), 5, time.Minute)}
			m := a.Member()
			if d, err := a.Decide(WithMember(ctx, m), hits); err != nil || !d.Allowed {
				t.Fatalf("Decide under a member: %+v, %v", d, err)
			}
			a.Undo(ctx, m, hits)
			for _, h := range hits {
				if n := c.ZCard(ctx, h.Key).Val(); n != 0 {
					t.Fatalf("%s holds %d entries after Undo, want 0", h.Key, n)
				}
			}
		})
	}
}
