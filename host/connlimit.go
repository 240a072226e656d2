package host

import (
	"bytes"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// capListener is a net.Listener that keeps at most max of the connections
// it accepted open, so a flood on one port cannot take the process's file
// descriptors; a newcomer never waits in the kernel's backlog. At the cap,
// with evict (HTTP listeners, whose clients reconnect) the connection idle
// the longest is closed for it, else (gRPC, whose Envoy connections must
// not be pushed out) the newcomer is. With maxPending a connection counts
// against max only once grpc-go clears its handshake deadline; at most
// maxPending wait before that, so stalled handshakes cannot keep a client
// out. While draining, an idle connection on which a request has begun to
// arrive stays open until the server answers it. Accept is called from one
// goroutine; connections may be closed from any.
type capListener struct {
	net.Listener
	max, maxPending int
	evict           bool
	now             func() time.Time
	// shed counts connections closed at the cap.
	shed      atomic.Uint64
	draining  atomic.Bool
	closeOnce sync.Once
	closeErr  error
	// mu guards conns, pending and the state fields of conns' members.
	mu      sync.Mutex
	conns   map[*capConn]struct{}
	pending int
}

func newCapListener(l net.Listener, max int, evict bool) *capListener {
	return &capListener{Listener: l, max: max, evict: evict, now: time.Now, conns: map[*capConn]struct{}{}}
}

// capConn is a connection of a capListener; Close releases its place.
type capConn struct {
	net.Conn
	l    *capListener
	once sync.Once
	// active is written with l.mu held and read by Read without it.
	active atomic.Bool
	// readIdle: bytes were read since it turned idle.
	readIdle atomic.Bool
	// read: bytes were read (h2 then set, with l.mu held).
	read atomic.Bool
	// The fields below are guarded by l.mu.
	idleSince time.Time
	// pending: the handshake is not done.
	pending bool
	// kept: a close was put off while draining.
	kept bool
	// h2: the first bytes were HTTP/2's preface.
	h2 bool
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
	switch {
	case l.maxPending > 0:
		if l.pending >= l.maxPending {
			if victim = l.oldestLocked(func(c *capConn) bool { return c.pending }); victim != nil {
				l.pending--
			}
		}
		cc.pending = true
		l.pending++
	case len(l.conns) >= l.max:
		if l.evict {
			victim = l.oldestLocked(func(c *capConn) bool { return !c.active.Load() })
		}
		if victim == nil {
			l.mu.Unlock()
			l.shed.Add(1)
			_ = c.Close()
			return nil
		}
	}
	if victim != nil {
		delete(l.conns, victim)
	}
	cc.idleSince = l.now()
	l.conns[cc] = struct{}{}
	l.mu.Unlock()
	if victim != nil {
		l.shed.Add(1)
		_ = victim.Conn.Close()
	}
	return cc
}

// oldestLocked returns the oldest connection for which ok holds, or nil.
func (l *capListener) oldestLocked(ok func(*capConn) bool) *capConn {
	var oldest *capConn
	for c := range l.conns {
		if ok(c) && (oldest == nil || c.idleSince.Before(oldest.idleSince)) {
			oldest = c
		}
	}
	return oldest
}

func (l *capListener) open() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.conns)
}

func (l *capListener) pendingConns() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.pending
}

// handshakeDone moves c to established, or closes it at max.
func (l *capListener) handshakeDone(c *capConn) {
	l.mu.Lock()
	if _, ok := l.conns[c]; !ok || !c.pending {
		l.mu.Unlock()
		return
	}
	c.pending = false
	l.pending--
	full := len(l.conns)-l.pending > l.max
	l.mu.Unlock()
	if full {
		l.shed.Add(1)
		_ = c.Close()
	}
}

// trackState is an http.Server ConnState hook telling l which connections
// are inside a request.
func (l *capListener) trackState(c net.Conn, st http.ConnState) {
	cc, ok := c.(*capConn)
	if !ok {
		return
	}
	l.mu.Lock()
	due := false
	switch st {
	case http.StateActive, http.StateHijacked:
		cc.active.Store(true)
	case http.StateIdle:
		cc.active.Store(false)
		cc.readIdle.Store(false)
		cc.idleSince = l.now()
	case http.StateClosed:
		due = cc.kept
	}
	l.mu.Unlock()
	if due {
		_ = cc.closeNow()
	}
}

// drain makes l put off closing idle connections a request began on.
func (l *capListener) drain() { l.draining.Store(true) }

// closeWhenDraining makes h answer HTTP/1 requests with Connection: close
// while l drains.
func (l *capListener) closeWhenDraining(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ProtoMajor == 1 && l.draining.Load() {
			w.Header().Set("Connection", "close")
		}
		h.ServeHTTP(w, r)
	})
}

// Close stops accepting; it is idempotent.
func (l *capListener) Close() error {
	l.closeOnce.Do(func() { l.closeErr = l.Listener.Close() })
	return l.closeErr
}

// closeQuiet closes connections outside a request with nothing arriving.
func (l *capListener) closeQuiet() {
	l.mu.Lock()
	var quiet []*capConn
	for c := range l.conns {
		if !c.active.Load() && !c.kept && !c.readIdle.Load() && !unread(c.Conn) {
			quiet = append(quiet, c)
		}
	}
	l.mu.Unlock()
	for _, c := range quiet {
		_ = c.Close()
	}
}

// http1Open returns how many open connections are not known to be HTTP/2.
func (l *capListener) http1Open() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for c := range l.conns {
		if !c.h2 {
			n++
		}
	}
	return n
}

func (l *capListener) closeAll() {
	l.mu.Lock()
	conns := make([]*capConn, 0, len(l.conns))
	for c := range l.conns {
		conns = append(conns, c)
	}
	l.mu.Unlock()
	for _, c := range conns {
		c.release()
		_ = c.Conn.Close()
	}
}

// Read implements net.Conn, noting a request arriving on an idle one.
func (c *capConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if n > 0 && c.l.evict {
		if !c.active.Load() {
			c.readIdle.Store(true)
		}
		if !c.read.Load() {
			c.l.mu.Lock()
			c.read.Store(true)
			c.h2 = bytes.HasPrefix(b[:n], []byte("PRI * HTTP/2"))
			c.l.mu.Unlock()
		}
	}
	return n, err
}

// SetDeadline implements net.Conn: grpc-go clearing the handshake
// deadline is what tells a pending connection from an established one.
func (c *capConn) SetDeadline(t time.Time) error {
	err := c.Conn.SetDeadline(t)
	if t.IsZero() && c.l.maxPending > 0 {
		c.l.handshakeDone(c)
	}
	return err
}

// Close closes the connection and releases its place, idempotently; while
// draining, closing an idle connection with a request arriving is put off
// once.
func (c *capConn) Close() error {
	if c.l.draining.Load() && c.keep() {
		return nil
	}
	return c.closeNow()
}

func (c *capConn) closeNow() error {
	err := c.Conn.Close()
	c.release()
	return err
}

// keep reports whether this close is to be put off.
func (c *capConn) keep() bool {
	c.l.mu.Lock()
	defer c.l.mu.Unlock()
	if _, ok := c.l.conns[c]; !ok || c.kept || c.active.Load() {
		return false
	}
	if c.readIdle.Load() || unread(c.Conn) {
		c.kept = true
		return true
	}
	return false
}

// release removes c from its listener; it is idempotent.
func (c *capConn) release() {
	c.once.Do(func() {
		c.l.mu.Lock()
		if _, ok := c.l.conns[c]; ok {
			delete(c.l.conns, c)
			if c.pending {
				c.l.pending--
			}
		}
		c.l.mu.Unlock()
	})
}
