package fallback

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashgate/flashgate/window/redisstore"
	"github.com/flashgate/flashgate/window/testclock"
)

// TestFleetRedisEmptied: when Redis comes back without the fleet's set
// (FLUSHALL, a restart), a beat that finds only itself announced still
// counts the members it knew until their announcements would have expired,
// an outage's length added; a member that left is not kept, and members
// that never beat again drop out a TTL later.
func TestFleetRedisEmptied(t *testing.T) {
	for _, tc := range []struct {
		name   string
		outage time.Duration
		empty  func(t *testing.T, admin *redis.Client)
	}{
		{"flushall", 0, func(t *testing.T, admin *redis.Client) {
			if err := admin.FlushAll(context.Background()).Err(); err != nil {
				t.Fatal(err)
			}
		}},
		{"restart after a long outage", 30 * time.Second, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, c := startRedis(t)
			admin := redis.NewClient(&redis.Options{Addr: s.Addr()})
			defer admin.Close()
			ctx := context.Background()
			key := testKeys(t).Fleet("flashsale")
			const ttl = 3 * time.Second
			clock := testclock.New()
			mk := func(id string) *Fleet { return newTestFleet(t, c, key, id, ttl) }
			a, b, d, e := mk("a"), mk("b"), mk("d"), mk("e")
			a.now = clock.Now
			for _, f := range []*Fleet{a, b, d, e} {
				if _, err := f.Beat(ctx); err != nil {
					t.Fatal(err)
				}
			}
			if n, _ := a.Beat(ctx); n != 4 {
				t.Fatalf("size after four joined = %d", n)
			}
			if tc.empty != nil {
				tc.empty(t, admin)
			} else {
				s.Kill()
				clock.Advance(tc.outage)
				if _, err := a.Beat(ctx); err == nil {
					t.Fatal("a beat answered with Redis killed")
				}
				s.Restart()
			}
			// The first beat that reaches the emptied Redis (go-redis may
			// refuse a while after a failed dial) counts the four a knew.
			n, err := a.Beat(ctx)
			for deadline := time.Now().Add(10 * time.Second); err != nil && time.Now().Before(deadline); {
				time.Sleep(50 * time.Millisecond)
				n, err = a.Beat(ctx)
			}
			if err != nil || n != 4 {
				t.Fatalf("a's first beat on the emptied Redis: %d, %v; want the four it knew", n, err)
			}
			if err := b.Leave(ctx); err != nil {
				t.Fatal(err)
			}
			if _, err := d.Beat(ctx); err != nil {
				t.Fatal(err)
			}
			if n, _ := a.Beat(ctx); n != 3 {
				t.Fatalf("size after b left = %d, want 3 (a, d announced; e still counted)", n)
			}
			// e never beats again; a and d beat every TTL/3: e drops out
			// once its announcement, shifted by the outage, expires.
			for range 4 {
				clock.Advance(ttl / 3)
				if _, err := d.Beat(ctx); err != nil {
					t.Fatal(err)
				}
				if _, err := a.Beat(ctx); err != nil {
					t.Fatal(err)
				}
			}
			if n, _ := a.Size(); n != 2 {
				t.Fatalf("size a TTL later = %d, want 2 (a, d)", n)
			}
		})
	}
}

// TestFleetRefusesNULID: an id beginning with NUL would read as a departed
// member's mark.
func TestFleetRefusesNULID(t *testing.T) {
	_, c := startRedis(t)
	if _, err := NewFleet(redisstore.NewHeartbeat(c), FleetOptions{Key: "k", ID: "\x00a"}); err == nil {
		t.Fatal("NewFleet took an id beginning with NUL")
	}
}

// TestFleet: sidecars announce themselves on one key and count each other;
// one that leaves drops out at once, one that stops beating within the TTL.
func TestFleet(t *testing.T) {
	_, c := startRedis(t)
	key := testKeys(t).Fleet("flashsale")
	ctx := context.Background()
	mk := func(id string) *Fleet {
		f, err := NewFleet(redisstore.NewHeartbeat(c), FleetOptions{Key: key, ID: id, TTL: 3 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	a, b, d := mk("a"), mk("b"), mk("c")
	if n, known := a.Size(); n != 1 || known {
		t.Fatalf("size before a beat = %d, %v; want 1, unknown", n, known)
	}
	for _, f := range []*Fleet{a, b, d} {
		if _, err := f.Beat(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if n, _ := d.Size(); n != 3 {
		t.Fatalf("size after three beats = %d", n)
	}
	if err := d.Leave(ctx); err != nil {
		t.Fatal(err)
	}
	if n, _ := a.Beat(ctx); n != 2 {
		t.Fatalf("size after one left = %d, want 2", n)
	}
	// b stops beating (killed): gone from a's count within the TTL (and a
	// beat, which a loaded machine may delay).
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	go a.Run(runCtx, nil)
	deadline := time.Now().Add(15 * time.Second)
	for {
		if n, _ := a.Size(); n == 1 {
			break
		}
		if time.Now().After(deadline) {
			n, _ := a.Size()
			t.Fatalf("size %d 15 seconds after b stopped beating (TTL 3s)", n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestFleetOutageKeepsCount: when Redis stops answering, the count stays
// what it was: the members that were beating are not counted out.
func TestFleetOutageKeepsCount(t *testing.T) {
	s, c := startRedis(t)
	key := testKeys(t).Fleet("flashsale")
	ctx := context.Background()
	// Announcements last long enough for a loaded machine's beats; a's own
	// clock then runs through the outage.
	const ttl = 5 * time.Second
	clock := testclock.New()
	var fleets []*Fleet
	for _, id := range []string{"a", "b", "c"} {
		f, err := NewFleet(redisstore.NewHeartbeat(c), FleetOptions{Key: key, ID: id, TTL: ttl})
		if err != nil {
			t.Fatal(err)
		}
		if id == "a" {
			f.now = clock.Now
		}
		if _, err := f.Beat(ctx); err != nil {
			t.Fatal(err)
		}
		fleets = append(fleets, f)
	}
	if n, err := fleets[0].Beat(ctx); err != nil || n != 3 {
		t.Fatalf("a's beat after all joined: %d, %v", n, err)
	}
	s.Stop()
	clock.Advance(3 * ttl) // three TTLs without a beat answering
	if _, err := fleets[0].Beat(ctx); err == nil {
		t.Fatal("a beat answered with Redis stopped")
	}
	if n, known := fleets[0].Size(); n != 3 || !known {
		t.Fatalf("size during the outage = %d (known %v), want the last count, 3", n, known)
	}
}

// TestFleetRestartsKeepSilentMembers: Redis restarts empty again and
// again while a member's beats never reach it (they fail through each
// restart); a member told of each restart keeps counting it, though its
// last announcement is older than a TTL, and its own beats never failed.
// Once the restarts stop, the silent member drops out a TTL later.
func TestFleetRestartsKeepSilentMembers(t *testing.T) {
	s, c := startRedis(t)
	ctx := context.Background()
	key := testKeys(t).Fleet("flashsale")
	const ttl = 3 * time.Second
	clock := testclock.New()
	a, b := newTestFleet(t, c, key, "a", ttl), newTestFleet(t, c, key, "b", ttl)
	a.now, b.now = clock.Now, clock.Now
	for _, f := range []*Fleet{b, a} {
		if _, err := f.Beat(ctx); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 4 { // 6 s of restarts, twice the TTL
		s.Restart()
		a.Restarted()
		clock.Advance(ttl / 2)
		if n, err := a.Beat(ctx); err != nil || n != 2 {
			t.Fatalf("a's beat after restart %d: %d, %v; want 2 (b kept)", i+1, n, err)
		}
	}
	for range 3 {
		clock.Advance(ttl / 3)
		if _, err := a.Beat(ctx); err != nil {
			t.Fatal(err)
		}
	}
	clock.Advance(ttl / 3)
	if n, err := a.Beat(ctx); err != nil || n != 1 {
		t.Fatalf("a TTL and a beat after the last restart: %d, %v; want 1 (b silent)", n, err)
	}
}

// newTestFleet returns member id of the fleet at key on c.
func newTestFleet(t *testing.T, c redis.Scripter, key, id string, ttl time.Duration) *Fleet {
	t.Helper()
	f, err := NewFleet(redisstore.NewHeartbeat(c), FleetOptions{Key: key, ID: id, TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	return f
}
