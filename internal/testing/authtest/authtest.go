package authtest

import (
	"context"
	"maps"
	"net"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"

	"github.com/flashgate/flashgate/descriptors"
	"github.com/flashgate/flashgate/enforce"
	"github.com/flashgate/flashgate/host"
	"github.com/flashgate/flashgate/window"
)

// StartGRPC serves auth, with health SERVING, on a loopback port until the
// test ends, on the gRPC server flashgate serves with (package host's
// options and limits) and grpc-go's own codec, and returns its address.
// The codec is grpc-go's, not the ext_authz front-end's: the clients under
// test send well-formed requests, and a harness imports no front-end.
func StartGRPC(t testing.TB, auth authv3.AuthorizationServer) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h, err := host.New(host.Options{GRPC: lis})
	if err != nil {
		t.Fatal(err)
	}
	authv3.RegisterAuthorizationServer(h, auth)
	h.SetServing(true)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = h.Serve(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done; h.Stop() })
	return lis.Addr().String()
}

// LimitAuth is an ext_authz server that admits the first Limit requests of
// each x-uid, for ever, and denies the rest with a 429; it answers as
// flashgate's server does for a rule per_uid of Limit requests a second
// (its rate-limit headers, both families, and its problem+json body, made
// by package enforce) and records what it saw. It is safe for concurrent
// use.
type LimitAuth struct {
	authv3.UnimplementedAuthorizationServer
	limit  int
	policy *enforce.Policy

	// mu guards the fields below.
	mu    sync.Mutex
	count map[string]int
	ips   map[string]bool
	last  *authv3.CheckRequest
}

var _ authv3.AuthorizationServer = (*LimitAuth)(nil)

// NewLimitAuth returns a LimitAuth that admits limit requests per x-uid.
func NewLimitAuth(limit int) *LimitAuth {
	return &LimitAuth{limit: limit, count: map[string]int{}, ips: map[string]bool{},
		policy: enforce.NewPolicy("per_uid", window.Limit{Requests: limit, Window: time.Second})}
}

// Counts returns how many requests each x-uid sent (the header's value; ""
// for none).
func (a *LimitAuth) Counts() map[string]int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return maps.Clone(a.count)
}

// IPs returns the set of client addresses (source.address) seen.
func (a *LimitAuth) IPs() map[string]bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return maps.Clone(a.ips)
}

// Last returns the last request received, or nil.
func (a *LimitAuth) Last() *authv3.CheckRequest {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.last
}

// Header returns the HeaderValueOption k: v, as flashgate's responses carry
// their headers.
func Header(k, v string) *corev3.HeaderValueOption {
	return &corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: k, Value: v}}
}

// Check implements service Authorization.
func (a *LimitAuth) Check(_ context.Context, req *authv3.CheckRequest) (*authv3.CheckResponse, error) {
	ans := a.answer(req)
	var hs []*corev3.HeaderValueOption
	ans.Headers(enforce.FamiliesBoth, func(k, v string) { hs = append(hs, Header(k, v)) })
	if !ans.Denied {
		return &authv3.CheckResponse{
			Status:       &status.Status{Code: int32(codes.OK)},
			HttpResponse: &authv3.CheckResponse_OkResponse{OkResponse: &authv3.OkHttpResponse{ResponseHeadersToAdd: hs}},
		}, nil
	}
	return &authv3.CheckResponse{
		Status: &status.Status{Code: int32(codes.ResourceExhausted)},
		HttpResponse: &authv3.CheckResponse_DeniedResponse{DeniedResponse: &authv3.DeniedHttpResponse{
			Status:  &typev3.HttpStatus{Code: typev3.StatusCode_TooManyRequests},
			Headers: hs,
			Body:    ans.Problem(),
		}},
	}, nil
}

// answer counts and records req and returns its answer.
func (a *LimitAuth) answer(req *authv3.CheckRequest) enforce.Answer {
	uid := req.GetAttributes().GetRequest().GetHttp().GetHeaders()["x-uid"]
	a.mu.Lock()
	a.count[uid]++
	n := a.count[uid]
	a.ips[req.GetAttributes().GetSource().GetAddress().GetSocketAddress().GetAddress()] = true
	a.last = req
	a.mu.Unlock()
	ans := enforce.Answer{Policies: []*enforce.Policy{a.policy}, Binding: 0,
		States: []enforce.State{{Policy: a.policy, Remaining: a.limit - n, T: 1}}}
	if n > a.limit {
		ans.States[0].Remaining, ans.Denied, ans.RetryAfter = 0, true, time.Second
	}
	return ans
}

// Decide implements httpauthz.Decider: it decides req as Check decides a
// CheckRequest holding req's method, path, peer and the headers a
// LimitAuth test reads (x-uid, x-forwarded-for, cookie), and records that
// CheckRequest.
func (a *LimitAuth) Decide(_ context.Context, req descriptors.Request, out *enforce.Answer) error {
	headers := map[string]string{}
	for _, name := range []string{"x-uid", "x-forwarded-for", "cookie"} {
		if v, ok := req.Header(name); ok {
			headers[name] = v
		}
	}
	*out = a.answer(&authv3.CheckRequest{Attributes: &authv3.AttributeContext{
		Source: &authv3.AttributeContext_Peer{Address: &corev3.Address{Address: &corev3.Address_SocketAddress{
			SocketAddress: &corev3.SocketAddress{Address: req.PeerAddress()}}}},
		Request: &authv3.AttributeContext_Request{Http: &authv3.AttributeContext_HttpRequest{
			Method: req.Method(), Path: req.Path(), Host: req.Authority(), Headers: headers}},
	}})
	return nil
}

// Headers implements httpauthz.Decider: both families.
func (a *LimitAuth) Headers() enforce.Families { return enforce.FamiliesBoth }
