package testclock

import (
	"sync"
	"testing"
	"time"
)

// TestClock: Now stays put until Advance moves it, by exactly d, also when
// advanced from several goroutines at once.
func TestClock(t *testing.T) {
	c := New()
	start := c.Now()
	if !c.Now().Equal(start) {
		t.Fatal("Now moved without Advance")
	}
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() { c.Advance(time.Second) })
	}
	wg.Wait()
	if got := c.Now().Sub(start); got != 8*time.Second {
		t.Fatalf("advanced by %v, want 8s", got)
	}
}
