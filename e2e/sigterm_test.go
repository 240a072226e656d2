package e2e

import (
	"context"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/flashgate/flashgate/window/redistest"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// TestSIGTERMUnderLoad: with checks in flight (Redis 150 ms away through
// the proxy), SIGTERM turns health NOT_SERVING first, every check already
// sent completes with a decision, and the process exits 0 within
// --drain-timeout plus a margin.
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

	type call struct {
		start, end time.Time
		a          answer
	}
	var mu sync.Mutex // guards calls
	var calls []call
	stop := make(chan struct{})
	var tl tally
	wg := load(p, workers, stop, &tl, uidLoad("term"), func(_ int, _ req, a answer) {
		end := time.Now()
		mu.Lock()
		calls = append(calls, call{end.Add(-a.Latency), end, a})
		mu.Unlock()
	})
	time.Sleep(time.Second)

	sigAt := time.Now()
	p.Signal(syscall.SIGTERM)
	code, exited := p.Wait(drain + 5*time.Second)
	exitAt := time.Now()
	close(stop)
	wg.Wait()

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
		t.Logf("health NOT_SERVING %s after SIGTERM", nsAt.Sub(sigAt))
	default:
		t.Errorf("health Watch never reported NOT_SERVING between SIGTERM and exit")
	}

	// Calls sent before the signal (5 ms of slack for the client's own
	// scheduling) are in flight: each must end with a decision.
	var inflight, inflightFailed int
	var firstRefusal time.Time
	mu.Lock()
	for _, c := range calls {
		if c.a.Verdict() == vError && (firstRefusal.IsZero() || c.end.Before(firstRefusal)) {
			firstRefusal = c.end
		}
		if c.start.Before(sigAt.Add(-5*time.Millisecond)) && c.end.After(sigAt) {
			inflight++
			if c.a.Verdict() == vError {
				inflightFailed++
				if inflightFailed <= 3 {
					t.Errorf("a check in flight at SIGTERM (sent %s before) failed: %s", sigAt.Sub(c.start), c.a)
				}
			}
		}
	}
	mu.Unlock()
	t.Logf("%d checks in flight at SIGTERM, %d failed", inflight, inflightFailed)
	if inflight == 0 {
		t.Errorf("no check was in flight at SIGTERM: the test proves nothing")
	}
	if !firstRefusal.IsZero() && !nsAt.IsZero() && firstRefusal.Before(nsAt) {
		t.Errorf("a check was refused %s after SIGTERM, before health reported NOT_SERVING (%s after)", firstRefusal.Sub(sigAt), nsAt.Sub(sigAt))
	}
}
