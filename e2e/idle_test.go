//go:build linux

package e2e

import (
	"context"
	"fmt"
	"net"
	"net/http"
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

// probeNewConns fails t unless, within three tries each, a check on a new
// gRPC connection and /readyz on a new connection answer.
func probeNewConns(t *testing.T, p *proc, round int) {
	t.Helper()
	if err := within3(func() error { return freshCheck(p.GRPCAddr, coupon(freshUID("probe"), "10.0.0.9")) }); err != nil {
		t.Errorf("round %d: a check on a new gRPC connection failed three times: %v", round, err)
	}
	if err := within3(func() error { return freshReadyz(p.HTTPAddr) }); err != nil {
		t.Errorf("round %d: /readyz on a new connection failed three times: %v", round, err)
	}
}

// TestIdleConnsOnMetricsPort: thousands of idle keep-alive connections on
// --http-addr, more than the process may open files (its limit lowered to
// 512), and more opened all along: new gRPC connections still get their
// checks answered and /readyz still answers 200, while the HTTP listener
// holds at most --http-max-conns open.
func TestIdleConnsOnMetricsPort(t *testing.T) {
	const (
		fileLimit = 512
		n         = 2000
		maxConns  = 128 // --http-max-conns's default
	)
	p := startFlashgate(t, "--config", "testdata/faults.yaml")
	limitFiles(t, p.Pid(), fileLimit)

	h := newConnHolder(t)
	opened := flood(t, h, n, p.HTTPAddr, idleConn)
	t.Logf("flood: %d connections opened and held", opened)
	// More idle connections all along while gRPC and /readyz are probed.
	keepOpening(t, h, p.HTTPAddr, 10*time.Millisecond, idleConn)
	for i := 0; i < 10 && !t.Failed(); i++ {
		probeNewConns(t, p, i)
	}

	m := p.Metrics()
	open, shed := m.Value("flashgate_conns_open", "listener", "http"), m.Value("flashgate_conns_shed_total", "listener", "http")
	t.Logf("http listener: %v connections open, %v shed", open, shed)
	if open > maxConns {
		t.Errorf("flashgate_conns_open{listener=http} = %v, above --http-max-conns %d", open, maxConns)
	}
	// Most of the flood was shed at the cap (some may have idled out).
	if want := float64(opened / 2); shed < want {
		t.Errorf("flashgate_conns_shed_total{listener=http} = %v, want ≥ %v (%d held by the client, cap %d)", shed, want, opened, maxConns)
	}
	if rss, err := p.RSS(); err == nil {
		t.Logf("flashgate RSS with the flood held: %d MiB", rss>>20)
	}
}
