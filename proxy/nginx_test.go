package proxy

import (
	"bytes"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/flashgate/flashgate/internal/testing/proxytest"
)

const nginxConf = "nginx/flashgate.conf"

// nginxSevere counts nginx error-log lines at warn level and above.
func nginxSevere(log string) int {
	return len(regexp.MustCompile(`\[(warn|error|crit|alert|emerg)\]`).FindAllString(log, -1))
}

// TestNginxDenialWithoutMarkerLogsEach proves the flood test sensitive:
// without X-Flashgate-Deny-Status flashgate answers 429 itself, and
// auth_request turns each into a 500 (here 503) and an error-log line, the
// log the shipped config avoids.
func TestNginxDenialWithoutMarkerLogsEach(t *testing.T) {
	const n = 50
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
	r := newRig(t, proxytest.StartNginx, unmarked)
	counts := flood(t, r.proxy.Addr(), "mallory", n, 2)
	got := strings.Count(r.proxy.ErrorLog(), "auth request unexpected status: 429")
	if counts[http.StatusServiceUnavailable] != n-limit || got != n-limit {
		t.Errorf("without the marker: answers %v and %d error-log lines, want %d each", counts, got, n-limit)
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
