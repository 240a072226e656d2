//go:build linux

package e2e

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
	"unsafe"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// limitFiles sets the open-file limit (soft and hard) of process pid to n.
func limitFiles(t *testing.T, pid, n int) {
	t.Helper()
	lim := syscall.Rlimit{Cur: uint64(n), Max: uint64(n)}
	if _, _, errno := syscall.RawSyscall6(syscall.SYS_PRLIMIT64, uintptr(pid), syscall.RLIMIT_NOFILE,
		uintptr(unsafe.Pointer(&lim)), 0, 0, 0); errno != 0 {
		t.Fatalf("prlimit(%d, RLIMIT_NOFILE, %d): %v", pid, n, errno)
	}
}

// idleConn opens a connection to addr and sends one keep-alive request on
// it, never reading the answer: to the server it is a keep-alive
// connection idle after its first request.
func idleConn(addr string) (net.Conn, error) {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return nil, err
	}
	_ = c.SetWriteDeadline(time.Now().Add(time.Second))
	if _, err := c.Write([]byte("GET /healthz HTTP/1.1\r\nHost: flashgate\r\n\r\n")); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// freshCheck sends one Check on a new gRPC connection (a new TCP
// connection to the server), with a 5 s deadline.
func freshCheck(addr string, r req) error {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := authv3.NewAuthorizationClient(conn).Check(ctx, r.CheckRequest())
	if err != nil {
		return err
	}
	if a := (answer{Resp: resp}); a.Verdict() == vError {
		return fmt.Errorf("answer outside the contract: %v", a)
	}
	return nil
}

// freshReadyz fetches /readyz on a new connection, with a 5 s deadline.
func freshReadyz(addr string) error {
	c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := c.Get("http://" + addr + "/readyz")
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("/readyz: %s", resp.Status)
	}
	return nil
}

// within3 runs f up to three times (a kubelet probe's default failure
// threshold) and returns its last error.
func within3(f func() error) error {
	var err error
	for range 3 {
		if err = f(); err == nil {
			return nil
		}
	}
	return err
}

// TestIdleConnsOnMetricsPort: thousands of idle keep-alive connections on
// --http-addr, more than the process may open files (its limit lowered to
// 512), and more opened all along: new gRPC connections still get their
// checks answered and /readyz still answers 200, while the HTTP listener
// holds at most --http-max-conns open.
func TestIdleConnsOnMetricsPort(t *testing.T) {
	const (
		fileLimit = 512
		flood     = 2000
		maxConns  = 128 // --http-max-conns's default
	)
	p := startFlashgate(t, "--config", "testdata/faults.yaml")
	limitFiles(t, p.Pid(), fileLimit)

	var (
		mu    sync.Mutex
		conns []net.Conn
	)
	hold := func(c net.Conn) {
		mu.Lock()
		conns = append(conns, c)
		mu.Unlock()
	}
	t.Cleanup(func() {
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})

	// The flood: flood connections, each idle after one request, all held.
	var opened, failed atomic.Int64
	var wg sync.WaitGroup
	next := make(chan struct{})
	for range 16 {
		wg.Go(func() {
			for range next {
				c, err := idleConn(p.HTTPAddr)
				if errors.Is(err, syscall.EMFILE) {
					t.Errorf("this test process ran out of files: raise its limit (ulimit -n) above %d", flood+100)
					return
				}
				if err != nil {
					failed.Add(1)
					continue
				}
				opened.Add(1)
				hold(c)
			}
		})
	}
	for range flood {
		next <- struct{}{}
	}
	close(next)
	wg.Wait()
	t.Logf("flood: %d connections opened and held, %d failed to open", opened.Load(), failed.Load())

	// More idle connections all along while gRPC and /readyz are probed.
	stop := make(chan struct{})
	var more atomic.Int64
	wg.Go(func() {
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			if c, err := idleConn(p.HTTPAddr); err == nil {
				more.Add(1)
				hold(c)
			}
		}
	})
	for i := range 10 {
		if err := within3(func() error { return freshCheck(p.GRPCAddr, coupon(freshUID("idle"), "10.0.0.9")) }); err != nil {
			t.Errorf("round %d: a check on a new gRPC connection failed three times: %v", i, err)
		}
		if err := within3(func() error { return freshReadyz(p.HTTPAddr) }); err != nil {
			t.Errorf("round %d: /readyz on a new connection failed three times: %v", i, err)
		}
		if t.Failed() {
			break
		}
	}
	close(stop)
	wg.Wait()
	t.Logf("%d more idle connections opened while probing", more.Load())

	m := p.Metrics()
	open, shed := m.Value("flashgate_conns_open", "listener", "http"), m.Value("flashgate_conns_shed_total", "listener", "http")
	t.Logf("http listener: %v connections open, %v shed", open, shed)
	if open > maxConns {
		t.Errorf("flashgate_conns_open{listener=http} = %v, above --http-max-conns %d", open, maxConns)
	}
	// Most of the flood was shed at the cap (some may have idled out).
	if want := float64(opened.Load() / 2); shed < want {
		t.Errorf("flashgate_conns_shed_total{listener=http} = %v, want ≥ %v (%d held by the client, cap %d)", shed, want, opened.Load(), maxConns)
	}
	if rss, err := p.RSS(); err == nil {
		t.Logf("flashgate RSS with the flood held: %d MiB", rss>>20)
	}
}
