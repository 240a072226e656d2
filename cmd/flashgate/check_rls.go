package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/flashgate/flashgate/internal/checkreq"
)

// rlsOverLimit is the code of an OVER_LIMIT answer, as check prints it.
var rlsOverLimit = rlsv3.RateLimitResponse_OVER_LIMIT.String()

// rlsStatus is one descriptor's status of a ShouldRateLimit answer, as
// check --api rls prints it.
type rlsStatus struct {
	Code string `json:"code"`
	// Limit is current_limit's requests per unit, Unit its unit ("" for
	// a descriptor without a limit).
	Limit     uint32 `json:"limit,omitempty"`
	Unit      string `json:"unit,omitempty"`
	Remaining uint32 `json:"remaining"`
	// ResetSeconds is duration_until_reset in seconds (0: none).
	ResetSeconds float64 `json:"reset_seconds,omitempty"`
}

// String formats s for people: "OK 2/minute remaining=1 reset=60s", or
// "OK no-limit".
func (s rlsStatus) String() string {
	if s.Unit == "" {
		return s.Code + " no-limit"
	}
	return fmt.Sprintf("%s %d/%s remaining=%d reset=%gs", s.Code, s.Limit, s.Unit, s.Remaining, s.ResetSeconds)
}

// runCheckRLS sends o.count ShouldRateLimit calls of --domain with the
// --entry descriptor and prints each answer.
func runCheckRLS(ctx context.Context, stdout io.Writer, o checkOptions) error {
	if o.domain == "" || len(o.entries) == 0 {
		return errors.New("--api rls needs --domain and at least one --entry key=value")
	}
	desc, err := parseEntries(o.entries)
	if err != nil {
		return err
	}
	req := &rlsv3.RateLimitRequest{Domain: o.domain, Descriptors: []*ratelimitv3.RateLimitDescriptor{desc}, HitsAddend: o.addend}
	creds, err := o.tls.DialOptions(o.addr)
	if err != nil {
		return err
	}
	conn, err := checkreq.Dial(o.addr, creds...)
	if err != nil {
		return err
	}
	defer conn.Close()
	client := rlsv3.NewRateLimitServiceClient(conn)
	return repeatCheck(ctx, stdout, o, func(ctx context.Context, n int) (checkResult, error) {
		callCtx, cancel := context.WithTimeout(ctx, o.timeout)
		defer cancel()
		start := time.Now()
		resp, err := client.ShouldRateLimit(callCtx, req)
		latency := time.Since(start)
		if err != nil {
			return checkResult{N: n, LatencyMS: ms(latency), Error: err.Error()}, err
		}
		return describeRLS(n, resp, latency), nil
	})
}

// describeRLS reads a RateLimitResponse as Envoy's ratelimit filter
// would: OK is the request let through (200), OVER_LIMIT a 429 (its
// default rate_limited_status) with raw_body as the body.
func describeRLS(n int, resp *rlsv3.RateLimitResponse, latency time.Duration) checkResult {
	res := checkResult{N: n, Code: resp.GetOverallCode().String(), LatencyMS: ms(latency), Status: 200, Allowed: true}
	if resp.GetOverallCode() == rlsv3.RateLimitResponse_OVER_LIMIT {
		res.Allowed, res.Status, res.Body = false, 429, string(resp.GetRawBody())
	}
	res.Headers = headerValueMap(resp.GetResponseHeadersToAdd())
	res.UpstreamHeaders = headerValueMap(resp.GetRequestHeadersToAdd())
	for _, st := range resp.GetStatuses() {
		s := rlsStatus{Code: st.GetCode().String(), Remaining: st.GetLimitRemaining(), ResetSeconds: st.GetDurationUntilReset().AsDuration().Seconds()}
		if l := st.GetCurrentLimit(); l != nil {
			s.Limit, s.Unit = l.GetRequestsPerUnit(), strings.ToLower(l.GetUnit().String())
		}
		res.Statuses = append(res.Statuses, s)
	}
	return res
}
