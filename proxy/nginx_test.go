package proxy

import (
	"bytes"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/flashgate/flashgate/internal/proxytest"
)

const nginxConf = "nginx/flashgate.conf"

func TestNginx(t *testing.T) {
	t.Run("limits", func(t *testing.T) { checkLimits(t, newRig(t, proxytest.StartNginx, nginxConf)) })
	t.Run("spoofed headers", func(t *testing.T) { checkSpoofing(t, newRig(t, proxytest.StartNginx, nginxConf), "403") })
	t.Run("paths", func(t *testing.T) {
		// $uri: decoded, dot segments resolved, slashes merged.
		checkPaths(t, newRig(t, proxytest.StartNginx, nginxConf), map[string]struct {
			want    string
			refused bool
		}{
			"/api/coupon/x?q=%0a":     {want: "/api/coupon/x?q=%0a"},
			"/api/%63oupon/x":         {want: "/api/coupon/x"},
			"//api//coupon/x":         {want: "/api/coupon/x"},
			"/a/../api/coupon/./x":    {want: "/api/coupon/x"},
			"/api/%2e%2e/api/coupon/": {want: "/api/coupon/"},
			"/api/coupon/a%0d%0ab":    {refused: true},
			"/api/coupon/a%09b":       {refused: true},
		})
	})
	t.Run("fail closed", func(t *testing.T) { checkFailClosed(t, newRig(t, proxytest.StartNginx, nginxConf)) })
}

// severe matches nginx error-log lines at warn level and above.
var severe = regexp.MustCompile(`\[(warn|error|crit|alert|emerg)\]`)

// TestNginxDenialFloodLogsNothing: denials (403 on the wire, 429 to the
// client) write no error-log line each, whereas flashgate's own 429 through
// auth_request would write one per request, which the same flood proves
// against the config without X-Flashgate-Deny-Status.
func TestNginxDenialFloodLogsNothing(t *testing.T) {
	const n = 400
	r := newRig(t, proxytest.StartNginx, nginxConf)
	counts := flood(t, r.proxy.Addr(), "mallory", n, 4)
	if counts[http.StatusOK] != limit || counts[http.StatusTooManyRequests] != n-limit {
		t.Fatalf("flood answers %v, want %d × 200 and %d × 429", counts, limit, n-limit)
	}
	log := r.proxy.ErrorLog()
	if bad := severe.FindAllString(log, -1); len(bad) > 0 {
		t.Errorf("%d error-log lines at warn or above after %d denials:\n%s", len(bad), n-limit, log)
	}
	if lines := strings.Count(log, "\n"); lines > n/10 {
		t.Errorf("%d error-log lines (any level) after %d denials, want far fewer than one each:\n%s", lines, n-limit, log)
	}

	// Without the marker, flashgate answers 429 itself: auth_request turns
	// each into a 500 (here 503) and an error-log line.
	shipped, err := os.ReadFile(nginxConf)
	if err != nil {
		t.Fatal(err)
	}
	marker := []byte("        proxy_set_header X-Flashgate-Deny-Status 403;\n")
	if !bytes.Contains(shipped, marker) {
		t.Fatalf("%s no longer sets X-Flashgate-Deny-Status: update this test", nginxConf)
	}
	unmarked := filepath.Join(t.TempDir(), "unmarked.conf")
	if err := os.WriteFile(unmarked, bytes.Replace(shipped, marker, nil, 1), 0o600); err != nil {
		t.Fatal(err)
	}
	r = newRig(t, proxytest.StartNginx, unmarked)
	counts = flood(t, r.proxy.Addr(), "mallory", 50, 2)
	got := strings.Count(r.proxy.ErrorLog(), "auth request unexpected status: 429")
	if counts[http.StatusServiceUnavailable] != 50-limit || got != 50-limit {
		t.Errorf("without the marker: answers %v and %d error-log lines, want %d each (the log this config avoids)", counts, got, 50-limit)
	}
}

// TestNginxShippedConfigValid runs nginx -t on the shipped file as it is.
func TestNginxShippedConfigValid(t *testing.T) {
	conf, err := os.ReadFile(nginxConf)
	if err != nil {
		t.Fatal(err)
	}
	if err := proxytest.NginxTest(t, conf); err != nil {
		t.Fatal(err)
	}
}
