package main

import (
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/flashgate/flashgate/internal/testing/logtest"
	"github.com/flashgate/flashgate/window/redistest"
)

// loopbackPort returns a port free on 127.0.0.1 a moment ago.
func loopbackPort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
}

// httpGet returns the status and body of GET url, or 0 when it fails.
func httpDo(t *testing.T, method, url, body string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestBinaryAsRatelimit runs the binary as /bin/ratelimit with Envoy
// Gateway's default environment (TLS and xDS left out, addresses on
// loopback, RUNTIME_ROOT on testdata) and a real Redis: /healthcheck turns
// 200, ShouldRateLimit answers by the runtime directory's config over gRPC
// and POST /json, DEBUG_PORT serves /metrics, and the settings it does not
// honour (USE_STATSD, STATSD_PORT) are logged once.
func TestBinaryAsRatelimit(t *testing.T) {
	rs := redistest.Start(t)
	bin := filepath.Join(t.TempDir(), "ratelimit")
	if err := os.Symlink(buildBinary(t), bin); err != nil {
		t.Fatal(err)
	}
	root, err := filepath.Abs("testdata/ratelimit-runtime")
	if err != nil {
		t.Fatal(err)
	}
	port, grpcPort, debugPort := loopbackPort(t), loopbackPort(t), loopbackPort(t)
	vars := egEnv(rs.Addr(), root)
	for k, v := range map[string]string{"HOST": "127.0.0.1", "PORT": port, "GRPC_HOST": "127.0.0.1", "GRPC_PORT": grpcPort,
		"DEBUG_HOST": "127.0.0.1", "DEBUG_PORT": debugPort} {
		vars[k] = v
	}
	cmd := exec.Command(bin)
	for k, v := range vars {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	logs := &logtest.Buffer{}
	exited := startProcess(t, cmd, logs)

	base := "http://127.0.0.1:" + port
	waitFor(t, eventually, "/healthcheck 200", func() bool {
		code, _ := httpDo(t, http.MethodGet, base+"/healthcheck", "")
		return code == http.StatusOK
	})
	if code, body := httpDo(t, http.MethodGet, base+"/healthcheck", ""); code != http.StatusOK || body != "OK" {
		t.Fatalf("/healthcheck: %d %q", code, body)
	}

	conn, err := grpc.NewClient("127.0.0.1:"+grpcPort, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "eg",
		Descriptors: []*ratelimitv3.RateLimitDescriptor{{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "client", Value: "a"}}}}})
	if err != nil || resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
		t.Fatalf("ShouldRateLimit: %v, %v\n%s", resp, err, logs)
	}

	// ratelimit's JSON form: the second of 2 per minute, then 429.
	req := `{"domain":"eg","descriptors":[{"entries":[{"key":"client","value":"a"}]}]}`
	for i, want := range []int{http.StatusOK, http.StatusTooManyRequests} {
		code, body := httpDo(t, http.MethodPost, base+"/json", req)
		wantCode := map[int]string{200: `"overallCode":"OK"`, 429: `"overallCode":"OVER_LIMIT"`}[want]
		if code != want || !strings.Contains(body, wantCode) {
			t.Fatalf("/json #%d: %d %s, want %d with %s", i+1, code, body, want, wantCode)
		}
	}
	if code, _ := httpDo(t, http.MethodPost, base+"/json", "{not json"); code != http.StatusBadRequest {
		t.Errorf("/json with a bad body: %d, want 400", code)
	}
	if code, body := httpDo(t, http.MethodGet, "http://127.0.0.1:"+debugPort+"/metrics", ""); code != http.StatusOK ||
		!regexp.MustCompile(`flashgate_rls_requests_total\{[^}]*domain="eg"`).MatchString(body) {
		t.Errorf("DEBUG_PORT /metrics: %d, want flashgate_rls_requests_total of domain eg:\n%.2000s", code, body)
	}

	out := logs.String()
	if n := strings.Count(out, `msg="ratelimit settings not honoured"`); n != 1 {
		t.Errorf("the not honoured settings logged %d times, want once:\n%s", n, out)
	}
	for _, v := range []string{"USE_STATSD=", "STATSD_PORT="} {
		if !strings.Contains(out, v) {
			t.Errorf("the log does not name %s as not honoured:\n%s", v, out)
		}
	}

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		exited <- err
		if err != nil {
			t.Fatalf("exit: %v\n%s", err, logs)
		}
	case <-time.After(eventually):
		t.Fatalf("still running after SIGTERM\n%s", logs)
	}
}
