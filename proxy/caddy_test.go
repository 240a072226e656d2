package proxy

import (
	"net/http"
	"strings"
	"testing"

	"github.com/flashgate/flashgate/internal/testing/proxytest"
)

const caddyfile = "caddy/Caddyfile"

// caddySevere counts caddy's log lines at warn level and above.
func caddySevere(log string) int {
	n := 0
	for _, level := range []string{"warn", "error", "panic", "fatal"} {
		n += strings.Count(log, `"level":"`+level+`"`)
	}
	return n
}

// TestCaddyAppErrorsStayTheApps: handle_errors turns only the check's
// failures into 503; the app's are Caddy's own answers.
func TestCaddyAppErrorsStayTheApps(t *testing.T) {
	r := newRig(t, proxytest.StartCaddy, caddyfile)
	r.upstream.Close()
	a := get(t, r.proxy.Addr(), "/api/coupon/claim", "x-uid: frank")
	if a.status != http.StatusBadGateway || a.header.Get("Retry-After") != "" {
		t.Errorf("app down: %v, want Caddy's 502 without Retry-After", a)
	}
}
