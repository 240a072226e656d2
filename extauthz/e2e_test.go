package extauthz

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/test/bufconn"
)

// TestEndToEnd runs the Check server, health and reflection on a real gRPC
// server over an in-memory connection, with the HTTP handler beside it.
func TestEndToEnd(t *testing.T) {
	e := newEnv(t, nil, nil)
	gs, conn := serveBufconn(t, e.srv)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	hc := healthpb.NewHealthClient(conn)
	status := func(svc string) healthpb.HealthCheckResponse_ServingStatus {
		t.Helper()
		r, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: svc})
		if err != nil {
			t.Fatalf("health %q: %v", svc, err)
		}
		return r.GetStatus()
	}
	web := httptest.NewServer(e.srv.HTTPHandler())
	defer web.Close()
	get := func(path string) (int, string) {
		t.Helper()
		resp, err := http.Get(web.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}

	if got := status(HealthService); got != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Errorf("before SetServing: %v", got)
	}
	if code, _ := get("/readyz"); code != http.StatusServiceUnavailable {
		t.Errorf("/readyz before ready: %d", code)
	}
	e.srv.SetServing(true) // what serve does once the backend is warm
	if got := status(""); got != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("after SetServing: %v", got)
	}
	if code, _ := get("/readyz"); code != http.StatusOK {
		t.Errorf("/readyz: %d", code)
	}
	if code, _ := get("/healthz"); code != http.StatusOK {
		t.Errorf("/healthz: %d", code)
	}

	client := authv3.NewAuthorizationClient(conn)
	r := req{path: "/api/coupon/x?y=1", headers: uid("e2e")}
	allowed := 0
	for range 7 {
		resp, err := client.Check(ctx, r.proto())
		if read(t, resp, err).allowed {
			allowed++
		}
	}
	if allowed != 5 {
		t.Errorf("allowed %d over gRPC, want 5", allowed)
	}
	_, metrics := get("/metrics")
	for _, want := range []string{
		`flashgate_checks_total{decision="denied",domain="flashsale",rule="coupon_per_uid"} 2`,
		`flashgate_check_duration_seconds_count 7`,
		`flashgate_config_reloads_total{result="error"} 0`,
	} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	if strings.Contains(metrics, "e2e") {
		t.Error("/metrics carries a request value")
	}

	sctx, scancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer scancel()
	if err := e.srv.Shutdown(sctx, gs); err != nil {
		t.Fatal(err)
	}
	if code, _ := get("/readyz"); code != http.StatusServiceUnavailable {
		t.Errorf("/readyz after Shutdown: %d", code)
	}
	e.srv.SetServing(true)
	if e.srv.Serving() {
		t.Error("SetServing(true) after Shutdown took effect")
	}
}

// serveBufconn serves srv on a real gRPC server with GRPCServerOptions over
// an in-memory listener and returns the server and a client connection to
// it; both are closed when the test ends.
func serveBufconn(t *testing.T, srv *Server) (*grpc.Server, *grpc.ClientConn) {
	t.Helper()
	lis := bufconn.Listen(1 << 20)
	gs := srv.NewGRPCServer()
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(gs.Stop)
	conn, err := grpc.NewClient("passthrough:///bufnet",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return gs, conn
}
