package authtest

import (
	"context"
	"testing"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"

	"github.com/flashgate/flashgate/enforce"
	"github.com/flashgate/flashgate/enforce/enforcetest"
)

// TestLimitAuthAnswersAsFlashgate: the fake's answers carry what
// flashgate's do: both families of rate-limit headers and a problem+json
// 429.
func TestLimitAuthAnswersAsFlashgate(t *testing.T) {
	a := NewLimitAuth(2)
	req := &authv3.CheckRequest{Attributes: &authv3.AttributeContext{Request: &authv3.AttributeContext_Request{
		Http: &authv3.AttributeContext_HttpRequest{Headers: map[string]string{"x-uid": "u"}},
	}}}
	pol := []enforcetest.Policy{{Name: "per_uid", Quota: 2, Window: 1}}
	for i := range 3 {
		resp, err := a.Check(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		if i < 2 {
			h := enforcetest.GRPCHeaders(t, resp.GetOkResponse().GetResponseHeadersToAdd())
			enforcetest.CheckHeaders(t, h, enforcetest.Want{Families: enforce.FamiliesBoth, Policies: pol, Binding: "per_uid",
				States: []enforcetest.State{{Name: "per_uid", Remaining: int64(1 - i), T: 1}}})
			continue
		}
		d := resp.GetDeniedResponse()
		if d.GetStatus().GetCode() != 429 {
			t.Fatalf("third request: %v, want a 429", resp)
		}
		h := enforcetest.GRPCHeaders(t, d.GetHeaders())
		enforcetest.CheckHeaders(t, h, enforcetest.Want{Families: enforce.FamiliesBoth, Policies: pol, Binding: "per_uid",
			Denied: true, RetryAfter: 1, States: []enforcetest.State{{Name: "per_uid", Remaining: 0, T: 1}}})
		enforcetest.CheckProblem(t, h, d.GetBody(), 429, "per_uid")
	}
	if got := a.Counts()["u"]; got != 3 {
		t.Errorf("counted %d requests of u, want 3", got)
	}
}
