package lease

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashgate/flashgate/window"
	"github.com/flashgate/flashgate/window/redisstore"
	"github.com/flashgate/flashgate/window/redistest"
)

// rule is a hit's Tag asking for a lease.
type rule struct{ d time.Duration }

func (r rule) LeaseFor() time.Duration { return r.d }

// recorder passes reservations to the real store and keeps the largest
// grant, so that a test reads what the holder asked for.
type recorder struct {
	*redisstore.Redis
	largest atomic.Int64
	calls   atomic.Int64
}

func (r *recorder) Lease(ctx context.Context, c redisstore.LeaseCall) (redisstore.Grant, error) {
	r.calls.Add(1)
	g, err := r.Redis.Lease(ctx, c)
	if err == nil && int64(g.Slots) > r.largest.Load() {
		r.largest.Store(int64(g.Slots))
	}
	return g, err
}

// sidecar is one process's stack on a shared redis-server: the store and
// a Holder over it.
type sidecar struct {
	store *recorder
	h     *Holder
}

func newSidecar(t *testing.T, addr string, o Options) *sidecar {
	t.Helper()
	c, err := redisstore.NewClient(redisstore.ClientConfig{Addrs: []string{addr}, Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	r, err := redisstore.New(c, redisstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	s := &sidecar{store: &recorder{Redis: r}}
	o.Store = s.store
	if s.h, err = New(r, o); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.h.Close(); r.Close(); _ = c.Close() })
	return s
}

// hammer runs callers goroutines per sidecar deciding hits (made per call)
// until d has passed, and returns every admission's span.
func hammer(scs []*sidecar, callers int, d time.Duration, hits func() []window.Hit) []span {
	stop := make(chan struct{})
	t := time.AfterFunc(d, func() { close(stop) })
	defer t.Stop()
	return hammerUntil(scs, callers, stop, hits)
}

// hammerUntil is hammer until stop is closed.
func hammerUntil(scs []*sidecar, callers int, stop <-chan struct{}, hits func() []window.Hit) []span {
	var (
		mu  sync.Mutex
		out []span
		wg  sync.WaitGroup
	)
	for _, s := range scs {
		for range callers {
			wg.Go(func() {
				for !closed(stop) {
					from := time.Now()
					dec, err := s.h.Decide(context.Background(), hits())
					to := time.Now()
					if err == nil && dec.Allowed {
						mu.Lock()
						out = append(out, span{from, to})
						mu.Unlock()
					}
				}
			})
		}
	}
	wg.Wait()
	return out
}

// closed reports whether ch is closed.
func closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

func leasedHit(key string, l window.Limit, d time.Duration) window.Hit {
	return window.Hit{Key: key, Rule: "global", Limit: l, Tag: rule{d}}
}

// TestHolderFleetExact: four sidecars, their clocks hours apart, hammer one
// leased key: no window holds more than the limit, and a lease is never
// more than the fair share.
func TestHolderFleetExact(t *testing.T) {
	t.Parallel()
	rs := redistest.Start(t)
	lim := window.Limit{Requests: 40, Window: 200 * time.Millisecond}
	const fleet = 4
	var scs []*sidecar
	for i, off := range []time.Duration{0, time.Hour, -time.Hour, 37 * time.Second} {
		_ = i
		scs = append(scs, newSidecar(t, rs.Addr(), Options{
			Size: func() (int, bool) { return fleet, true },
			Now:  func() time.Time { return time.Now().Add(off) },
		}))
	}
	adm := hammer(scs, 6, 1500*time.Millisecond, func() []window.Hit {
		return []window.Hit{leasedHit("fg:{lease}:global", lim, 20*time.Millisecond)}
	})
	checkInvariant(t, "four sidecars", adm, lim.Requests, lim.Window)
	var leases, admitted uint64
	for _, s := range scs {
		st := s.h.Stats()
		leases, admitted = leases+st.Leases, admitted+st.Admitted
		if n := s.store.largest.Load(); n > int64(lim.Requests/fleet) {
			t.Errorf("a lease of %d slots: more than the fair share %d", n, lim.Requests/fleet)
		}
	}
	if admitted != uint64(len(adm)) {
		t.Errorf("stats count %d admissions from leases, the callers saw %d", admitted, len(adm))
	}
	t.Logf("%d admissions from %d leases over 1.5s, the most in one window %d", len(adm), leases, mostInOneWindow(adm, lim.Window))
}

// TestHolderCrashedHolder: a holder that dies with slots reserved never
// uses them and never returns them: the others get only what remains until
// the slots leave the window, then the whole limit.
func TestHolderCrashedHolder(t *testing.T) {
	t.Parallel()
	rs := redistest.Start(t)
	lim := window.Limit{Requests: 10, Window: 600 * time.Millisecond}
	const d = 200 * time.Millisecond // long enough for a reservation's round trip on a loaded box
	alive := newSidecar(t, rs.Addr(), Options{})
	// The crashed one's reservation: made as its holder makes it, never
	// returned.
	crashed := newSidecar(t, rs.Addr(), Options{})
	g, err := crashed.store.Lease(context.Background(), redisstore.LeaseCall{Key: "fg:{c}:k", Limit: lim, For: d, ID: crashed.store.LeaseID(), Want: 7})
	if err != nil || g.Slots != 7 {
		t.Fatalf("crashed holder's lease: %+v, %v", g, err)
	}
	reserved := time.Now()
	hit := []window.Hit{leasedHit("fg:{c}:k", lim, d)}
	admit := func() int {
		n := 0
		for range 20 {
			if dec, err := alive.h.Decide(context.Background(), hit); err == nil && dec.Allowed {
				n++
			}
		}
		return n
	}
	if n := admit(); n > 3 {
		t.Fatalf("%d admitted beside 7 crashed slots: at most 3 fit", n)
	}
	// Once the crashed slots have left (their lease's end plus the window),
	// the whole limit is there again.
	time.Sleep(time.Until(reserved.Add(lim.Window + d + 10*time.Millisecond)))
	if n := admit(); n == 0 || n > lim.Requests {
		t.Fatalf("%d admitted after the crashed slots left: want 1 to %d", n, lim.Requests)
	}
}

// TestHolderIdleHoldsNothing: a lease that ends goes back whole but for
// what was used, and the holder forgets an idle key.
func TestHolderIdleHoldsNothing(t *testing.T) {
	t.Parallel()
	rs := redistest.Start(t)
	rc := redis.NewClient(&redis.Options{Addr: rs.Addr()})
	t.Cleanup(func() { _ = rc.Close() })
	lim := window.Limit{Requests: 100, Window: time.Minute}
	s := newSidecar(t, rs.Addr(), Options{})
	hit := []window.Hit{leasedHit("fg:{i}:k", lim, 30*time.Millisecond)}
	used := 0
	for range 50 {
		if dec, err := s.h.Decide(context.Background(), hit); err == nil && dec.Allowed {
			used++
		}
	}
	if used == 0 {
		t.Fatal("nothing admitted")
	}
	ok := poll(5*time.Second, func() bool {
		st := s.h.Stats()
		// A return's count follows its call: read them together.
		return st.Held == 0 && rc.ZCard(context.Background(), "fg:{i}:k").Val() == int64(used) && st.Reserved == uint64(used)+st.Returned
	})
	st := s.h.Stats()
	if !ok {
		t.Fatalf("after the lease ended: %+v, key holds %d entries; want no key held and %d entries", st, rc.ZCard(context.Background(), "fg:{i}:k").Val(), used)
	}
	if st.Reserved != uint64(used)+st.Returned {
		t.Errorf("reserved %d, returned %d, used %d: the slots do not add up", st.Reserved, st.Returned, used)
	}
}

// TestHolderReloadRevokes: a check under a lower limit closes the lease at
// once and returns its remainder; the next lease counts against the new
// limit.
func TestHolderReloadRevokes(t *testing.T) {
	t.Parallel()
	rs := redistest.Start(t)
	rc := redis.NewClient(&redis.Options{Addr: rs.Addr()})
	t.Cleanup(func() { _ = rc.Close() })
	s := newSidecar(t, rs.Addr(), Options{})
	const d = time.Second
	old := window.Limit{Requests: 100, Window: time.Second}
	for range 20 { // grows the lease past what it uses
		if _, err := s.h.Decide(context.Background(), []window.Hit{leasedHit("fg:{r}:k", old, d)}); err != nil {
			t.Fatal(err)
		}
	}
	before := s.h.Stats()
	lower := window.Limit{Requests: 25, Window: time.Second}
	n := 0
	for range 20 {
		if dec, err := s.h.Decide(context.Background(), []window.Hit{leasedHit("fg:{r}:k", lower, d)}); err == nil && dec.Allowed {
			n++
		}
	}
	if n != 5 {
		t.Fatalf("%d admitted under the lower limit after 20 under the old, want 5", n)
	}
	if s.h.Stats().Returned <= before.Returned && before.Reserved > 20 {
		t.Fatal("the old lease's remainder was not returned")
	}
	if c := rc.ZCard(context.Background(), "fg:{r}:k").Val(); c > 25 {
		t.Fatalf("the key holds %d entries over the new limit's 25", c)
	}
}

// TestHolderAllOrNothing: a request whose other hit is denied takes no
// slot from the lease; its leased hit is admitted only with the others.
func TestHolderAllOrNothing(t *testing.T) {
	t.Parallel()
	rs := redistest.Start(t)
	s := newSidecar(t, rs.Addr(), Options{})
	lim := window.Limit{Requests: 5, Window: time.Second}
	user := window.Limit{Requests: 1, Window: time.Second}
	hits := func(u string) []window.Hit {
		return []window.Hit{leasedHit("fg:{a}:g", lim, time.Second), {Key: "fg:{a}:u:" + u, Rule: "user", Limit: user}}
	}
	admitted := 0
	for _, u := range []string{"a", "a", "a", "b", "c", "c", "d", "e", "f", "g"} {
		if dec, err := s.h.Decide(context.Background(), hits(u)); err != nil {
			t.Fatal(err)
		} else if dec.Allowed {
			admitted++
		} else if dec.Index != 1 && admitted < 5 {
			t.Fatalf("denied by hit %d before the global limit was reached", dec.Index)
		}
	}
	if admitted != 5 || s.h.Stats().Admitted != 5 {
		t.Fatalf("%d admitted (%d from leases), want the global 5: a, b, c, d, e", admitted, s.h.Stats().Admitted)
	}
}

// TestHolderNoFleetNoLease: a sidecar that does not know its fleet takes no
// lease: the check fails and takes its failure mode.
func TestHolderNoFleetNoLease(t *testing.T) {
	t.Parallel()
	rs := redistest.Start(t)
	s := newSidecar(t, rs.Addr(), Options{Size: func() (int, bool) { return 1, false }})
	lim := window.Limit{Requests: 5, Window: time.Second}
	_, err := s.h.Decide(context.Background(), []window.Hit{leasedHit("fg:{n}:g", lim, 50*time.Millisecond)})
	if err == nil || s.store.calls.Load() != 0 {
		t.Fatalf("Decide without a fleet: %v after %d calls; want an error and no call", err, s.store.calls.Load())
	}
}

// poll reports whether cond held within d.
func poll(d time.Duration, cond func() bool) bool {
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		if cond() {
			return true
		}
	}
	return cond()
}

// TestHolderSkewedLoad: one sidecar takes most of the checks, two others a
// trickle: the busy one's leases stay within its fair share, so the quiet
// ones still get leases, and no window holds more than the limit. The
// load runs for at least 1.5 s and until each quiet sidecar has been
// admitted, within a deadline long enough for a starved box (a quiet
// caller that the scheduler barely runs meets few refills): a sidecar
// starved of leases is never admitted, however long the load.
func TestHolderSkewedLoad(t *testing.T) {
	t.Parallel()
	rs := redistest.Start(t)
	lim := window.Limit{Requests: 30, Window: 300 * time.Millisecond}
	const (
		fleet    = 3
		least    = 1500 * time.Millisecond
		deadline = 60 * time.Second
	)
	opts := Options{Size: func() (int, bool) { return fleet, true }}
	busy := newSidecar(t, rs.Addr(), opts)
	quiet := []*sidecar{newSidecar(t, rs.Addr(), opts), newSidecar(t, rs.Addr(), opts)}
	hit := func() []window.Hit { return []window.Hit{leasedHit("fg:{s}:global", lim, 20*time.Millisecond)} }
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		all     []span
		trickle [2]int
	)
	stop := make(chan struct{})
	began := time.Now()
	for i, q := range quiet {
		wg.Go(func() {
			for !closed(stop) {
				from := time.Now()
				d, err := q.h.Decide(context.Background(), hit())
				if err == nil && d.Allowed {
					mu.Lock()
					all, trickle[i] = append(all, span{from, time.Now()}), trickle[i]+1
					mu.Unlock()
				}
				time.Sleep(15 * time.Millisecond)
			}
		})
	}
	var hot []span
	wg.Go(func() { hot = hammerUntil([]*sidecar{busy}, 8, stop, hit) })
	served := poll(deadline, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return time.Since(began) >= least && trickle[0] > 0 && trickle[1] > 0
	})
	close(stop)
	wg.Wait()
	took := time.Since(began)
	all = append(all, hot...)
	checkInvariant(t, "skewed load", all, lim.Requests, lim.Window)
	if n := busy.store.largest.Load(); n > int64(lim.Requests/fleet) {
		t.Errorf("the busy sidecar took a lease of %d slots, over the fair share %d", n, lim.Requests/fleet)
	}
	for i, q := range quiet {
		if q.h.Stats().Leases == 0 || trickle[i] == 0 {
			t.Errorf("quiet sidecar %d: %d leases, %d admissions in %s: starved", i, q.h.Stats().Leases, trickle[i], took.Round(time.Millisecond))
		}
	}
	if !served {
		t.Errorf("a quiet sidecar was not admitted within %s", deadline)
	}
	used := float64(len(all)) / (took.Seconds() / lim.Window.Seconds() * float64(lim.Requests))
	t.Logf("%d admitted in %s (limit %d per %s, %.0f%% of it), the quiet ones %v", len(all), took.Round(time.Millisecond), lim.Requests, lim.Window, 100*used, trickle)
}
