package extauthz

import (
	"context"
	"strconv"
	"testing"
	"time"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/flashgate/flashgate/descriptors"
	"github.com/flashgate/flashgate/enforce"
	"github.com/flashgate/flashgate/window"
	"github.com/flashgate/flashgate/window/guard"
	"github.com/flashgate/flashgate/window/memory"
	"github.com/flashgate/flashgate/window/testclock"
)

func benchServer(b *testing.B, lim window.Limiter) *Server {
	b.Helper()
	cfg, err := descriptors.ExampleConfig()
	if err != nil {
		b.Fatal(err)
	}
	core, err := enforce.New(enforce.Options{Limiter: lim, Registerer: prometheus.NewRegistry()})
	if err != nil {
		b.Fatal(err)
	}
	s, err := NewServer(cfg, Options{Core: core})
	if err != nil {
		b.Fatal(err)
	}
	return s
}

// BenchmarkCheckMemory: the example's three rules (uid, device, IP) on the
// Memory backend, admitted (many users, so windows never fill).
func BenchmarkCheckMemory(b *testing.B) {
	mem, err := memory.New(memory.Options{})
	if err != nil {
		b.Fatal(err)
	}
	s := benchServer(b, mem)
	reqs := make([]req, 4096)
	for i := range reqs {
		reqs[i] = req{path: "/api/coupon/claim?x=1", ip: "10.1." + strconv.Itoa(i/256) + "." + strconv.Itoa(i%256),
			headers: map[string]string{"x-uid": "user-" + strconv.Itoa(i), "x-device-fp": "dev-" + strconv.Itoa(i)}}
	}
	protos := make([]*authv3.CheckRequest, len(reqs))
	for i := range reqs {
		protos[i] = reqs[i].proto()
	}
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		if _, err := s.Check(ctx, protos[i%len(protos)]); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkCheckAdmitted: the example's three rules on the Memory backend,
// every check admitted: 4096 users, the clock a second on after each has
// sent one, so each window holds one admission at most.
func BenchmarkCheckAdmitted(b *testing.B) {
	clk := testclock.New()
	mem, err := memory.New(memory.Options{Now: clk.Now})
	if err != nil {
		b.Fatal(err)
	}
	s := benchServer(b, mem)
	protos := make([]*authv3.CheckRequest, 4096)
	for i := range protos {
		protos[i] = req{path: "/api/coupon/claim?x=1", ip: "10.1." + strconv.Itoa(i/256) + "." + strconv.Itoa(i%256),
			headers: map[string]string{"x-uid": "user-" + strconv.Itoa(i), "x-device-fp": "dev-" + strconv.Itoa(i)}}.proto()
	}
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		if i%len(protos) == 0 {
			clk.Advance(time.Second)
		}
		resp, err := s.Check(ctx, protos[i%len(protos)])
		if err != nil || resp.GetOkResponse() == nil {
			b.Fatalf("check %d: %v %v", i, resp, err)
		}
	}
}

// BenchmarkCheckGuardDeny: a user over its limit, refused by the Guard's
// local over-limit cache without reaching the backend.
func BenchmarkCheckGuardDeny(b *testing.B) {
	mem, err := memory.New(memory.Options{})
	if err != nil {
		b.Fatal(err)
	}
	g, err := guard.NewGuard(mem, guard.GuardOptions{})
	if err != nil {
		b.Fatal(err)
	}
	defer g.Close()
	s := benchServer(b, g)
	r := req{path: "/api/coupon/claim", headers: map[string]string{"x-uid": "hot", "x-device-fp": "hot"}}.proto()
	ctx := context.Background()
	for range 6 {
		_, _ = s.Check(ctx, r)
	}
	resp, _ := s.Check(ctx, r)
	if resp.GetDeniedResponse() == nil {
		b.Fatal("not denied")
	}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		_, _ = s.Check(ctx, r)
	}
}

// BenchmarkMapping: the request mapping alone (three hits).
func BenchmarkMapping(b *testing.B) {
	cfg, err := descriptors.ExampleConfig()
	if err != nil {
		b.Fatal(err)
	}
	r := req{path: "/api/coupon/claim?x=1", headers: map[string]string{"x-uid": "user-1", "x-device-fp": "dev-1"}}.proto()
	p := descriptors.NewMapper(cfg, window.Keys{})
	var m mapping
	b.ReportAllocs()
	for b.Loop() {
		m.Reset()
		m.grpc.set(r)
		m.mapRequest(p, &m.grpc, false)
	}
}

// BenchmarkDecisionOnly is the Memory backend's own cost for the same three
// hits, to subtract from BenchmarkCheckMemory.
func BenchmarkDecisionOnly(b *testing.B) {
	mem, err := memory.New(memory.Options{})
	if err != nil {
		b.Fatal(err)
	}
	keys := window.Keys{}
	hits := make([][]window.Hit, 4096)
	for i := range hits {
		u := strconv.Itoa(i)
		hits[i] = []window.Hit{
			{Key: keys.Key("coupon_per_uid", "user-"+u), Rule: "coupon_per_uid", Limit: window.Limit{Requests: 5, Window: time.Second}},
			{Key: keys.Key("coupon_per_device", "dev-"+u), Rule: "coupon_per_device", Limit: window.Limit{Requests: 10, Window: time.Second}},
			{Key: keys.Key("per_ip", "10.0.0."+u), Rule: "per_ip", Limit: window.Limit{Requests: 100, Window: time.Second}},
		}
	}
	ctx := context.Background()
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		if _, err := mem.Decide(ctx, hits[i%len(hits)]); err != nil {
			b.Fatal(err)
		}
	}
}
