package daemon

import (
	"sync"
	"testing"
)

// servingLog records SetServing calls.
type servingLog struct {
	mu  sync.Mutex
	got []bool
}

func (l *servingLog) SetServing(v bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.got = append(l.got, v)
}

// TestReadyGate: health turns SERVING only once both the backend and the
// first config are ready, whichever comes first.
func TestReadyGate(t *testing.T) {
	for name, backendFirst := range map[string]bool{"backend first": true, "config first": false} {
		t.Run(name, func(t *testing.T) {
			l := &servingLog{}
			g := &readyGate{next: l}
			if backendFirst {
				g.SetServing(true)
				if len(l.got) != 0 {
					t.Fatalf("serving before the config: %v", l.got)
				}
				g.open()
			} else {
				g.open()
				if len(l.got) != 0 {
					t.Fatalf("serving before the backend: %v", l.got)
				}
				g.SetServing(true)
			}
			if len(l.got) != 1 || !l.got[0] {
				t.Fatalf("SetServing calls %v, want [true]", l.got)
			}
		})
	}
}
