package guard

import (
	"context"
	"errors"
	"fmt"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/flashgate/flashgate/window"
	"github.com/flashgate/flashgate/window/memory"
	"github.com/flashgate/flashgate/window/testclock"
)

// scripted is a Limiter whose outcomes the test sets: each call advances
// the clock by took and fails with err (nil: Memory decides). It stands for
// a backend that is slow or failing in a way a real Redis cannot be made to
// be on cue; the Redis tests below use a real one.
type scripted struct {
	clock *testclock.Clock
	mem   *memory.Memory
	took  time.Duration
	err   error
}

func (s *scripted) Decide(ctx context.Context, hits []window.Hit) (window.Decision, error) {
	s.clock.Advance(s.took)
	if s.err != nil {
		return window.Decision{}, s.err
	}
	return s.mem.Decide(ctx, hits)
}

var (
	errTimeout = fmt.Errorf("redis decide: %w", context.DeadlineExceeded)
	errRefused = fmt.Errorf("redis decide: %w", &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED})
)

func newTestBreaker(t *testing.T) (*Breaker, *scripted, *testclock.Clock) {
	t.Helper()
	clock := testclock.New()
	s := &scripted{clock: clock, mem: newTestMemory(t, clock, 0)}
	b, err := NewBreaker(s, BreakerOptions{Now: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	return b, s, clock
}

// TestBreakerSlowIsNotDead: timeouts on a minority of calls (a slow moment
// of a healthy Redis) fail those calls only; the breaker stays closed.
func TestBreakerSlowIsNotDead(t *testing.T) {
	b, s, clock := newTestBreaker(t)
	ctx := context.Background()
	for i := range 500 {
		s.err = nil
		if i%5 == 0 { // a fifth of the replies are late
			s.err = errTimeout
		}
		_, err := b.Decide(ctx, []window.Hit{hit(fmt.Sprint("k", i), 5, time.Second)})
		if errors.Is(err, window.ErrBreakerOpen) {
			t.Fatalf("call %d: the breaker opened on a 20%% timeout rate", i)
		}
		clock.Advance(3 * time.Millisecond)
	}
	if b.Opened() != 0 || b.Open() {
		t.Fatalf("opened %d times", b.Opened())
	}
}

// TestBreakerOpensOnRate: most calls timing out opens it; after the
// cooldown one probe goes through, and its success closes it.
func TestBreakerOpensOnRate(t *testing.T) {
	b, s, clock := newTestBreaker(t)
	ctx := context.Background()
	h := []window.Hit{hit("k", 1000, time.Second)}
	s.err = errTimeout
	// A burst of failures within one tenth of the window (a late pipelined
	// batch) does not open it: failures must be sustained.
	for i := range 50 {
		if _, err := b.Decide(ctx, h); errors.Is(err, window.ErrBreakerOpen) {
			t.Fatalf("opened at call %d of a burst within 50µs", i)
		}
		clock.Advance(time.Microsecond)
	}
	opened := time.Duration(-1)
	for i := range 100 { // a call every 10ms, all failing
		if _, err := b.Decide(ctx, h); errors.Is(err, window.ErrBreakerOpen) {
			opened = time.Duration(i) * 10 * time.Millisecond
			break
		}
		clock.Advance(10 * time.Millisecond)
	}
	if opened < 0 || opened > time.Second {
		t.Fatalf("opened after %s of sustained timeouts, want within the 1s window", opened)
	}
	t.Logf("opened after %s of sustained timeouts", opened)
	s.err = nil
	if _, err := b.Decide(ctx, h); !errors.Is(err, window.ErrBreakerOpen) {
		t.Fatalf("within the cooldown: %v, want window.ErrBreakerOpen", err)
	}
	clock.Advance(DefaultBreakerCooldown)
	if _, err := b.Decide(ctx, h); err != nil {
		t.Fatalf("the probe: %v", err)
	}
	if b.Open() {
		t.Fatal("a successful probe left the breaker open")
	}
	// Closed again, and the window forgotten: one timeout does not reopen.
	s.err = errTimeout
	_, _ = b.Decide(ctx, h)
	s.err = nil
	if _, err := b.Decide(ctx, h); err != nil {
		t.Fatalf("after one timeout on a fresh window: %v", err)
	}
}

// TestBreakerConnectionErrors: Redis refusing connections is dead, not
// slow: a few in a row open it at once, whatever the rate; a failed probe
// opens it again.
func TestBreakerConnectionErrors(t *testing.T) {
	b, s, clock := newTestBreaker(t)
	ctx := context.Background()
	h := []window.Hit{hit("k", 1000, time.Second)}
	for range 50 { // a healthy history: the rate alone would not open it
		if _, err := b.Decide(ctx, h); err != nil {
			t.Fatal(err)
		}
	}
	s.err = errRefused
	for i := range DefaultBreakerConnFailures {
		if _, err := b.Decide(ctx, h); errors.Is(err, window.ErrBreakerOpen) {
			t.Fatalf("open after %d connection errors", i)
		}
	}
	if _, err := b.Decide(ctx, h); !errors.Is(err, window.ErrBreakerOpen) {
		t.Fatalf("after %d connection errors in a row: %v, want window.ErrBreakerOpen", DefaultBreakerConnFailures, err)
	}
	clock.Advance(DefaultBreakerCooldown)
	if _, err := b.Decide(ctx, h); !errors.Is(err, errRefused) {
		t.Fatalf("the probe: %v, want the backend's error", err)
	}
	if _, err := b.Decide(ctx, h); !errors.Is(err, window.ErrBreakerOpen) {
		t.Fatalf("after a failed probe: %v, want window.ErrBreakerOpen", err)
	}
}

// TestBreakerCallerGaveUp: calls whose caller gave up (Envoy's timeout) and
// invalid hits say nothing of the backend.
func TestBreakerCallerGaveUp(t *testing.T) {
	b, s, _ := newTestBreaker(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	s.err = fmt.Errorf("redis decide: %w", context.Canceled)
	for range 100 {
		_, _ = b.Decide(ctx, []window.Hit{hit("k", 5, time.Second)})
	}
	s.err = nil
	for range 100 {
		_, _ = b.Decide(context.Background(), []window.Hit{{Key: "k"}}) // invalid
	}
	if b.Opened() != 0 {
		t.Fatal("the breaker opened on calls that tell nothing of the backend")
	}
}

// TestBudgetFollowsLatency: the budget starts at Min, grows with a slower
// backend (never above Max), and shrinks back when it is fast again.
func TestBudgetFollowsLatency(t *testing.T) {
	clock := testclock.New()
	s := &scripted{clock: clock, mem: newTestMemory(t, clock, 0)}
	b, err := NewBudget(s, BudgetOptions{Min: 25 * time.Millisecond, Max: 40 * time.Millisecond, Now: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	if got := b.Current(); got != 40*time.Millisecond {
		t.Fatalf("budget before any call = %s, want Max (nothing known yet)", got)
	}
	h := []window.Hit{hit("k", 1_000_000, time.Hour)}
	s.took = time.Millisecond
	for range 50 {
		mustDecide(t, b, h...)
	}
	if got := b.Current(); got != 25*time.Millisecond {
		t.Fatalf("budget for a 1ms backend = %s, want Min", got)
	}
	s.took = 12 * time.Millisecond // jittery: 12ms then 2ms
	for i := range 50 {
		if i%2 == 1 {
			s.took = 2 * time.Millisecond
		} else {
			s.took = 12 * time.Millisecond
		}
		mustDecide(t, b, h...)
	}
	if got := b.Current(); got <= 25*time.Millisecond || got > 40*time.Millisecond {
		t.Fatalf("budget for a jittery 2–12ms backend = %s, want above Min, at most Max", got)
	}
	s.took = 100 * time.Millisecond
	for range 20 {
		mustDecide(t, b, h...)
	}
	if got := b.Current(); got != 40*time.Millisecond {
		t.Fatalf("budget for a 100ms backend = %s, want Max", got)
	}
	s.took = time.Millisecond
	for range 200 {
		mustDecide(t, b, h...)
	}
	if got := b.Current(); got != 25*time.Millisecond {
		t.Fatalf("budget once fast again = %s, want Min", got)
	}
	if _, err := NewBudget(s, BudgetOptions{Min: 10 * time.Millisecond, Max: 5 * time.Millisecond}); err == nil {
		t.Fatal("NewBudget accepted max < min")
	}
}

// TestBreakerLateFailureKeepsProbe: a call let through before the breaker
// opened that fails while a probe is in flight does not cancel the probe
// nor extend the cooldown: the probe's success closes the breaker.
func TestBreakerLateFailureKeepsProbe(t *testing.T) {
	b, _, clock := newTestBreaker(t)
	ctx := context.Background()
	early, ok := b.allow() // let through while closed; it will fail late
	if !ok || early != 0 {
		t.Fatalf("allow while closed = %d, %v", early, ok)
	}
	for range DefaultBreakerConnFailures {
		b.record(ctx, errRefused, 0)
	}
	if !b.Open() {
		t.Fatal("not open after connection errors")
	}
	clock.Advance(DefaultBreakerCooldown)
	probe, ok := b.allow()
	if !ok || probe == 0 {
		t.Fatalf("no probe after the cooldown: %d, %v", probe, ok)
	}
	b.record(ctx, errRefused, early) // the early call fails now
	if _, ok := b.allow(); ok {
		t.Fatal("a second probe while the first is in flight")
	}
	b.record(ctx, nil, probe)
	if b.Open() {
		t.Fatal("the probe's success did not close the breaker: the late failure cancelled it")
	}
}

// TestBreakerReset: Reset closes an open breaker at once (the backend was
// found answering elsewhere) and tells OnChange.
func TestBreakerReset(t *testing.T) {
	b, s, _ := newTestBreaker(t)
	s.err = errRefused
	for range DefaultBreakerConnFailures {
		b.Decide(context.Background(), nil)
	}
	if !b.Open() {
		t.Fatal("the breaker did not open on connection errors")
	}
	s.err = nil
	b.Reset()
	if b.Open() {
		t.Fatal("open after Reset")
	}
	if _, err := b.Decide(context.Background(), nil); err != nil {
		t.Fatalf("a call after Reset: %v", err)
	}
}
