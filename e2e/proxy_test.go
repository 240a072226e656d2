package e2e

import (
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// proxy is a TCP proxy on loopback in front of a Redis server. It can delay
// every chunk it forwards towards Redis, blackhole (accept and read but
// forward nothing) and counts connections and bytes.
type proxy struct {
	ln     net.Listener
	target string

	delay     atomic.Int64 // ns added before forwarding each chunk to Redis
	blackhole atomic.Bool
	jitter    atomic.Pointer[jitter] // delays some replies; nil: none

	Conns    atomic.Int64 // connections accepted
	BytesUp  atomic.Int64 // bytes read from clients (what flashgate sent)
	BytesFwd atomic.Int64 // bytes forwarded to Redis

	mu     sync.Mutex // guards open and closed
	open   map[net.Conn]struct{}
	closed bool
}

// startProxy listens on a free loopback port, forwarding to target, and
// closes everything in cleanup.
func startProxy(t testing.TB, target string) *proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("proxy listen: %v", err)
	}
	p := &proxy{ln: ln, target: target, open: map[net.Conn]struct{}{}}
	go p.serve()
	t.Cleanup(p.Close)
	return p
}

// Addr is the proxy's address.
func (p *proxy) Addr() string { return p.ln.Addr().String() }

// SetDelay makes every chunk towards Redis wait d (0: none).
func (p *proxy) SetDelay(d time.Duration) { p.delay.Store(int64(d)) }

// jitter delays a share of the chunks Redis sends back by lo to hi.
type jitter struct {
	share  float64
	lo, hi time.Duration
}

// SetReplyJitter delays a share (0..1) of the reply chunks from Redis by a
// random lo..hi each; later replies on the same connection wait behind a
// delayed one, as on a real TCP connection. share 0 turns it off.
func (p *proxy) SetReplyJitter(share float64, lo, hi time.Duration) {
	if share <= 0 {
		p.jitter.Store(nil)
		return
	}
	p.jitter.Store(&jitter{share: share, lo: lo, hi: hi})
}

// SetBlackhole makes the proxy swallow everything clients send.
func (p *proxy) SetBlackhole(on bool) { p.blackhole.Store(on) }

// CloseConns drops every open connection.
func (p *proxy) CloseConns() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.open {
		c.Close()
	}
}

// Close stops the proxy and drops its connections.
func (p *proxy) Close() {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	p.ln.Close()
	p.CloseConns()
}

func (p *proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		c.Close()
		return false
	}
	p.open[c] = struct{}{}
	return true
}

func (p *proxy) untrack(c net.Conn) {
	p.mu.Lock()
	delete(p.open, c)
	p.mu.Unlock()
	c.Close()
}

func (p *proxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.Conns.Add(1)
		go p.handle(c)
	}
}

func (p *proxy) handle(client net.Conn) {
	if !p.track(client) {
		return
	}
	defer p.untrack(client)
	server, err := net.Dial("tcp", p.target)
	if err != nil {
		return
	}
	if !p.track(server) {
		return
	}
	defer p.untrack(server)
	go func() {
		// Redis → client, each chunk possibly delayed (SetReplyJitter).
		defer client.Close()
		buf := make([]byte, 32<<10)
		for {
			n, err := server.Read(buf)
			if n > 0 {
				if j := p.jitter.Load(); j != nil && rand.Float64() < j.share {
					time.Sleep(j.lo + time.Duration(rand.Int64N(int64(j.hi-j.lo)+1)))
				}
				if _, werr := client.Write(buf[:n]); werr != nil {
					return
				}
			}
			if err != nil {
				return
			}
		}
	}()
	// Client → Redis: a reader stamps each chunk on arrival, so that the
	// added latency delays every chunk by the same amount without
	// serialising them, and BytesUp counts what the client sent even while
	// chunks wait.
	type chunk struct {
		at   time.Time
		data []byte
	}
	chunks := make(chan chunk, 4096)
	go func() {
		defer close(chunks)
		for {
			buf := make([]byte, 32<<10)
			n, err := client.Read(buf)
			if n > 0 {
				p.BytesUp.Add(int64(n))
				chunks <- chunk{time.Now(), buf[:n]}
			}
			if err != nil {
				return
			}
		}
	}()
	defer func() {
		go func() { // unblock the reader
			for range chunks {
			}
		}()
	}()
	for c := range chunks {
		if d := time.Duration(p.delay.Load()); d > 0 {
			time.Sleep(time.Until(c.at.Add(d)))
		}
		if p.blackhole.Load() {
			continue
		}
		if _, err := server.Write(c.data); err != nil {
			return
		}
		p.BytesFwd.Add(int64(len(c.data)))
	}
	server.Close()
}
