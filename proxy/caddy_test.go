package proxy

import (
	"net/http"
	"strings"
	"testing"

	"github.com/flashgate/flashgate/internal/proxytest"
)

const caddyfile = "caddy/Caddyfile"

func TestCaddy(t *testing.T) {
	t.Run("limits", func(t *testing.T) { checkLimits(t, newRig(t, proxytest.StartCaddy, caddyfile)) })
	t.Run("spoofed headers", func(t *testing.T) { checkSpoofing(t, newRig(t, proxytest.StartCaddy, caddyfile), "") })
	t.Run("paths", func(t *testing.T) {
		// The decoded path; paths not in normal form are refused.
		checkPaths(t, newRig(t, proxytest.StartCaddy, caddyfile), map[string]struct {
			want    string
			refused bool
		}{
			"/api/coupon/x?q=%0a":     {want: "/api/coupon/x?q=%0a"},
			"/api/%63oupon/x":         {want: "/api/coupon/x?"},
			"//api//coupon/x":         {refused: true},
			"/a/../api/coupon/x":      {refused: true},
			"/api/coupon/./x":         {refused: true},
			"/api/%2e%2e/api/coupon/": {refused: true},
			"/api/x%2F%2Fcoupon/":     {refused: true},
		})
	})
	t.Run("fail closed", func(t *testing.T) { checkFailClosed(t, newRig(t, proxytest.StartCaddy, caddyfile)) })
	t.Run("app errors stay the app's", func(t *testing.T) {
		// handle_errors turns only the check's failures into 503.
		r := newRig(t, proxytest.StartCaddy, caddyfile)
		r.upstream.Close()
		a := get(t, r.proxy.Addr(), "/api/coupon/claim", "x-uid: frank")
		if a.status != http.StatusBadGateway || a.header.Get("Retry-After") != "" {
			t.Errorf("app down: %v, want Caddy's 502 without Retry-After", a)
		}
	})
}

// TestCaddyDenialFloodLogsNothing: Caddy passes flashgate's 429 on without
// logging it.
func TestCaddyDenialFloodLogsNothing(t *testing.T) {
	const n = 400
	r := newRig(t, proxytest.StartCaddy, caddyfile)
	counts := flood(t, r.proxy.Addr(), "mallory", n, 4)
	if counts[http.StatusOK] != limit || counts[http.StatusTooManyRequests] != n-limit {
		t.Fatalf("flood answers %v, want %d × 200 and %d × 429", counts, limit, n-limit)
	}
	log := r.proxy.ErrorLog()
	if c := strings.Count(log, `"level":"error"`) + strings.Count(log, `"level":"warn"`); c > 0 {
		t.Errorf("%d warn/error lines after %d denials:\n%s", c, n-limit, log)
	}
}
