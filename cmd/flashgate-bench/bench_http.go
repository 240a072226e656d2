package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"time"

	"google.golang.org/grpc/status"

	"github.com/flashgate/flashgate/internal/checkreq"
)

// httpCaller sends --api http's requests: the request Envoy's http_service
// sends for the one of --shape, the user's x-uid, x-device-fp and, in
// X-Forwarded-For, IP. Its client keeps a keep-alive connection per
// worker; call is safe for concurrent use.
type httpCaller struct {
	client       *http.Client
	url          string
	method, host string
	tmpl         http.Header // the shape's headers, the user's values to set
	fixed        netip.Addr  // --ip, or invalid for one IP per user
}

// newHTTPCaller returns the caller of o's HTTP front-end, once it accepts
// a connection.
func newHTTPCaller(ctx context.Context, o benchOptions) (*httpCaller, error) {
	client, base, err := checkreq.HTTPClient(o.addr, o.concurrency, o.timeout)
	if err != nil {
		return nil, err
	}
	if err := reachable(ctx, o.addr, max(o.timeout, time.Second)); err != nil {
		return nil, err
	}
	spec := requestSpec(o)
	c := &httpCaller{client: client, url: base + spec.Path, method: spec.Method, host: spec.Host, tmpl: http.Header{}}
	for k, v := range spec.Headers {
		if !strings.HasPrefix(k, ":") {
			c.tmpl.Set(k, v)
		}
	}
	if o.ip != "" {
		if c.fixed, err = checkreq.ParseIP(o.ip); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// reachable dials addr (as checkreq.HTTPClient reads it) once, so that an
// unreachable server is reported at once rather than as a run of errors.
func reachable(ctx context.Context, addr string, timeout time.Duration) error {
	network, target := "tcp", strings.TrimSuffix(strings.TrimPrefix(addr, "http://"), "/")
	if path, ok := strings.CutPrefix(addr, "unix://"); ok {
		network, target = "unix", path
	}
	d := net.Dialer{Timeout: timeout}
	c, err := d.DialContext(ctx, network, target)
	if err != nil {
		return fmt.Errorf("cannot reach %s: %w", addr, err)
	}
	return c.Close()
}

func (c *httpCaller) call(ctx context.Context, user int) (bool, error) {
	h := c.tmpl.Clone()
	h["X-Uid"] = []string{fmt.Sprintf("u%07d", user)}
	h["X-Device-Fp"] = []string{fmt.Sprintf("fp%07d", user)}
	h["X-Forwarded-For"] = []string{userIP(c.fixed, user).String()}
	req, err := http.NewRequestWithContext(ctx, c.method, c.url, nil)
	if err != nil {
		return false, err
	}
	req.Header, req.Host = h, c.host
	resp, err := c.client.Do(req)
	if err != nil {
		return false, err
	}
	// Read the answer whole, so that the connection serves the next call.
	_, err = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if err != nil {
		return false, err
	}
	allowed, err := checkreq.HTTPVerdict(resp.StatusCode)
	if err != nil {
		return false, httpStatusError{resp.StatusCode}
	}
	return allowed, nil
}

// httpStatusError is an HTTP answer that is no decision (400, 431, 5xx).
type httpStatusError struct{ status int }

func (e httpStatusError) Error() string { return fmt.Sprintf("HTTP %d", e.status) }

// errorKind names err in errors_by_code: its HTTP status over --api http,
// else its gRPC code (Unknown for a transport error of the HTTP client).
func errorKind(err error) string {
	var he httpStatusError
	if errors.As(err, &he) {
		return he.Error()
	}
	return status.Code(err).String()
}
