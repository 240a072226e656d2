package fallback

import (
	"context"
	"fmt"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/flashgate/flashgate/window"
	"github.com/flashgate/flashgate/window/testclock"
)

var (
	errTimeout = fmt.Errorf("redis decide: %w", context.DeadlineExceeded)
	errRefused = fmt.Errorf("redis decide: %w", &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED})
)

// TestFallbackShare: alone, a fleet member enforces ceil(limit / N), or the
// rule's own share.
func TestFallbackShare(t *testing.T) {
	clock := testclock.New()
	n := 3
	f, err := New(Options{Now: clock.Now, Size: func() int { return n }})
	if err != nil {
		t.Fatal(err)
	}
	h := hit("k", 5, time.Second)
	for i := range 3 {
		d := mustDecide(t, f, h)
		if d.Allowed != (i < 2) {
			t.Fatalf("request %d of a 5/s rule in a fleet of 3: %+v, want 2 admitted", i, d)
		}
		if d.Limit != h.Limit {
			t.Fatalf("decision reports limit %s, want the rule's %s", d.Limit, h.Limit)
		}
	}
	own := hit("own", 5, time.Second)
	own.Tag = ruleShare(4)
	for i := range 5 {
		if d := mustDecide(t, f, own); d.Allowed != (i < 4) {
			t.Fatalf("request %d with local_share 4: %+v", i, d)
		}
	}
	n = 1
	alone := hit("alone", 5, time.Second)
	for i := range 6 {
		if d := mustDecide(t, f, alone); d.Allowed != (i < 5) {
			t.Fatalf("request %d in a fleet of 1: %+v", i, d)
		}
	}
}

// TestFallbackReset: an admission at a share reports the local log's reset,
// until its oldest local admission leaves; a denial none.
func TestFallbackReset(t *testing.T) {
	clock := testclock.New()
	f, err := New(Options{Now: clock.Now, Size: func() int { return 2 }})
	if err != nil {
		t.Fatal(err)
	}
	h := hit("k", 4, time.Second) // a share of 2
	if d := mustDecide(t, f, h); !d.Allowed || d.Remaining != 1 || d.Reset != time.Second {
		t.Fatalf("first = %+v, want allowed, 1 remaining of the share, reset 1s", d)
	}
	clock.Advance(300 * time.Millisecond)
	if d := mustDecide(t, f, h); !d.Allowed || d.Remaining != 0 || d.Reset != 700*time.Millisecond {
		t.Fatalf("second = %+v, want allowed, 0 remaining, reset 700ms", d)
	}
	if d := mustDecide(t, f, h); d.Allowed || d.Reset != 0 || d.RetryAfter != 700*time.Millisecond {
		t.Fatalf("third = %+v, want denied, reset 0, retry-after 700ms", d)
	}
}

// answer is a Limiter that always decides d: a backend whose decisions a
// test chooses, for the Fallback to observe through Watch.
type answer window.Decision

func (a answer) Decide(context.Context, []window.Hit) (window.Decision, error) {
	return window.Decision(a), nil
}

// TestFallbackSeed: what Redis last reported for a key holds for one
// window: a full key admits nothing locally until then, a partly used one
// shares out only the rest.
func TestFallbackSeed(t *testing.T) {
	clock := testclock.New()
	f, err := New(Options{Now: clock.Now, Size: func() int { return 3 }})
	if err != nil {
		t.Fatal(err)
	}
	full, part := hit("full", 5, time.Second), hit("part", 5, time.Second)
	observe := func(h window.Hit, d window.Decision) {
		t.Helper()
		if _, err := f.Watch(answer(d)).Decide(context.Background(), []window.Hit{h}); err != nil {
			t.Fatal(err)
		}
	}
	observe(full, window.Decision{Allowed: false, Index: 0, Count: 5, Source: window.SourceBackend})
	observe(part, window.Decision{Allowed: true, Index: 0, Count: 2, Source: window.SourceBackend})
	// A local answer teaches nothing.
	observe(part, window.Decision{Allowed: false, Index: 0, Count: 5, Source: window.SourceLocalFull})
	// Nor does a count that leaves the share as it is (ceil(4/3) = 2): not stored.
	observe(hit("quiet", 5, time.Second), window.Decision{Allowed: true, Index: 0, Count: 1, Source: window.SourceBackend})
	if _, _, ok := f.seeds.load(f.hash("quiet"), 5, clock.Now().UnixNano()); ok {
		t.Fatal("a count of 1 of 5 in a fleet of 3 was stored")
	}

	d := mustDecide(t, f, full)
	if d.Allowed || d.RetryAfter != time.Second {
		t.Fatalf("a key Redis reported full: %+v, want denied until the seed expires (1s)", d)
	}
	for i := range 2 { // ceil((5-2)/3) = 1
		if d := mustDecide(t, f, part); d.Allowed != (i == 0) {
			t.Fatalf("request %d on a key at 2 of 5: %+v, want 1 admitted", i, d)
		}
	}
	clock.Advance(time.Second)
	for i := range 3 { // the seed expired: the share, 2, less the one admitted at 0s (now out)
		if d := mustDecide(t, f, full); d.Allowed != (i < 2) {
			t.Fatalf("request %d after the seed expired: %+v", i, d)
		}
	}
}

// gate is a Limiter whose calls wait until it is opened: calls in flight.
type gate struct {
	open    chan struct{}
	entered chan struct{}
}

func (g *gate) Decide(ctx context.Context, _ []window.Hit) (window.Decision, error) {
	g.entered <- struct{}{}
	select {
	case <-g.open:
		return window.Decision{Allowed: true, Index: -1, ShadowIndex: -1}, nil
	case <-ctx.Done():
		return window.Decision{}, ctx.Err()
	}
}

// TestFallbackInFlight: calls this sidecar still has in flight to Redis
// for a key may yet be admitted there: each takes one from the key's local
// allowance, and a timed-out call's request holds a local place even when
// the fallback denies it. A burst whose calls all time out at once admits
// nothing locally beyond what its calls could not have taken.
func TestFallbackInFlight(t *testing.T) {
	clock := testclock.New()
	f, err := New(Options{Now: clock.Now, Size: func() int { return 1 }})
	if err != nil {
		t.Fatal(err)
	}
	g := &gate{open: make(chan struct{}), entered: make(chan struct{}, 16)}
	lim := f.Watch(g)
	h := hit("hot", 3, time.Second)
	ctx, cancel := context.WithCancel(context.Background())
	errs := make(chan error, 3)
	for range 3 {
		go func() {
			_, err := lim.Decide(ctx, []window.Hit{h})
			errs <- err
		}()
	}
	for range 3 {
		<-g.entered
	}
	// Three calls in flight for a 3/s key: nothing is left locally.
	if d, err := f.DecideAfter(context.Background(), []window.Hit{h}, errTimeout); err != nil || d.Allowed {
		t.Fatalf("with 3 calls in flight on a 3/s key: %+v, %v; want denied", d, err)
	}
	// Another key is not affected.
	if d := mustDecide(t, f, hit("cold", 3, time.Second)); !d.Allowed {
		t.Fatalf("another key: %+v", d)
	}
	cancel() // the calls time out together
	for range 3 {
		<-errs
	}
	// The denied timed-out request above holds a place: 2 are left.
	for i := range 3 {
		d, err := f.DecideAfter(context.Background(), []window.Hit{h}, errTimeout)
		if err != nil || d.Allowed != (i < 2) {
			t.Fatalf("timed-out request %d after the calls ended: %+v, %v", i, d, err)
		}
	}
	// A refused connection never reached Redis: a local denial records nothing.
	k := hit("refused", 1, time.Second)
	mustDecide(t, f, k)
	for range 3 {
		if d, _ := f.DecideAfter(context.Background(), []window.Hit{k}, errRefused); d.Allowed {
			t.Fatal("over the limit after refused connections")
		}
	}
	clock.Advance(time.Second)
	if d, _ := f.DecideAfter(context.Background(), []window.Hit{k}, errRefused); !d.Allowed {
		t.Fatalf("a window later: %+v; the refused denials were recorded", d)
	}
}
