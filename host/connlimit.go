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
// it accepted open, so that a flood of connections on one port cannot take
// the process's file descriptors from the other port, Redis or the probes.
// At the cap, a new connection is never left waiting in the kernel's
// backlog (where a probe would time out behind the flood):
//   - evict (the HTTP listeners of probes, scrapers and proxies, which
//     reconnect): the connection idle the longest is closed for it; idle is
//     between requests, or connected without a whole request yet (as told
//     by trackState). When every connection is inside a request, the new
//     one is closed instead.
//   - otherwise (the gRPC listener, whose long-lived Envoy connections a
//     newcomer must not push out): the new connection is closed at once.
//
// With maxPending (the gRPC listener), a connection counts against max
// only once its handshake is done (TLS, the HTTP/2 preface and settings:
// grpc-go clears the handshake deadline it set then, see SetDeadline);
// before that it is pending, and at most maxPending are: a new connection
// closes the one pending the longest. Sockets that never finish a
// handshake so cannot keep a client out, and at most max + maxPending
// connections are open. A handshake done with max established closes its
// connection.
//
// While draining (see drain), a connection the HTTP server closes as idle
// is kept open when a request has begun to arrive on it (bytes read since
// it turned idle, or waiting in the socket): the server answers that
// request, with Connection: close, and then closes it.
//
// Accept is called from one goroutine, as servers do; the connections may
// be closed from any.
type capListener struct {
	net.Listener
	max, maxPending int
	evict           bool
	now             func() time.Time
	// shed counts connections closed at the cap (evicted or refused, or
	// pending shed for a newer one).
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
	// active is written with l.mu held, and read without it by Read.
	active atomic.Bool
	// readIdle: bytes were read since the connection turned idle.
	readIdle atomic.Bool
	// read: bytes were read (and h2 is set, with l.mu held).
	read atomic.Bool
	// The fields below are guarded by l.mu.
	idleSince time.Time
	// pending: the handshake is not done (maxPending only).
	pending bool
	// kept: a close was put off while draining.
	kept bool
	// h2: the first bytes read were HTTP/2's preface.
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

// oldestLocked returns the connection for which ok holds that has been
// so the longest (idleSince), or nil.
func (l *capListener) oldestLocked(ok func(*capConn) bool) *capConn {
	var oldest *capConn
	for c := range l.conns {
		if ok(c) && (oldest == nil || c.idleSince.Before(oldest.idleSince)) {
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

// pendingConns returns how many connections have not done their handshake.
func (l *capListener) pendingConns() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.pending
}

// handshakeDone moves c from pending to established, or closes it when
// max connections are established already.
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

// trackState is an http.Server ConnState hook: it tells l which of its
// connections are inside a request, and so not to be evicted.
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
		// The server is done with cc: nothing will read it any more.
		due = cc.kept
	}
	l.mu.Unlock()
	if due {
		_ = cc.closeNow()
	}
}

// drain makes l put off closing idle connections on which a request has
// begun to arrive (see capListener).
func (l *capListener) drain() { l.draining.Store(true) }

// closeWhenDraining returns h answering the HTTP/1 requests it begins
// while l drains with Connection: close, so that the server closes their
// connections after them.
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

// closeQuiet closes the connections outside a request on which nothing
// has begun to arrive.
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

// http1Open returns how many connections are open that are not known to
// speak HTTP/2.
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

// closeAll closes every connection still open.
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

// Read implements net.Conn, noting that a request has begun to arrive on
// an idle connection.
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

// SetDeadline implements net.Conn. grpc-go sets a deadline on a new
// connection for its handshake and clears it once the handshake is done
// (or failed, and the connection closed): the clearing is what tells a
// pending connection from an established one.
func (c *capConn) SetDeadline(t time.Time) error {
	err := c.Conn.SetDeadline(t)
	if t.IsZero() && c.l.maxPending > 0 {
		c.l.handshakeDone(c)
	}
	return err
}

// Close closes the connection and releases its place; it is idempotent.
// While l drains, closing an idle connection on which a request has begun
// to arrive is put off once (see capListener): until the server closes it
// again, or reports it closed (StateClosed, see trackState) when the close
// put off was its own, as after a read failed or when keep-alives ended.
func (c *capConn) Close() error {
	if c.l.draining.Load() && c.keep() {
		return nil
	}
	return c.closeNow()
}

// closeNow closes the connection and releases its place.
func (c *capConn) closeNow() error {
	err := c.Conn.Close()
	c.release()
	return err
}

// keep reports whether this close is to be put off: the first close of an
// idle connection with a request arriving, while draining.
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

// release removes c from its listener's connections; it is idempotent.
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
