package guard

import (
	"testing"

	"github.com/flashgate/flashgate/window/memory"
	"github.com/flashgate/flashgate/window/testclock"
	"github.com/flashgate/flashgate/window/windowtest"
)

// stepClock is the injected clock of the tests.
type stepClock = testclock.Clock

func newStepClock() *stepClock { return testclock.New() }

func newTestMemory(t testing.TB, clock *stepClock, maxKeys int) *memory.Memory {
	t.Helper()
	m, err := memory.New(memory.Options{Now: clock.Now, MaxKeys: maxKeys})
	if err != nil {
		t.Fatalf("memory.New: %v", err)
	}
	return m
}

var (
	hit        = windowtest.Hit
	mustDecide = windowtest.MustDecide
)
