//go:build linux

package e2e

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/flashgate/flashgate/window/redistest"
)

// listenersRLS is the ratelimit config of the listener tests.
const listenersRLS = "testdata/listeners-rls"

// startRLSHTTP runs serve with the faults rules, the ratelimit config of
// the listener tests and --rls-http-addr on a free port; it returns the
// process and that address.
func startRLSHTTP(t *testing.T, args ...string) (*proc, string) {
	t.Helper()
	addrs, err := freeAddrs(1)
	if err != nil {
		t.Fatal(err)
	}
	all := append([]string{"--config", "testdata/faults.yaml", "--rls-config", listenersRLS, "--rls-http-addr", addrs[0]}, args...)
	return startFlashgate(t, all...), addrs[0]
}

// jsonBody is a /json request about uid.
func jsonBody(uid string) string {
	return fmt.Sprintf(`{"domain":"lst","descriptors":[{"entries":[{"key":"uid","value":%q}]}]}`, uid)
}

// freshGet sends method url (with body, when not "") on a new connection,
// with a 5 s deadline, and returns the status.
func freshGet(method, url, body string) (int, error) {
	c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		return 0, err
	}
	resp, err := c.Do(req)
	if err != nil {
		return 0, err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, nil
}

// wantStatus returns f as an error when its status is not want.
func wantStatus(want int, f func() (int, error)) func() error {
	return func() error {
		code, err := f()
		if err == nil && code != want {
			err = fmt.Errorf("status %d, want %d", code, want)
		}
		return err
	}
}

// connHolder keeps connections open until the test ends.
type connHolder struct {
	mu    sync.Mutex // guards conns
	conns []net.Conn
}

func newConnHolder(t *testing.T) *connHolder {
	h := &connHolder{}
	t.Cleanup(func() {
		h.mu.Lock()
		defer h.mu.Unlock()
		for _, c := range h.conns {
			c.Close()
		}
	})
	return h
}

func (h *connHolder) hold(c net.Conn) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.conns = append(h.conns, c)
}

// flood opens n connections to addr with open (16 at a time) and holds
// them; it returns how many opened.
func flood(t *testing.T, h *connHolder, n int, addr string, open func(string) (net.Conn, error)) int64 {
	t.Helper()
	var opened atomic.Int64
	next := make(chan struct{})
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			for range next {
				c, err := open(addr)
				if errors.Is(err, syscall.EMFILE) {
					t.Errorf("this test process ran out of files: raise its limit (ulimit -n) above %d", n+100)
					return
				}
				if err == nil {
					opened.Add(1)
					h.hold(c)
				}
			}
		})
	}
	for range n {
		next <- struct{}{}
	}
	close(next)
	wg.Wait()
	return opened.Load()
}

// silentConn opens a TCP connection to addr that never sends a byte.
func silentConn(addr string) (net.Conn, error) { return net.DialTimeout("tcp", addr, time.Second) }

// keepOpening opens a connection to addr with open every interval until
// the test ends, and holds it.
func keepOpening(t *testing.T, h *connHolder, addr string, interval time.Duration, open func(string) (net.Conn, error)) {
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			if c, err := open(addr); err == nil {
				h.hold(c)
			}
		}
	}()
	t.Cleanup(func() { close(stop); <-done })
}

// TestRatelimitHTTPFlood: ratelimit's HTTP side (--rls-http-addr) is capped
// like the other listeners: thousands of idle keep-alive connections on
// it, more than the process may open files (its limit lowered to 512), and
// more opened all along: /healthcheck and /json on new connections, new
// gRPC connections and /readyz still answer, while the listener holds at
// most --rls-http-max-conns open and says so in its metrics.
func TestRatelimitHTTPFlood(t *testing.T) {
	const (
		fileLimit = 512
		n         = 2000
		maxConns  = 128
	)
	p, rl := startRLSHTTP(t, "--rls-http-max-conns", fmt.Sprint(maxConns))
	limitFiles(t, p.Pid(), fileLimit)
	h := newConnHolder(t)
	opened := flood(t, h, n, rl, idleConn)
	t.Logf("flood: %d connections opened and held", opened)
	keepOpening(t, h, rl, 10*time.Millisecond, idleConn)

	base := "http://" + rl
	for i := range 5 {
		if err := within3(wantStatus(http.StatusOK, func() (int, error) { return freshGet("GET", base+"/healthcheck", "") })); err != nil {
			t.Errorf("round %d: /healthcheck on a new connection failed three times: %v", i, err)
		}
		if err := within3(wantStatus(http.StatusOK, func() (int, error) { return freshGet("POST", base+"/json", jsonBody(freshUID("rlflood"))) })); err != nil {
			t.Errorf("round %d: /json on a new connection failed three times: %v", i, err)
		}
		probeNewConns(t, p, i)
		if t.Failed() {
			break
		}
	}
	m := p.Metrics()
	open, shed := m.Value("flashgate_conns_open", "listener", "rls_http"), m.Value("flashgate_conns_shed_total", "listener", "rls_http")
	t.Logf("rls_http listener: %v connections open, %v shed", open, shed)
	if !m.Has("flashgate_conns_open") || open > maxConns {
		t.Errorf("flashgate_conns_open{listener=rls_http} = %v, want exported and at most --rls-http-max-conns %d", open, maxConns)
	}
	if rss, err := p.RSS(); err == nil {
		t.Logf("flashgate RSS with the flood held: %d MiB", rss>>20)
	}
	if want := float64(opened / 2); shed < want {
		t.Errorf("flashgate_conns_shed_total{listener=rls_http} = %v, want ≥ %v (%d held by the client, cap %d)", shed, want, opened, maxConns)
	}
}

// openFiles returns how many files process pid has open.
func openFiles(t *testing.T, pid int) int {
	t.Helper()
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		t.Fatal(err)
	}
	return len(fds)
}

// TestHTTPAcceptErrorsThroughTheLogLimiter: when the process runs out of
// files, the HTTP servers' own error lines (http: Accept error …) are
// records of serve's logger, rate-limited like every warning: none is
// written raw, and at most a few per 10 s.
func TestHTTPAcceptErrorsThroughTheLogLimiter(t *testing.T) {
	p, rl := startRLSHTTP(t)
	limitFiles(t, p.Pid(), openFiles(t, p.Pid())+16)
	h := newConnHolder(t)
	start := time.Now()
	keepOpening(t, h, rl, 5*time.Millisecond, idleConn)
	accepts := func() []string {
		var out []string
		for _, l := range strings.Split(p.Output(), "\n") {
			if strings.Contains(l, "Accept error") {
				out = append(out, l)
			}
		}
		return out
	}
	if _, ok := waitFor(60*time.Second, func() bool { return len(accepts()) > 0 }); !ok {
		t.Fatalf("no accept error logged with the process out of files")
	}
	// Go's server retries a failed accept after 5 ms, doubling up to 1 s:
	// a dozen attempts in the next few seconds.
	time.Sleep(4 * time.Second)
	lines := accepts()
	elapsed := time.Since(start)
	t.Logf("%d accept error lines in %s, first: %s", len(lines), elapsed, lines[0])
	for _, l := range lines {
		if !strings.HasPrefix(l, "{") {
			t.Errorf("an accept error written outside serve's logger: %s", l)
			break
		}
	}
	// One per 10 s of each kind, and the last held back when its interval ends.
	if max := 2 * (int(elapsed/(10*time.Second)) + 1); len(lines) > max {
		t.Errorf("%d accept error lines in %s, want at most %d (one per 10 s, and the one held back)", len(lines), elapsed, max)
	}
}

// TestSilentSocketsOnGRPC: thousands of TCP connections to the gRPC port
// that never send a byte, and more opened all along, do not keep clients
// out: a connection counts against --grpc-max-conns once its handshake is
// done; before that it is pending, and a new one sheds the one pending the
// longest. New gRPC connections still get their checks answered, the one
// established before the flood keeps working, and at most
// --grpc-max-pending connections are pending.
func TestSilentSocketsOnGRPC(t *testing.T) {
	const (
		n          = 2000
		maxPending = 64
	)
	p := startFlashgate(t, "--config", "testdata/faults.yaml", "--grpc-max-pending", fmt.Sprint(maxPending))
	h := newConnHolder(t)
	opened := flood(t, h, n, p.GRPCAddr, silentConn)
	t.Logf("flood: %d silent connections opened and held", opened)
	keepOpening(t, h, p.GRPCAddr, 100*time.Millisecond, silentConn)
	for i := range 5 {
		if err := within3(func() error { return freshCheck(p.GRPCAddr, coupon(freshUID("silent"), "10.0.0.9")) }); err != nil {
			t.Errorf("round %d: a check on a new gRPC connection failed three times: %v", i, err)
			break
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := p.Auth.Check(ctx, coupon(freshUID("silent"), "10.0.0.9").CheckRequest()); err != nil {
		t.Errorf("a check on the connection established before the flood: %v", err)
	}
	m := p.Metrics()
	pending, shed := m.Value("flashgate_conns_pending", "listener", "grpc"), m.Value("flashgate_conns_shed_total", "listener", "grpc")
	t.Logf("grpc listener: %v pending, %v open, %v shed", pending, m.Value("flashgate_conns_open", "listener", "grpc"), shed)
	if !m.Has("flashgate_conns_pending") || pending > maxPending {
		t.Errorf("flashgate_conns_pending{listener=grpc} = %v, want exported and at most --grpc-max-pending %d", pending, maxPending)
	}
	if want := float64(opened / 2); shed < want {
		t.Errorf("flashgate_conns_shed_total{listener=grpc} = %v, want ≥ %v", shed, want)
	}
}

// slowBodyConn sends the HTTP front-end a check with a body of 100,000
// bytes announced and one sent, and never more.
func slowBodyConn(addr string) (net.Conn, error) {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return nil, err
	}
	_ = c.SetWriteDeadline(time.Now().Add(time.Second))
	_, err = fmt.Fprintf(c, "POST /api/coupon/x HTTP/1.1\r\nHost: shop.example\r\nX-Uid: %s\r\nContent-Length: 100000\r\n\r\nx", freshUID("slowbody"))
	if err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// TestSlowBodyOnHTTPFront: a check's body is not waited for. A check whose
// body comes slowly is answered at once, with Connection: close, and its
// connection closed; so connections opened all along with bodies that
// never come do not hold the front-end's connections (--http-authz-max-conns
// 8), and checks on new connections get their decision.
func TestSlowBodyOnHTTPFront(t *testing.T) {
	p, err := launchRetryWith(t, []string{"--config", "testdata/faults.yaml", "--http-authz-max-conns", "8"}, launchOpts{httpAuthz: true})
	if err != nil {
		t.Fatal(err)
	}
	c, err := slowBodyConn(p.HTTPAuthzAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("a check with a slow body: no answer: %v", err)
	}
	rest, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	t.Logf("a check with a slow body: %s, Connection: close %v, body %q (%v)", resp.Status, resp.Close, rest, err)
	if resp.StatusCode != http.StatusOK || !resp.Close {
		t.Errorf("a check with a slow body: %s, close %v; want 200 with Connection: close", resp.Status, resp.Close)
	}
	if n, err := c.Read(make([]byte, 1)); n != 0 || !errors.Is(err, io.EOF) {
		t.Errorf("after the answer: read %d, %v; want the connection closed (EOF)", n, err)
	}

	h := newConnHolder(t)
	keepOpening(t, h, p.HTTPAuthzAddr, 50*time.Millisecond, slowBodyConn)
	base := "http://" + p.HTTPAuthzAddr
	for i := range 5 {
		if err := within3(func() error {
			code, err := freshGet("GET", base+"/api/coupon/x", "")
			if err == nil && code != http.StatusOK && code != http.StatusTooManyRequests {
				err = fmt.Errorf("status %d, want a decision", code)
			}
			return err
		}); err != nil {
			t.Errorf("round %d: a check on a new connection failed three times: %v", i, err)
			break
		}
	}
	t.Logf("http_authz listener: %v shed", p.Metrics().Value("flashgate_conns_shed_total", "listener", "http_authz"))
}

// TestOptionsAsteriskOnHTTPFront: OPTIONS * is a request without a usable
// URI like any other: 400, not net/http's built-in 200 with no check.
func TestOptionsAsteriskOnHTTPFront(t *testing.T) {
	p, err := launchRetryWith(t, []string{"--config", "testdata/faults.yaml"}, launchOpts{httpAuthz: true})
	if err != nil {
		t.Fatal(err)
	}
	c, err := net.DialTimeout("tcp", p.HTTPAuthzAddr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := io.WriteString(c, "OPTIONS * HTTP/1.1\r\nHost: shop.example\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("OPTIONS *: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Errorf("OPTIONS *: %s %q, want 400", resp.Status, body)
	}
	if v := p.Metrics().Value("flashgate_http_authz_rejected_total", "reason", "bad_uri"); v != 1 {
		t.Errorf("flashgate_http_authz_rejected_total{reason=bad_uri} = %v, want 1", v)
	}
}

// TestSIGTERMWithAnIdleWatch: a health Watch stream left open by its
// client does not hold the exit: on SIGTERM it gets NOT_SERVING and then
// ends (status OK), serve exits 0 without running into --drain-timeout,
// and does not warn of checks cut.
func TestSIGTERMWithAnIdleWatch(t *testing.T) {
	const drain = 60 * time.Second
	p := startFlashgate(t, "--config", "testdata/faults.yaml", "--drain-timeout", drain.String())
	stream, err := p.Health.Watch(context.Background(), &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if r, err := stream.Recv(); err != nil || r.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health Watch: first status %v %v, want SERVING", r.GetStatus(), err)
	}
	p.Signal(syscall.SIGTERM)
	r, err := stream.Recv()
	if err != nil || r.GetStatus() != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Errorf("health Watch after SIGTERM: %v %v, want NOT_SERVING", r.GetStatus(), err)
	}
	if _, err := stream.Recv(); !errors.Is(err, io.EOF) {
		t.Errorf("health Watch after NOT_SERVING: %v, want the stream ended (EOF)", err)
	}
	code, ok := p.Wait(drain + 30*time.Second)
	if !ok || code != 0 {
		t.Fatalf("serve after SIGTERM: exited %v, code %d; want 0", ok, code)
	}
	if out := p.Output(); strings.Contains(out, "drain deadline passed") {
		t.Errorf("serve warned that checks were cut with none in flight")
	}
}

// writeLog notes when the writes on one connection had reached the kernel.
type writeLog struct {
	net.Conn
	mu sync.Mutex // guards at
	at []time.Time
}

func (c *writeLog) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	c.mu.Lock()
	c.at = append(c.at, time.Now())
	c.mu.Unlock()
	return n, err
}

// lastIn returns the last write noted in [from, to].
func (c *writeLog) lastIn(from, to time.Time) (time.Time, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var last time.Time
	for _, t := range c.at {
		if !t.Before(from) && !t.After(to) {
			last = t
		}
	}
	return last, !last.IsZero()
}

// TestSIGTERMUnderJSONLoad: on SIGTERM, ratelimit's HTTP side stops
// accepting, finishes the requests in flight, then closes: every POST
// /json whose bytes were on the wire before the signal gets its answer
// (Redis 150 ms away through the proxy, so that many are), and so does a
// request that had begun to arrive on a keep-alive connection and is
// finished after the listener closed.
func TestSIGTERMUnderJSONLoad(t *testing.T) {
	const (
		workers = 16
		delay   = 150 * time.Millisecond
		drain   = 30 * time.Second
	)
	rs := redistest.Start(t)
	px := startProxy(t, rs.Addr())
	px.SetDelay(delay)
	p, rl := startRLSHTTP(t, "--backend", "redis", "--redis-addr", px.Addr(), "--key-prefix", "e2ejsonterm",
		"--redis-timeout", "2s", "--failure-mode", "deny", "--drain-timeout", drain.String())
	url := "http://" + rl + "/json"

	type call struct {
		conn       *writeLog
		sent, back time.Time
		code       int
		err        error
	}
	var mu sync.Mutex // guards calls
	var calls []call
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var done atomic.Int64
	for w := range workers {
		// conn is the worker's connection: one at a time.
		var conn atomic.Pointer[writeLog]
		tr := &http.Transport{MaxConnsPerHost: 1, DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			wl := &writeLog{Conn: c}
			conn.Store(wl)
			return wl, nil
		}}
		client := &http.Client{Transport: tr, Timeout: drain + 10*time.Second}
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				sent := time.Now()
				resp, err := client.Post(url, "application/json", strings.NewReader(jsonBody(fmt.Sprintf("w%d-%d", w, i))))
				c := call{conn: conn.Load(), sent: sent, back: time.Now(), err: err}
				if err == nil {
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					c.code = resp.StatusCode
				}
				mu.Lock()
				calls = append(calls, c)
				mu.Unlock()
				done.Add(1)
				if err != nil {
					time.Sleep(5 * time.Millisecond)
				}
			}
		})
	}
	if _, ok := waitFor(30*time.Second, func() bool { return done.Load() >= 2*workers }); !ok {
		t.Fatalf("the /json load did not get going")
	}

	// A request begun on an idle keep-alive connection before the signal
	// and finished after the listener closed.
	kc, err := net.DialTimeout("tcp", rl, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer kc.Close()
	_ = kc.SetDeadline(time.Now().Add(drain + 30*time.Second))
	br := bufio.NewReader(kc)
	body := jsonBody("keepalive-1")
	req := fmt.Sprintf("POST /json HTTP/1.1\r\nHost: rl\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	if _, err := io.WriteString(kc, req); err != nil {
		t.Fatal(err)
	}
	if resp, err := http.ReadResponse(br, nil); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("/json on the keep-alive connection: %v %v", resp, err)
	} else {
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	body = jsonBody("keepalive-2")
	req = fmt.Sprintf("POST /json HTTP/1.1\r\nHost: rl\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	half := len(req) / 2
	if _, err := io.WriteString(kc, req[:half]); err != nil {
		t.Fatal(err)
	}

	sigAt := time.Now()
	p.Signal(syscall.SIGTERM)
	// The listener closes when the drain begins.
	if _, ok := waitFor(30*time.Second, func() bool {
		c, err := net.DialTimeout("tcp", rl, time.Second)
		if err == nil {
			c.Close()
		}
		return err != nil
	}); !ok {
		t.Errorf("--rls-http-addr still accepts 30s after SIGTERM")
	}
	if _, err := io.WriteString(kc, req[half:]); err != nil {
		t.Errorf("the rest of a request begun before SIGTERM: %v", err)
	}
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Errorf("a request begun on a keep-alive connection before SIGTERM: %v", err)
	} else {
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !resp.Close {
			t.Errorf("a request begun on a keep-alive connection before SIGTERM: %s, close %v; want 200 with Connection: close", resp.Status, resp.Close)
		}
	}

	code, exited := p.Wait(drain + 30*time.Second)
	close(stop)
	wg.Wait()
	if !exited || code != 0 {
		t.Fatalf("serve after SIGTERM: exited %v, code %d; want 0", exited, code)
	}
	var inflight, failed int
	mu.Lock()
	defer mu.Unlock()
	for _, c := range calls {
		if c.conn == nil {
			continue
		}
		wire, ok := c.conn.lastIn(c.sent, c.back)
		if !ok || !wire.Before(sigAt) || !c.back.After(sigAt) {
			continue
		}
		inflight++
		if c.err != nil || c.code != http.StatusOK {
			failed++
			if failed <= 3 {
				t.Errorf("a /json request on the wire %s before SIGTERM: %d %v", sigAt.Sub(wire), c.code, c.err)
			}
		}
	}
	t.Logf("%d /json requests in flight at SIGTERM, %d failed", inflight, failed)
	if inflight == 0 {
		t.Errorf("no /json request was in flight at SIGTERM: the test proves nothing")
	}
}
