package lease

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashgate/flashgate/window"
	"github.com/flashgate/flashgate/window/fallback"
	"github.com/flashgate/flashgate/window/redisstore"
	"github.com/flashgate/flashgate/window/redistest"
)

// TestHolderSlotsWrittenBackAfterEmptyRestart: a Redis that restarts
// empty forgets the slots of a window longer than the settle; the
// fallback's write-back writes the ones this sidecar used (and its running
// lease's) back at their leases' ends, before grants resume, so the window
// still counts them.
func TestHolderSlotsWrittenBackAfterEmptyRestart(t *testing.T) {
	t.Parallel()
	rs := redistest.Start(t)
	rc := redis.NewClient(&redis.Options{Addr: rs.Addr()})
	t.Cleanup(func() { _ = rc.Close() })
	c, err := redisstore.NewClient(redisstore.ClientConfig{Addrs: []string{rs.Addr()}, Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	r, err := redisstore.New(c, redisstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	fb, err := fallback.New(fallback.Options{WriteBack: r, Settle: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	h, err := New(fb.Watch(r), Options{Store: r, Gate: fb.Gate})
	if err != nil {
		t.Fatal(err)
	}
	fb.WriteBackAlso(h)
	t.Cleanup(func() { h.Close(); fb.Close(); r.Close(); _ = c.Close() })

	ctx := context.Background()
	lim := window.Limit{Requests: 10, Window: time.Minute}
	const d = time.Second
	hit := []window.Hit{leasedHit("fg:{wb}:g", lim, d)}
	t0, err := rc.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if dec, err := h.Decide(ctx, hit); err != nil || !dec.Allowed {
			t.Fatalf("check %d: %+v, %v", i, dec, err)
		}
	}
	before, err := rc.ZRange(ctx, hit[0].Key, 0, -1).Result()
	if err != nil || len(before) != 3 {
		t.Fatalf("before the restart the key holds %q (%v), want the 3 slots used", before, err)
	}

	rs.Restart()
	fb.Restarted() // as the client reports a new run id
	var after []redis.Z
	if !poll(10*time.Second, func() bool {
		after, _ = rc.ZRangeWithScores(ctx, hit[0].Key, 0, -1).Result()
		// The count follows the write-back's call: read them together.
		return len(after) >= 3 && fb.WriteBack().Outstanding >= 3
	}) {
		t.Fatalf("after the restart the key holds %v, want the 3 slots written back", after)
	}
	t1, err := rc.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{}
	for _, m := range before {
		want[m] = true
	}
	for _, z := range after {
		// No earlier than any use of the slot: its lease's end, on Redis's
		// clock (which the lease began after t0).
		at := time.UnixMicro(int64(z.Score))
		if !want[z.Member.(string)] || at.Before(t0.Add(d)) || at.After(t1.Add(d)) {
			t.Errorf("written back: %q at %v; want one of the used slots, scored in [%v, %v]", z.Member, at, t0.Add(d), t1.Add(d))
		}
	}
	if len(after) != 3 || fb.WriteBack().Outstanding < 3 {
		t.Fatalf("after the restart: %d entries, %d written back; want the 3 slots", len(after), fb.WriteBack().Outstanding)
	}

	// Once grants resume, they count the slots written back: at most 7
	// more in the window.
	admitted := 0
	poll(10*time.Second, func() bool {
		dec, err := h.Decide(ctx, hit)
		if err == nil && dec.Allowed {
			admitted++
		}
		return admitted > 0 && err == nil && !dec.Allowed
	})
	if admitted == 0 || admitted > lim.Requests-3 {
		t.Fatalf("%d admitted after the restart, want 1 to %d", admitted, lim.Requests-3)
	}
}
