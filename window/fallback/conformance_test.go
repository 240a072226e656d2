package fallback

import (
	"testing"

	"github.com/flashgate/flashgate/window/windowtest"
)

// TestConformance: a Fallback with nothing observed, alone in its fleet, is
// an exact in-process limiter.
func TestConformance(t *testing.T) {
	t.Parallel()
	windowtest.Run(t, windowtest.Factory{Name: "fallback-fleet-of-1", New: func(t *testing.T) windowtest.Store {
		f, err := New(Options{})
		if err != nil {
			t.Fatalf("New: %v", err)
		}
		return windowtest.Store{Limiter: f}
	}})
}
