package envoy

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	ratelimitfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/flashgate/flashgate/enforce"
	"github.com/flashgate/flashgate/rls"
	"github.com/flashgate/flashgate/window/memory"
)

const rateLimitFilter = "envoy.filters.http.ratelimit"

// TestRateLimitExample: ratelimit/envoy.yaml is a valid Envoy config whose
// rate-limit filter asks flashgate's cluster (gRPC v3, a short timeout) for
// the domain of ratelimit/config, and every descriptor its routes' actions
// make has a rule there: asked of flashgate's RLS on that directory, each
// gets a limit.
func TestRateLimitExample(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("ratelimit", "envoy.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	bs, err := loadBootstrap(data)
	if err != nil {
		t.Fatalf("ratelimit/envoy.yaml: %v", err)
	}
	listeners := bs.GetStaticResources().GetListeners()
	if len(listeners) != 1 {
		t.Fatalf("%d listeners, want 1", len(listeners))
	}
	hcm := findHCM(t, listeners[0])
	var rl *ratelimitfilterv3.RateLimit
	for _, f := range hcm.GetHttpFilters() {
		if f.GetName() == rateLimitFilter {
			rl = unpack(t, f.GetTypedConfig(), &ratelimitfilterv3.RateLimit{})
		}
	}
	if rl == nil {
		t.Fatalf("no %s filter", rateLimitFilter)
	}
	svc := rl.GetRateLimitService()
	if svc.GetTransportApiVersion().String() != "V3" || svc.GetGrpcService().GetEnvoyGrpc().GetClusterName() != "flashgate" {
		t.Errorf("rate_limit_service = %v, want V3 to cluster flashgate", svc)
	}
	if d := rl.GetTimeout().AsDuration(); d <= 0 || d.Milliseconds() > 250 {
		t.Errorf("timeout %v, want explicit and short", d)
	}
	var found bool
	for _, c := range bs.GetStaticResources().GetClusters() {
		if c.GetName() == "flashgate" {
			found = true
			if got := endpoints(c); len(got) != 1 || got[0] != "127.0.0.1:9191" {
				t.Errorf("cluster flashgate endpoints %v, want flashgate's gRPC port 127.0.0.1:9191", got)
			}
		}
	}
	if !found {
		t.Fatal("no cluster flashgate")
	}

	cfg, err := rls.LoadDir("ratelimit")
	if err != nil {
		t.Fatalf("ratelimit/config: %v", err)
	}
	mem, err := memory.New(memory.Options{})
	if err != nil {
		t.Fatal(err)
	}
	core, err := enforce.New(enforce.Options{Limiter: mem, Registerer: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := rls.NewServer(cfg, rls.Options{Core: core})
	if err != nil {
		t.Fatal(err)
	}
	asked := 0
	for _, vh := range hcm.GetRouteConfig().GetVirtualHosts() {
		for _, r := range vh.GetRoutes() {
			for _, limit := range r.GetRoute().GetRateLimits() {
				d := descriptorOf(t, limit)
				resp, err := srv.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{
					Domain: rl.GetDomain(), Descriptors: []*ratelimitv3.RateLimitDescriptor{d},
				})
				if err != nil {
					t.Fatal(err)
				}
				if st := resp.GetStatuses(); len(st) != 1 || st[0].GetCurrentLimit() == nil {
					t.Errorf("descriptor %v of route %s has no rule in domain %s: %v", d, r.GetMatch(), rl.GetDomain(), st)
				}
				asked++
			}
		}
	}
	if asked == 0 {
		t.Fatal("no route has rate_limits")
	}
}

// descriptorOf makes the descriptor Envoy would send for limit's actions,
// with sample values.
func descriptorOf(t *testing.T, limit *routev3.RateLimit) *ratelimitv3.RateLimitDescriptor {
	t.Helper()
	d := &ratelimitv3.RateLimitDescriptor{}
	for _, a := range limit.GetActions() {
		switch {
		case a.GetRequestHeaders() != nil:
			d.Entries = append(d.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: a.GetRequestHeaders().GetDescriptorKey(), Value: "u1"})
		case a.GetRemoteAddress() != nil:
			d.Entries = append(d.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: "remote_address", Value: "203.0.113.9"})
		default:
			t.Fatalf("action %v: extend descriptorOf", a)
		}
	}
	return d
}
