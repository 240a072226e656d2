package host

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"sync/atomic"
	"testing"
	"time"
)

// eventually bounds how long a test waits for a connection to be handled.
const eventually = 30 * time.Second

// capHarness dials a capListener on loopback and accepts on it.
type capHarness struct {
	t        *testing.T
	l        *capListener
	accepted chan net.Conn
}

func newCapHarness(t *testing.T, max, maxPending int, evict bool) *capHarness {
	t.Helper()
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h := &capHarness{t: t, l: newCapListener(raw, max, evict), accepted: make(chan net.Conn, 16)}
	h.l.maxPending = maxPending
	go func() {
		for {
			c, err := h.l.Accept()
			if err != nil {
				close(h.accepted)
				return
			}
			h.accepted <- c
		}
	}()
	t.Cleanup(func() { h.l.Close() })
	return h
}

// dial connects a client and returns it with the server's side, or a nil
// server side when the listener closed it at the cap.
func (h *capHarness) dial() (client, server net.Conn) {
	h.t.Helper()
	c, err := net.Dial("tcp", h.l.Addr().String())
	if err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(func() { c.Close() })
	deadline := time.Now().Add(eventually)
	for time.Now().Before(deadline) {
		select {
		case s := <-h.accepted:
			return c, s
		default:
		}
		// Not handed out (yet): closed at the cap?
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Millisecond))
		if _, err := c.Read(make([]byte, 1)); !isTimeout(err) {
			return c, nil
		}
	}
	h.t.Fatal("a connection was neither handed out nor closed")
	return nil, nil
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// closedByPeer reports whether the client connection c reads EOF (or a
// reset) within eventually.
func closedByPeer(t *testing.T, c net.Conn) bool {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(eventually))
	_, err := c.Read(make([]byte, 1))
	return err != nil && !isTimeout(err)
}

func TestCapListenerEvictsTheOldestIdle(t *testing.T) {
	h := newCapHarness(t, 2, 0, true)
	c1, s1 := h.dial()
	c2, s2 := h.dial()
	if s1 == nil || s2 == nil {
		t.Fatal("connections under the cap were closed")
	}
	h.l.trackState(s1, http.StateActive) // inside a request: kept
	h.l.trackState(s2, http.StateIdle)
	c3, s3 := h.dial()
	if s3 == nil {
		t.Fatal("a new connection at the cap was closed while one was idle")
	}
	if !closedByPeer(t, c2) {
		t.Error("the idle connection was not evicted")
	}
	// Every connection inside a request: the new one is closed instead.
	h.l.trackState(s3, http.StateActive)
	if _, s4 := h.dial(); s4 != nil {
		t.Error("a new connection was handed out while every one was inside a request")
	}
	// The first one idles: the next newcomer takes its place.
	h.l.trackState(s1, http.StateIdle)
	if _, s5 := h.dial(); s5 == nil {
		t.Error("a new connection was closed while one was idle")
	}
	if !closedByPeer(t, c1) {
		t.Error("the connection that went idle was not evicted")
	}
	if n := h.l.open(); n != 2 {
		t.Errorf("%d open, want 2", n)
	}
	if n := h.l.shed.Load(); n != 3 {
		t.Errorf("%d shed, want 3", n)
	}
	_ = c3
}

func TestCapListenerRefusesAtTheCap(t *testing.T) {
	h := newCapHarness(t, 1, 0, false)
	_, s1 := h.dial()
	if s1 == nil {
		t.Fatal("the first connection was closed")
	}
	if _, s2 := h.dial(); s2 != nil {
		t.Fatal("a connection past the cap was handed out")
	}
	// Closing one (twice: idempotent) makes room for one.
	s1.Close()
	s1.Close()
	if _, s3 := h.dial(); s3 == nil {
		t.Fatal("no room after a connection closed")
	}
	if n, shed := h.l.open(), h.l.shed.Load(); n != 1 || shed != 1 {
		t.Errorf("%d open, %d shed; want 1 and 1", n, shed)
	}
}

// TestCapListenerShedsTheOldestPending: with maxPending, connections in
// their handshake do not count against max; at maxPending a new one
// sheds the one pending the longest; a handshake done (the deadline
// cleared) makes a connection established, and one done with max
// established closes it.
func TestCapListenerShedsTheOldestPending(t *testing.T) {
	h := newCapHarness(t, 1, 2, false)
	c1, s1 := h.dial()
	_, s2 := h.dial()
	if s1 == nil || s2 == nil {
		t.Fatal("a pending connection under maxPending was closed")
	}
	_, s3 := h.dial()
	if s3 == nil {
		t.Fatal("the newest pending connection was closed")
	}
	if !closedByPeer(t, c1) {
		t.Error("the connection pending the longest was not shed for the newest")
	}
	// s2 finishes its handshake: established, within max 1.
	if err := s2.SetDeadline(time.Time{}); err != nil {
		t.Fatal(err)
	}
	if p, n := h.l.pendingConns(), h.l.open(); p != 1 || n != 2 {
		t.Errorf("%d pending, %d open; want 1 and 2", p, n)
	}
	// s3 finishes too, with max established: closed.
	_ = s3.SetDeadline(time.Time{})
	if p, n, shed := h.l.pendingConns(), h.l.open(), h.l.shed.Load(); p != 0 || n != 1 || shed != 2 {
		t.Errorf("%d pending, %d open, %d shed; want 0, 1 and 2", p, n, shed)
	}
	s2.Close()
	if p, n := h.l.pendingConns(), h.l.open(); p != 0 || n != 0 {
		t.Errorf("after closing: %d pending, %d open", p, n)
	}
}

// TestCapListenerDrainClosesWhatTheServerGaveUp: while draining, a close
// the HTTP server makes itself, here after the rest of a request begun on
// a keep-alive connection did not come within ReadHeaderTimeout, is not
// put off for good: the connection closes and its place is released, so a
// drain waiting for the connections to close does not wait for its
// deadline.
func TestCapListenerDrainClosesWhatTheServerGaveUp(t *testing.T) {
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := newCapListener(raw, 8, true)
	srv := &http.Server{
		Handler:           http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}),
		ReadHeaderTimeout: 100 * time.Millisecond,
		ConnState:         l.trackState,
	}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })

	_, br := halfRequest(t, l.Addr().String(), l.drain)
	// The server may answer (408) before it closes.
	if _, err := io.Copy(io.Discard, br); err != nil && isTimeout(err) {
		t.Error("a connection the server gave up on while draining stayed open")
	}
	deadline := time.Now().Add(eventually)
	for l.open() != 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := l.open(); n != 0 {
		t.Errorf("%d connections open after the server closed its only one", n)
	}
}

// TestDrainAnswersARequestBegunAsTheConnectionTurnedIdle: a request that
// has begun to arrive on a keep-alive connection whose server goroutine
// turns it idle only after the drain began (held here in the ConnState
// hook) is read and answered with Connection: close, and the drain then
// returns without its deadline.
func TestDrainAnswersARequestBegunAsTheConnectionTurnedIdle(t *testing.T) {
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := newCapListener(raw, 8, true)
	srv := newHTTPServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "ok")
	}), l, false)
	idle, release := make(chan struct{}), make(chan struct{})
	var hold atomic.Bool
	hold.Store(true)
	srv.ConnState = func(c net.Conn, st http.ConnState) {
		l.trackState(c, st)
		if st == http.StateIdle && hold.CompareAndSwap(true, false) {
			close(idle)
			<-release
		}
	}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })
	f := &front{what: "test", lis: l, srv: srv}

	c, br := halfRequest(t, l.Addr().String(), func() {})
	<-idle
	drained := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), eventually)
		defer cancel()
		drained <- f.drain(ctx)
	}()
	// The drain has begun once the listener refuses.
	deadline := time.Now().Add(eventually)
	for time.Now().Before(deadline) {
		d, err := net.Dial("tcp", l.Addr().String())
		if err != nil {
			break
		}
		d.Close()
		time.Sleep(10 * time.Millisecond)
	}
	close(release)
	if _, err := io.WriteString(c, halfReq[10:]); err != nil {
		t.Fatalf("the rest of the request: %v", err)
	}
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("the request begun before the drain: %v", err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || string(b) != "ok" || !resp.Close {
		t.Errorf("the request begun before the drain: %d %q close %v, want answered with Connection: close", resp.StatusCode, b, resp.Close)
	}
	if err := <-drained; err != nil {
		t.Errorf("drain: %v", err)
	}
}

// halfReq is the request halfRequest sends, the second time in part.
const halfReq = "GET /x HTTP/1.1\r\nHost: a\r\n\r\n"

// halfRequest dials addr, has halfReq answered on the connection, calls
// then, and writes halfReq's first 10 bytes on it again; it returns the
// connection (closed at the test's end) and its reader.
func halfRequest(t *testing.T, addr string, then func()) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	_ = c.SetDeadline(time.Now().Add(eventually))
	br := bufio.NewReader(c)
	if _, err := io.WriteString(c, halfReq); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	then()
	if _, err := io.WriteString(c, halfReq[:10]); err != nil {
		t.Fatal(err)
	}
	return c, br
}
