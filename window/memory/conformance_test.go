package memory

import (
	"testing"

	"github.com/flashgate/flashgate/window/windowtest"
)

// TestConformance runs the table every limiter passes.
func TestConformance(t *testing.T) {
	t.Parallel()
	windowtest.Run(t, windowtest.Factory{Name: "memory", New: func(t *testing.T) windowtest.Store {
		m, err := New(Options{})
		if err != nil {
			t.Fatalf("New: %v", err)
		}
		return windowtest.Store{Limiter: m}
	}})
}
