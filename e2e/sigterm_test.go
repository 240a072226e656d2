package e2e

import (
	"context"
	"net"
	"net/http"
	"sync"
	"syscall"
	"testing"
	"time"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/flashgate/flashgate/window/redistest"
)

// headersLog notes when the HTTP/2 HEADERS frames written on one worker's
// connections had reached the kernel: each opens a Check.
type headersLog struct {
	mu sync.Mutex // guards at
	at []time.Time
}

func (l *headersLog) add(t time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.at = append(l.at, t)
}

// firstIn returns the first HEADERS write noted in [from, to].
func (l *headersLog) firstIn(from, to time.Time) (time.Time, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, t := range l.at {
		if !t.Before(from) && !t.After(to) {
			return t, true
		}
	}
	return time.Time{}, false
}

// frameConn is a gRPC client connection that follows the HTTP/2 frames it
// writes (after the 24-byte client preface) and notes in log when each
// HEADERS frame was in the kernel.
type frameConn struct {
	net.Conn
	log *headersLog

	mu      sync.Mutex // guards the parser state below
	preface int        // preface bytes still to skip
	head    []byte     // a frame header split across writes
	payload int        // payload bytes of the current frame still to skip
}

func (c *frameConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	written := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	for p := b[:n]; len(p) > 0; {
		switch {
		case c.preface > 0:
			k := min(c.preface, len(p))
			c.preface, p = c.preface-k, p[k:]
		case c.payload > 0:
			k := min(c.payload, len(p))
			c.payload, p = c.payload-k, p[k:]
		default:
			k := min(9-len(c.head), len(p))
			c.head, p = append(c.head, p[:k]...), p[k:]
			if len(c.head) == 9 {
				c.payload = int(c.head[0])<<16 | int(c.head[1])<<8 | int(c.head[2])
				if c.head[3] == 0x1 { // HEADERS
					c.log.add(written)
				}
				c.head = c.head[:0]
			}
		}
	}
	return n, err
}

// dialNoting connects a gRPC client to addr whose HEADERS writes are noted
// in log.
func dialNoting(t *testing.T, addr string, log *headersLog) authv3.AuthorizationClient {
	t.Helper()
	conn, err := grpc.NewClient(addr,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, a string) (net.Conn, error) {
			c, err := (&net.Dialer{}).DialContext(ctx, "tcp", a)
			if err != nil {
				return nil, err
			}
			return &frameConn{Conn: c, log: log, preface: len("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")}, nil
		}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return authv3.NewAuthorizationClient(conn)
}

// TestSIGTERMUnderLoad: with checks in flight (Redis 150 ms away through
// the proxy), SIGTERM turns health NOT_SERVING, every check already sent
// completes with a decision, nothing is refused while /readyz still says
// serving, and the process exits 0 within --drain-timeout plus a margin.
//
// "Already sent" is decided on the wire, not by the client's clock: each
// worker has its own connection, which notes when its request's HEADERS
// frame was in the kernel. A check whose HEADERS were written before the
// signal reached the server before its GOAWAY could, so gRPC's graceful
// stop must serve it, however late a busy machine runs either side.
func TestSIGTERMUnderLoad(t *testing.T) {
	const (
		workers = 16
		delay   = 150 * time.Millisecond
		drain   = 5 * time.Second
	)
	rs := redistest.Start(t)
	px := startProxy(t, rs.Addr())
	px.SetDelay(delay)
	p := startFlashgate(t, "--backend", "redis", "--redis-addr", px.Addr(), "--key-prefix", "e2eterm",
		"--config", "testdata/faults.yaml", "--ban-duration", "0", "--failure-mode", "deny",
		"--redis-timeout", "2s", "--drain-timeout", drain.String())

	// Watch health from before the signal.
	wctx, wcancel := context.WithCancel(context.Background())
	defer wcancel()
	stream, err := p.Health.Watch(wctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatalf("health Watch: %v", err)
	}
	if r, err := stream.Recv(); err != nil || r.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health Watch: first status %v %v, want SERVING", r.GetStatus(), err)
	}
	notServing := make(chan time.Time, 1)
	go func() {
		for {
			r, err := stream.Recv()
			if err != nil {
				return
			}
			if r.GetStatus() == healthpb.HealthCheckResponse_NOT_SERVING {
				notServing <- time.Now()
				wcancel() // a well-behaved watcher leaves a draining server
				return
			}
		}
	}()

	// /readyz, polled until the process is gone: what it said, and when
	// the asking began.
	type ready struct {
		sent time.Time
		code int
	}
	var readyMu sync.Mutex // guards readies
	var readies []ready
	readyDone := make(chan struct{})
	go func() {
		defer close(readyDone)
		client := &http.Client{Timeout: 2 * time.Second}
		for !p.Exited() {
			sent := time.Now()
			if resp, err := client.Get("http://" + p.HTTPAddr + "/readyz"); err == nil {
				resp.Body.Close()
				readyMu.Lock()
				readies = append(readies, ready{sent, resp.StatusCode})
				readyMu.Unlock()
			}
			time.Sleep(5 * time.Millisecond)
		}
	}()

	type call struct {
		worker int
		a      answer
	}
	var mu sync.Mutex // guards calls, done
	var calls []call
	done := make([]int, workers) // calls completed per worker
	logs := make([]*headersLog, workers)
	stop := make(chan struct{})
	var tl tally
	var wg sync.WaitGroup
	next := uidLoad("term")
	for w := range workers {
		logs[w] = &headersLog{}
		auth := dialNoting(t, p.GRPCAddr, logs[w])
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				start := time.Now()
				resp, err := auth.Check(ctx, next(w, i).CheckRequest())
				a := answer{Resp: resp, Err: err, Sent: start, Latency: time.Since(start)}
				cancel()
				tl.add(a)
				mu.Lock()
				calls = append(calls, call{w, a})
				done[w]++
				mu.Unlock()
				if err != nil {
					// Refused while the server drains: no busy loop
					// taking the CPU from the checks in flight.
					time.Sleep(5 * time.Millisecond)
				}
			}
		})
	}
	// Every worker's connection is up and its checks cycle through Redis.
	if _, ok := waitFor(30*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		for _, n := range done {
			if n < 2 {
				return false
			}
		}
		return true
	}); !ok {
		t.Fatalf("the load did not get going: %s", &tl)
	}

	sigAt := time.Now()
	p.Signal(syscall.SIGTERM)
	code, exited := p.Wait(drain + 5*time.Second)
	exitAt := time.Now()
	close(stop)
	wg.Wait()
	<-readyDone

	if !exited {
		t.Fatalf("flashgate did not exit within --drain-timeout %s + 5s of SIGTERM", drain)
	}
	t.Logf("exit code %d, %s after SIGTERM; load: %s", code, exitAt.Sub(sigAt), &tl)
	if code != 0 {
		t.Errorf("exit code %d after SIGTERM, want 0", code)
	}
	var nsAt time.Time
	select {
	case nsAt = <-notServing:
		t.Logf("health Watch reported NOT_SERVING %s after SIGTERM", nsAt.Sub(sigAt))
	default:
		t.Errorf("health Watch never reported NOT_SERVING between SIGTERM and exit")
	}

	// Checks whose HEADERS were in the kernel before the signal and that
	// came back after it were in flight: each must end with a decision.
	// A refusal is an UNAVAILABLE (a draining or closed server), not a
	// check that ran out of its deadline on a busy machine.
	var inflight, inflightFailed int
	var firstRefusal time.Time
	mu.Lock()
	for _, c := range calls {
		if status.Code(c.a.Err) == codes.Unavailable && (firstRefusal.IsZero() || c.a.Replied().Before(firstRefusal)) {
			firstRefusal = c.a.Replied()
		}
		wire, ok := logs[c.worker].firstIn(c.a.Sent, c.a.Replied())
		if !ok || !wire.Before(sigAt) || !c.a.Replied().After(sigAt) {
			continue
		}
		inflight++
		if c.a.Verdict() == vError {
			inflightFailed++
			if inflightFailed <= 3 {
				t.Errorf("a check in flight at SIGTERM (on the wire %s before it) failed: %s", sigAt.Sub(wire), c.a)
			}
		}
	}
	mu.Unlock()
	t.Logf("%d checks in flight at SIGTERM, %d failed", inflight, inflightFailed)
	if inflight == 0 {
		t.Errorf("no check was in flight at SIGTERM: the test proves nothing")
	}

	// Health turns first: once a check has been refused, /readyz never
	// says serving again. (The refusal was seen before the question was
	// sent, so the server refused before it answered.)
	readyMu.Lock()
	defer readyMu.Unlock()
	var after, notReady int
	for _, r := range readies {
		if firstRefusal.IsZero() || !r.sent.After(firstRefusal) {
			continue
		}
		after++
		if r.code == http.StatusOK {
			t.Errorf("/readyz asked %s after a check was refused (%s after SIGTERM) still said serving", r.sent.Sub(firstRefusal), firstRefusal.Sub(sigAt))
			break
		}
		notReady++
	}
	if firstRefusal.IsZero() {
		t.Logf("no check was refused")
	} else {
		t.Logf("first refusal seen %s after SIGTERM (health Watch: %s); /readyz asked %d times after it, %d not ready", firstRefusal.Sub(sigAt), nsAt.Sub(sigAt), after, notReady)
	}
}
