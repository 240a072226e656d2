package guard

import (
	"testing"

	"github.com/flashgate/flashgate/window"

	"github.com/flashgate/flashgate/window/memory"
	"github.com/flashgate/flashgate/window/testclock"
	"github.com/flashgate/flashgate/window/windowtest"
)

func newTestMemory(t testing.TB, clock *testclock.Clock, maxKeys int) *memory.Memory {
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

// ruleBan is a hit's Tag naming its rule's penalty box.
type ruleBan struct{ b *window.Ban }

func (r ruleBan) PenaltyBox() *window.Ban { return r.b }

// asking returns h with a rule that asks for the Guard's penalty box
// ("ban: {}"): a hit whose rule does not ask is never banned.
func asking(h window.Hit) window.Hit {
	h.Tag = ruleBan{&window.Ban{}}
	return h
}
