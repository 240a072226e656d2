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
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/test/bufconn"
)

// TestEndToEnd runs the Check server on a real gRPC server with its codec
// over an in-memory connection, with its metrics served beside it. (Health,
// /readyz and the graceful stop are the host's: package host tests them.)
func TestEndToEnd(t *testing.T) {
	e := newEnv(t, nil, nil)
	gs, conn := serveBufconn(t, e.srv)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	web := httptest.NewServer(promhttp.HandlerFor(e.reg, promhttp.HandlerOpts{}))
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
	gs.GracefulStop()
}

// serveBufconn serves srv on a real gRPC server with srv's codec over an
// in-memory listener and returns the server and a client connection to
// it; both are closed when the test ends.
func serveBufconn(t *testing.T, srv *Server) (*grpc.Server, *grpc.ClientConn) {
	t.Helper()
	lis := bufconn.Listen(1 << 20)
	gs := grpc.NewServer(grpc.ForceServerCodecV2(srv.Codec()))
	srv.Register(gs)
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
