package host

import (
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// capListener is a net.Listener that keeps at most max of the connections
// it accepted open, so that a flood of connections on one port cannot take
// the process's file descriptors from the other port, Redis or the probes.
// At the cap, a new connection is never left waiting in the kernel's
// backlog (where a probe would time out behind the flood):
//   - evict (the HTTP listener of probes and scrapers, which reconnect):
//     the connection idle the longest is closed for it; idle is between
//     requests, or connected without a whole request yet (as told by
//     trackState). When every connection is inside a request, the new one
//     is closed instead.
//   - otherwise (the gRPC listener, whose long-lived Envoy connections a
//     newcomer must not push out): the new connection is closed at once.
//
// Accept is called from one goroutine, as servers do; the connections may
// be closed from any.
type capListener struct {
	net.Listener
	max   int
	evict bool
	now   func() time.Time
	// shed counts connections closed at the cap (evicted or refused).
	shed atomic.Uint64
	// mu guards conns and the state fields of its members.
	mu    sync.Mutex
	conns map[*capConn]struct{}
}

func newCapListener(l net.Listener, max int, evict bool) *capListener {
	return &capListener{Listener: l, max: max, evict: evict, now: time.Now, conns: map[*capConn]struct{}{}}
}

// capConn is a connection of a capListener; Close releases its place.
type capConn struct {
	net.Conn
	l    *capListener
	once sync.Once
	// active and idleSince are guarded by l.mu.
	active    bool
	idleSince time.Time
}

// Accept waits for a connection that fits under the cap.
func (l *capListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if cc := l.admit(c); cc != nil {
			return cc, nil
		}
	}
}

// admit makes room for c (or closes it) and returns it tracked, or nil.
func (l *capListener) admit(c net.Conn) *capConn {
	cc := &capConn{Conn: c, l: l}
	l.mu.Lock()
	var victim *capConn
	if len(l.conns) >= l.max {
		if l.evict {
			victim = l.oldestIdleLocked()
		}
		if victim == nil {
			l.mu.Unlock()
			l.shed.Add(1)
			_ = c.Close()
			return nil
		}
		delete(l.conns, victim)
	}
	cc.idleSince = l.now()
	l.conns[cc] = struct{}{}
	l.mu.Unlock()
	if victim != nil {
		l.shed.Add(1)
		_ = victim.Close()
	}
	return cc
}

// oldestIdleLocked returns the connection idle the longest, or nil.
func (l *capListener) oldestIdleLocked() *capConn {
	var oldest *capConn
	for c := range l.conns {
		if !c.active && (oldest == nil || c.idleSince.Before(oldest.idleSince)) {
			oldest = c
		}
	}
	return oldest
}

// open returns how many connections are open.
func (l *capListener) open() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.conns)
}

// trackState is an http.Server ConnState hook: it tells l which of its
// connections are inside a request, and so not to be evicted.
func (l *capListener) trackState(c net.Conn, st http.ConnState) {
	cc, ok := c.(*capConn)
	if !ok {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	switch st {
	case http.StateActive, http.StateHijacked:
		cc.active = true
	case http.StateIdle:
		cc.active, cc.idleSince = false, l.now()
	}
}

// Close closes the connection and releases its place; it is idempotent.
func (c *capConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() {
		c.l.mu.Lock()
		delete(c.l.conns, c)
		c.l.mu.Unlock()
	})
	return err
}
