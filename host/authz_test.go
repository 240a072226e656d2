package host_test

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/flashgate/flashgate/host"
)

// frontHandler answers "ok PROTO"; /slow waits for release first and
// tells started when it runs.
type frontHandler struct {
	started, release chan struct{}
}

func (f frontHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/slow" {
		f.started <- struct{}{}
		<-f.release
	}
	_, _ = io.WriteString(w, "ok "+r.Proto)
}

// startFront serves a host with an HTTP front-end listener (capped at
// maxConns) and returns it, the front-end's base URL and /metrics' URL.
func startFront(t *testing.T, handler http.Handler, maxConns int) (*host.Host, string, string) {
	t.Helper()
	var lis [3]net.Listener
	for i := range lis {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		lis[i] = l
	}
	h, err := host.New(host.Options{
		GRPC: lis[0], HTTP: lis[1], HTTPAuthz: lis[2], HTTPAuthzHandler: handler, HTTPAuthzMaxConns: maxConns,
		Registry: prometheus.NewRegistry(),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = h.Serve(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done; h.Stop() })
	h.SetServing(true)
	if h.HTTPAuthzAddr() != lis[2].Addr().String() {
		t.Errorf("HTTPAuthzAddr %q, want %q", h.HTTPAuthzAddr(), lis[2].Addr())
	}
	return h, "http://" + h.HTTPAuthzAddr(), "http://" + h.HTTPAddr() + "/metrics"
}

// get fetches url with c and returns the status and body.
func get(t *testing.T, c *http.Client, url string, headers ...string) (int, string) {
	t.Helper()
	req, err := http.NewRequest("GET", url, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// h2cClient speaks HTTP/2 without TLS (prior knowledge), as Envoy's
// http_service cluster does with http2_protocol_options.
func h2cClient() *http.Client {
	var p http.Protocols
	p.SetUnencryptedHTTP2(true)
	return &http.Client{Transport: &http.Transport{Protocols: &p}, Timeout: 10 * time.Second}
}

// TestHTTPAuthzListener: the front-end's listener serves HTTP/1.1 and h2c,
// answers 431 past AuthzMaxHeaderBytes (below it the handler decides),
// and is capped and measured under listener="http_authz".
func TestHTTPAuthzListener(t *testing.T) {
	_, base, metrics := startFront(t, frontHandler{}, 2)
	c1 := &http.Client{Timeout: 10 * time.Second}
	if code, body := get(t, c1, base+"/x"); code != http.StatusOK || body != "ok HTTP/1.1" {
		t.Errorf("HTTP/1.1: %d %q", code, body)
	}
	if code, body := get(t, h2cClient(), base+"/x"); code != http.StatusOK || body != "ok HTTP/2.0" {
		t.Errorf("h2c: %d %q", code, body)
	}
	if code, _ := get(t, c1, base+"/x", "X-Pad", strings.Repeat("p", 100<<10)); code != http.StatusOK {
		t.Errorf("100 KiB of headers: %d, want the handler's 200", code)
	}
	if code, _ := get(t, c1, base+"/x", "X-Pad", strings.Repeat("p", host.AuthzMaxHeaderBytes+8<<10)); code != http.StatusRequestHeaderFieldsTooLarge {
		t.Errorf("headers past AuthzMaxHeaderBytes: %d, want 431", code)
	}
	// Three idle connections on a cap of two: the oldest is shed.
	for range 3 {
		c, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, m := get(t, c1, metrics)
		if strings.Contains(m, `flashgate_conns_open{listener="http_authz"}`) && !strings.Contains(m, `flashgate_conns_shed_total{listener="http_authz"} 0`) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/metrics shows no connection shed at the http_authz cap:\n%s", m)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitRefused waits until new connections to addr are refused: the
// drain began.
func waitRefused(t *testing.T, addr string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err != nil {
			return
		}
		c.Close()
		if time.Now().After(deadline) {
			t.Fatal("the front-end's listener still accepts during the drain")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestHTTPAuthzDrain: Shutdown stops accepting on the front-end's
// listener, lets the check in flight finish, then returns; past its
// deadline it cuts the check and says so.
func TestHTTPAuthzDrain(t *testing.T) {
	f := frontHandler{started: make(chan struct{}, 1), release: make(chan struct{})}
	h, base, _ := startFront(t, f, 8)
	type result struct {
		code int
		body string
	}
	slow := make(chan result, 1)
	go func() {
		resp, err := http.Get(base + "/slow")
		if err != nil {
			slow <- result{body: err.Error()}
			return
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		slow <- result{resp.StatusCode, string(b)}
	}()
	<-f.started
	stopped := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		stopped <- h.Shutdown(ctx)
	}()
	waitRefused(t, strings.TrimPrefix(base, "http://"))
	select {
	case err := <-stopped:
		t.Fatalf("Shutdown returned (%v) with a check in flight", err)
	default:
	}
	close(f.release)
	if r := <-slow; r.code != http.StatusOK || r.body != "ok HTTP/1.1" {
		t.Errorf("the check in flight: %d %q, want it answered", r.code, r.body)
	}
	if err := <-stopped; err != nil {
		t.Errorf("Shutdown: %v", err)
	}
}

// TestHTTPAuthzDrainDeadline: a check still running at the drain's
// deadline is cut, and Shutdown reports it.
func TestHTTPAuthzDrainDeadline(t *testing.T) {
	f := frontHandler{started: make(chan struct{}, 1), release: make(chan struct{})}
	defer close(f.release)
	h, base, _ := startFront(t, f, 8)
	failed := make(chan error, 1)
	go func() {
		resp, err := http.Get(base + "/slow")
		if err == nil {
			resp.Body.Close()
		}
		failed <- err
	}()
	<-f.started
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if err := h.Shutdown(ctx); err == nil {
		t.Error("Shutdown past its deadline with a check in flight returned nil")
	}
	if err := <-failed; err == nil {
		t.Error("the check in flight was answered, want it cut")
	}
}

func TestNewNeedsTheFrontEndsHandler(t *testing.T) {
	g, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	a, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if _, err := host.New(host.Options{GRPC: g, HTTPAuthz: a}); err == nil {
		t.Fatal("New with an HTTP front-end listener and no handler succeeded")
	}
}

// TestHTTPAuthzDrainAnswersAnArrivingRequest: a request that had begun to
// arrive on an idle keep-alive connection when the drain began is read
// and answered, with Connection: close, though it is finished after the
// listener closed; Shutdown then returns without its deadline.
func TestHTTPAuthzDrainAnswersAnArrivingRequest(t *testing.T) {
	h, base, _ := startFront(t, frontHandler{}, 8)
	addr := strings.TrimPrefix(base, "http://")
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	br := bufio.NewReader(c)
	const req = "GET /x HTTP/1.1\r\nHost: a\r\n\r\n"
	if _, err := io.WriteString(c, req); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	// Half of the next request, then the drain.
	if _, err := io.WriteString(c, req[:10]); err != nil {
		t.Fatal(err)
	}
	// Read by the server or still in the socket: either way it is kept.
	stopped := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		stopped <- h.Shutdown(ctx)
	}()
	waitRefused(t, addr)
	if _, err := io.WriteString(c, req[10:]); err != nil {
		t.Fatalf("the rest of the request: %v", err)
	}
	resp, err = http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("the request begun before the drain: %v", err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || string(b) != "ok HTTP/1.1" || !resp.Close {
		t.Errorf("the request begun before the drain: %d %q close %v, want answered with Connection: close", resp.StatusCode, b, resp.Close)
	}
	if err := <-stopped; err != nil {
		t.Errorf("Shutdown: %v", err)
	}
}

// TestHTTPAuthzDrainH2C: a check in flight on an HTTP/2 connection (h2c)
// finishes during the drain, and Shutdown returns once it has, without
// running into its deadline.
func TestHTTPAuthzDrainH2C(t *testing.T) {
	f := frontHandler{started: make(chan struct{}, 1), release: make(chan struct{})}
	h, base, _ := startFront(t, f, 8)
	c := h2cClient()
	if code, body := get(t, c, base+"/x"); code != http.StatusOK || body != "ok HTTP/2.0" {
		t.Fatalf("h2c: %d %q", code, body)
	}
	slow := make(chan string, 1)
	go func() {
		resp, err := c.Get(base + "/slow")
		if err != nil {
			slow <- err.Error()
			return
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		slow <- string(b)
	}()
	<-f.started
	stopped := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		stopped <- h.Shutdown(ctx)
	}()
	waitRefused(t, strings.TrimPrefix(base, "http://"))
	close(f.release)
	if got := <-slow; got != "ok HTTP/2.0" {
		t.Errorf("the h2c check in flight: %q, want it answered", got)
	}
	if err := <-stopped; err != nil {
		t.Errorf("Shutdown: %v", err)
	}
}
