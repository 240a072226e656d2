package checkreq

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strings"
	"time"
)

// HTTPClient returns a client of flashgate's HTTP front-end at addr
// ("host:port", "http://host:port" or "unix:///path") keeping up to conns
// idle keep-alive connections, each call bounded by timeout, and the base
// URL its requests go to.
func HTTPClient(addr string, conns int, timeout time.Duration) (*http.Client, string, error) {
	tr := &http.Transport{
		MaxIdleConns:        conns,
		MaxIdleConnsPerHost: conns,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
	}
	base := ""
	switch {
	case addr == "":
		return nil, "", fmt.Errorf("--addr is empty")
	case strings.HasPrefix(addr, "unix://"):
		path := strings.TrimPrefix(addr, "unix://")
		var d net.Dialer
		tr.DialContext = func(ctx context.Context, _, _ string) (net.Conn, error) {
			return d.DialContext(ctx, "unix", path)
		}
		base = "http://flashgate"
	case strings.HasPrefix(addr, "http://"):
		base = strings.TrimSuffix(addr, "/")
	case strings.Contains(addr, "://"):
		return nil, "", fmt.Errorf("--addr %q: want host:port, http://host:port or unix:///path", addr)
	default:
		base = "http://" + addr
	}
	return &http.Client{Transport: tr, Timeout: timeout}, base, nil
}

// HTTPRequest returns the request Envoy's ext_authz http_service sends to
// base for s: s's method, base followed by s.Path, s.Host as its Host, and
// s.Headers but the pseudo-headers (which the request line and Host
// carry). The peer address is the client's own: s.IP, ID and
// ContextExtensions do not travel.
func HTTPRequest(ctx context.Context, base string, s Spec) (*http.Request, error) {
	req, err := http.NewRequestWithContext(ctx, s.Method, base+s.Path, nil)
	if err != nil {
		return nil, fmt.Errorf("build the request: %w", err)
	}
	req.Host = s.Host
	for k, v := range s.Headers {
		if !strings.HasPrefix(k, ":") {
			req.Header.Set(k, v)
		}
	}
	return req, nil
}

// HTTPVerdict classifies an answer of the HTTP front-end by its status:
// 2xx allowed; 400, 431 and 5xx a failed check (err names the status);
// any other status (429, or 401/403 with X-Flashgate-Deny-Status) denied.
func HTTPVerdict(status int) (allowed bool, err error) {
	switch {
	case status >= 200 && status < 300:
		return true, nil
	case status == http.StatusBadRequest || status == http.StatusRequestHeaderFieldsTooLarge || status >= 500:
		return false, fmt.Errorf("HTTP %d %s", status, http.StatusText(status))
	}
	return false, nil
}
