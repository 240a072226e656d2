package host_test

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
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/test/bufconn"

	"github.com/flashgate/flashgate/host"
)

// okAuth admits every check.
type okAuth struct {
	authv3.UnimplementedAuthorizationServer
}

func (okAuth) Check(context.Context, *authv3.CheckRequest) (*authv3.CheckResponse, error) {
	return &authv3.CheckResponse{Status: &status.Status{}}, nil
}

// okRLS answers OK to every call.
type okRLS struct {
	rlsv3.UnimplementedRateLimitServiceServer
}

func (okRLS) ShouldRateLimit(context.Context, *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	return &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK}, nil
}

// startBufconn serves a host with both services registered over an
// in-memory listener and returns it with a client connection to it.
func startBufconn(t *testing.T, reg *prometheus.Registry) (*host.Host, *grpc.ClientConn) {
	t.Helper()
	lis := bufconn.Listen(1 << 20)
	h, err := host.New(host.Options{GRPC: lis, GRPCMaxConns: 8, Registry: reg})
	if err != nil {
		t.Fatal(err)
	}
	authv3.RegisterAuthorizationServer(h, okAuth{})
	rlsv3.RegisterRateLimitServiceServer(h, okRLS{})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = h.Serve(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done; h.Stop() })
	conn, err := grpc.NewClient("passthrough:///bufnet",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return h, conn
}

// TestHealthAndShutdown: health of "" and of every registered service, and
// /readyz, follow SetServing; Shutdown turns them NOT_SERVING for good.
func TestHealthAndShutdown(t *testing.T) {
	reg := prometheus.NewRegistry()
	h, conn := startBufconn(t, reg)
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
	web := httptest.NewServer(h.HTTPHandler())
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
	services := []string{"", authv3.Authorization_ServiceDesc.ServiceName, rlsv3.RateLimitService_ServiceDesc.ServiceName}

	for _, svc := range services {
		if got := status(svc); got != healthpb.HealthCheckResponse_NOT_SERVING {
			t.Errorf("%q before SetServing: %v", svc, got)
		}
	}
	if code, _ := get("/readyz"); code != http.StatusServiceUnavailable {
		t.Errorf("/readyz before ready: %d", code)
	}
	h.SetServing(true) // what serve does once the backend is warm
	for _, svc := range services {
		if got := status(svc); got != healthpb.HealthCheckResponse_SERVING {
			t.Errorf("%q after SetServing: %v", svc, got)
		}
	}
	if code, _ := get("/readyz"); code != http.StatusOK {
		t.Errorf("/readyz: %d", code)
	}
	if code, _ := get("/healthz"); code != http.StatusOK {
		t.Errorf("/healthz: %d", code)
	}
	if _, err := authv3.NewAuthorizationClient(conn).Check(ctx, &authv3.CheckRequest{}); err != nil {
		t.Errorf("Check: %v", err)
	}
	if _, err := rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{}); err != nil {
		t.Errorf("ShouldRateLimit: %v", err)
	}
	if _, metrics := get("/metrics"); !strings.Contains(metrics, `flashgate_conns_open{listener="grpc"} 1`) {
		t.Errorf("/metrics lacks the gRPC listener's open connection:\n%s", metrics)
	}

	sctx, scancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer scancel()
	if err := h.Shutdown(sctx); err != nil {
		t.Fatal(err)
	}
	if code, _ := get("/readyz"); code != http.StatusServiceUnavailable {
		t.Errorf("/readyz after Shutdown: %d", code)
	}
	h.SetServing(true)
	if h.Serving() {
		t.Error("SetServing(true) after Shutdown took effect")
	}
}

// TestPprof: /debug/pprof/ is served only when asked for.
func TestPprof(t *testing.T) {
	for _, on := range []bool{false, true} {
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		h, err := host.New(host.Options{GRPC: lis, Pprof: on})
		if err != nil {
			t.Fatal(err)
		}
		rec := httptest.NewRecorder()
		h.HTTPHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/debug/pprof/", nil))
		if got := rec.Code == http.StatusOK; got != on {
			t.Errorf("Pprof %v: /debug/pprof/ answered %d", on, rec.Code)
		}
		h.Stop()
		lis.Close()
	}
}

func TestNewNeedsAGRPCListener(t *testing.T) {
	if _, err := host.New(host.Options{}); err == nil {
		t.Fatal("New without a gRPC listener succeeded")
	}
}

// TestShutdownEndsAnIdleWatch: a health Watch stream its client leaves
// open gets NOT_SERVING on Shutdown and then ends (status OK), so that
// the graceful stop does not wait for it until its deadline.
func TestShutdownEndsAnIdleWatch(t *testing.T) {
	h, conn := startBufconn(t, prometheus.NewRegistry())
	h.SetServing(true)
	stream, err := healthpb.NewHealthClient(conn).Watch(context.Background(), &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if r, err := stream.Recv(); err != nil || r.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("first status %v %v, want SERVING", r.GetStatus(), err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := h.Shutdown(ctx); err != nil {
		t.Errorf("Shutdown with an idle Watch open: %v", err)
	}
	if r, err := stream.Recv(); err != nil || r.GetStatus() != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Errorf("after Shutdown: %v %v, want NOT_SERVING", r.GetStatus(), err)
	}
	if _, err := stream.Recv(); err != io.EOF {
		t.Errorf("after NOT_SERVING: %v, want the stream ended (EOF)", err)
	}
}
