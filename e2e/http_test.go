package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"

	"github.com/flashgate/flashgate/window/redistest"
)

// frontClient asks the sidecars' HTTP front-ends, with a keep-alive
// connection per caller.
var frontClient = &http.Client{
	Timeout:   10 * time.Second,
	Transport: &http.Transport{MaxIdleConns: 256, MaxIdleConnsPerHost: 64, IdleConnTimeout: time.Minute},
}

// CheckHTTP asks p's HTTP front-end (launchOpts.httpAuthz) with a GET of
// target carrying headers (name, value pairs), as a proxy does, and reads
// the answer as the CheckResponse it carries: 200 OK, 429 RESOURCE_EXHAUSTED;
// any other status is an error.
func (p *proc) CheckHTTP(target string, headers ...string) answer {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, "GET", "http://"+p.HTTPAuthzAddr+target, nil)
	if err != nil {
		return answer{Err: err}
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Add(headers[i], headers[i+1])
	}
	start := time.Now()
	resp, err := frontClient.Do(req)
	if err != nil {
		return answer{Err: err, Sent: start, Latency: time.Since(start)}
	}
	_, err = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	a := answer{Err: err, Sent: start, Latency: time.Since(start)}
	switch resp.StatusCode {
	case http.StatusOK:
		a.Resp = &authv3.CheckResponse{Status: &status.Status{Code: int32(codes.OK)}}
	case http.StatusTooManyRequests:
		a.Resp = &authv3.CheckResponse{Status: &status.Status{Code: int32(codes.ResourceExhausted)}}
	default:
		a.Err = fmt.Errorf("HTTP %d", resp.StatusCode)
	}
	return a
}

// TestFleetExactOverHTTP: three sidecars on one Redis, each with the HTTP
// front-end; 16 callers per sidecar ask about one x-uid (the built-in
// example's coupon_per_uid, 5 per 1 s), each sidecar as another proxy asks
// (nginx's X-Original-URI, Caddy's X-Forwarded-Uri, Envoy's request
// itself). No span of the window holds more than 5 admissions, the limit
// is reached, and no answer is anything but 200 or 429.
func TestFleetExactOverHTTP(t *testing.T) {
	rs := redistest.Start(t)
	procs := startFleetWith(t, 3, rs.Addr(), "e2ehttp", launchOpts{httpAuthz: true})
	uid := freshUID("http")
	asks := []func(p *proc) answer{
		func(p *proc) answer {
			return p.CheckHTTP("/flashgate-auth", "X-Original-URI", "/api/coupon/x?q=1", "X-Original-Method", "POST", "X-Uid", uid)
		},
		func(p *proc) answer {
			return p.CheckHTTP("/", "X-Forwarded-Method", "POST", "X-Forwarded-Uri", "/api/coupon/x", "X-Forwarded-Host", "shop.example", "X-Uid", uid)
		},
		func(p *proc) answer { return p.CheckHTTP("/api/coupon/x", "X-Uid", uid) },
	}
	adm := &admissions{}
	var denied, failed atomic.Int64
	var firstErr atomic.Value
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i, p := range procs {
		for range fleetCallers {
			wg.Go(func() {
				for {
					select {
					case <-stop:
						return
					default:
					}
					a := asks[i](p)
					switch a.Verdict() {
					case vAllowed:
						adm.add(a)
					case vDenied:
						denied.Add(1)
					default:
						failed.Add(1)
						firstErr.CompareAndSwap(nil, a.String())
					}
				}
			})
		}
	}
	time.Sleep(3 * time.Second)
	close(stop)
	wg.Wait()
	all := adm.snapshot()
	n := provablyWithin(all, fleetWindow)
	t.Logf("%d admissions, %d denials, %d failed over 3s through the HTTP front-ends; the most in one window: %d", len(all), denied.Load(), failed.Load(), n)
	if n > fleetLimit {
		t.Errorf("%d admissions certainly within one window of %s: want at most %d", n, fleetWindow, fleetLimit)
	}
	if denied.Load() == 0 {
		t.Error("nothing was denied: the load did not reach the limit")
	}
	if failed.Load() > 0 {
		t.Errorf("%d answers neither 200 nor 429, the first: %v", failed.Load(), firstErr.Load())
	}
	for i, p := range procs {
		m := p.Metrics()
		if m.Value("flashgate_checks_total") == 0 {
			t.Errorf("sidecar %d decided no check", i)
		}
		if v := m.Value("flashgate_http_authz_rejected_total"); v != 0 {
			t.Errorf("sidecar %d rejected %v checks", i, v)
		}
		if !m.Has("flashgate_conns_open") || m.Value("flashgate_conns_open", "listener", "http_authz") == 0 {
			t.Errorf("sidecar %d shows no open connection of listener http_authz", i)
		}
	}
}
