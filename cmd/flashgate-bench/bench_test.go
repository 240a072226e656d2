package main

import (
	"encoding/json"
	"math"
	"runtime"
	"strings"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"

	"github.com/flashgate/flashgate/internal/testing/authtest"
)

func benchJSON(t *testing.T, args ...string) benchResult {
	t.Helper()
	out, stderr, err := runArgs(append([]string{"--json"}, args...)...)
	if err != nil {
		t.Fatalf("bench: %v\n%s", err, stderr)
	}
	var r benchResult
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("bench --json output %q: %v", out, err)
	}
	return r
}

func checkBenchInvariants(t *testing.T, r benchResult) {
	t.Helper()
	if r.Requests == 0 || r.Requests != r.Allowed+r.Denied+r.Errors {
		t.Errorf("requests %d != allowed %d + denied %d + errors %d", r.Requests, r.Allowed, r.Denied, r.Errors)
	}
	if r.Errors != 0 {
		t.Errorf("%d errors, first: %s", r.Errors, r.FirstError)
	}
	l := r.LatencyMS
	if !(0 < l.P50 && l.P50 <= l.P90 && l.P90 <= l.P99 && l.P99 <= l.P999 && l.P999 <= l.Max) {
		t.Errorf("latency percentiles out of order: %+v", l)
	}
	if r.Throughput <= 0 || r.DurationS < 0.5 {
		t.Errorf("throughput %g over %gs", r.Throughput, r.DurationS)
	}
	// The process's CPU time over the run (here the test process, with the
	// server when it runs in-process): something, and no more than every
	// core for the whole run.
	if _, measured := processCPU(); !measured {
		if r.ClientCPUS != 0 {
			t.Errorf("client CPU %gs on a platform that does not measure it", r.ClientCPUS)
		}
	} else if limit := r.DurationS * float64(runtime.NumCPU()) * 1.05; !(r.ClientCPUS > 0 && r.ClientCPUS <= limit) {
		t.Errorf("client CPU %gs, want in (0, %g] for %gs on %d CPUs", r.ClientCPUS, limit, r.DurationS, runtime.NumCPU())
	}
}

func TestBenchAgainstLimiter(t *testing.T) {
	auth := authtest.NewLimitAuth(5)
	addr := authtest.StartGRPC(t, auth)
	r := benchJSON(t, "--addr", addr, "--duration", "1s", "--concurrency", "4", "--users", "3", "--hot", "0.5", "--quiet")
	checkBenchInvariants(t, r)
	if r.Users != 3 || r.Concurrency != 4 || r.Hot != 0.5 || r.Connections != 2 {
		t.Errorf("echoed options = %+v", r)
	}
	count, ips := auth.Counts(), auth.IPs()
	// Each of the 3 users is admitted 5 times, then denied: as many
	// admissions as the users' requests allow, however few a loaded
	// machine managed to send in the second.
	want := 0
	for _, uid := range []string{"u0000000", "u0000001", "u0000002"} {
		want += min(count[uid], 5)
	}
	if r.Allowed != uint64(want) {
		t.Errorf("allowed = %d, want %d (5 per user of %v)", r.Allowed, want, count)
	}
	// Users are drawn from all 3: a cold user (1/6 of the requests) stays
	// silent in n requests with probability (5/6)^n, under 1e-9 past 114.
	for _, uid := range []string{"u0000000", "u0000001", "u0000002"} {
		if count[uid] == 0 && r.Requests > 114 {
			t.Errorf("user %s never sent in %d requests", uid, r.Requests)
		}
	}
	// The hot user sends about half of everything and a third of the rest:
	// 2/3, within 0.5 to 0.85 or six standard deviations of n draws,
	// whichever is wider.
	const p = 0.5 + 0.5/3
	sd := math.Sqrt(p * (1 - p) / float64(r.Requests))
	lo, hi := min(0.5, p-6*sd), max(0.85, p+6*sd)
	if hot := float64(count["u0000000"]) / float64(r.Requests); hot < lo || hot > hi {
		t.Errorf("hot user's share = %.2f of %d requests, want %.2f to %.2f", hot, r.Requests, lo, hi)
	}
	if len(ips) != 3 {
		t.Errorf("client IPs = %v, want one per user", ips)
	}
}

func TestBenchNoopTable(t *testing.T) {
	addr := startNoop(t)
	out, stderr, err := runArgs("--addr", addr, "--duration", "1100ms",
		"--concurrency", "2", "--users", "10", "--rate", "400")
	if err != nil {
		t.Fatalf("bench: %v", err)
	}
	wants := []string{"requests", "throughput", "allowed", "denied", "errors", "p50", "p99.9", "max", "paced to 400/s"}
	if _, measured := processCPU(); measured {
		wants = append(wants, "client CPU", "µs per request")
	}
	for _, want := range wants {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	// Not a terminal: plain progress lines, no carriage returns.
	if !strings.Contains(stderr, "requests") || strings.Contains(stderr, "\r") {
		t.Errorf("progress = %q", stderr)
	}
}

func TestBenchPacedAndEncodedPerRequest(t *testing.T) {
	auth := authtest.NewLimitAuth(1 << 30)
	addr := authtest.StartGRPC(t, auth)
	// More users than are prebuilt: every request is encoded on the fly.
	r := benchJSON(t, "--addr", addr, "--duration", "1s", "--concurrency", "2", "--users", "300000",
		"--rate", "200", "--ip", "198.51.100.1", "--quiet")
	checkBenchInvariants(t, r)
	if r.Allowed != r.Requests {
		t.Errorf("allowed %d of %d", r.Allowed, r.Requests)
	}
	// Pacing caps the rate; a loaded machine may fall short of it.
	if r.Requests < 20 || r.Requests > 300 {
		t.Errorf("%d requests in 1s at --rate 200", r.Requests)
	}
	if ips := auth.IPs(); len(ips) != 1 || !ips["198.51.100.1"] {
		t.Errorf("client IPs = %v, want only --ip", ips)
	}
}

func TestBenchUnreachable(t *testing.T) {
	_, _, err := runArgs("--addr", "127.0.0.1:1", "--duration", "1s", "--timeout", "200ms")
	if err == nil || !strings.Contains(err.Error(), "cannot reach") {
		t.Fatalf("err = %v, want cannot reach", err)
	}
}

func TestRawCodecReadsStatus(t *testing.T) {
	tests := map[string]struct {
		resp *authv3.CheckResponse
		want int32
	}{
		"empty": {&authv3.CheckResponse{}, 0},
		"ok":    {&authv3.CheckResponse{Status: &status.Status{}, HttpResponse: &authv3.CheckResponse_OkResponse{OkResponse: &authv3.OkHttpResponse{}}}, 0},
		"denied": {&authv3.CheckResponse{
			Status: &status.Status{Code: int32(codes.ResourceExhausted), Message: "over"},
			HttpResponse: &authv3.CheckResponse_DeniedResponse{DeniedResponse: &authv3.DeniedHttpResponse{
				Status:  &typev3.HttpStatus{Code: typev3.StatusCode_TooManyRequests},
				Headers: []*corev3.HeaderValueOption{authtest.Header("retry-after", "1")},
				Body:    "{}",
			}},
		}, int32(codes.ResourceExhausted)},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			b, err := proto.Marshal(tc.resp)
			if err != nil {
				t.Fatal(err)
			}
			var a checkAnswer
			// Split in two buffers, as gRPC may deliver it.
			half := len(b) / 2
			if err := (rawCodec{}).Unmarshal(mem.BufferSlice{mem.SliceBuffer(b[:half]), mem.SliceBuffer(b[half:])}, &a); err != nil {
				t.Fatal(err)
			}
			if a.code != tc.want {
				t.Errorf("code = %d, want %d", a.code, tc.want)
			}
		})
	}
	var a checkAnswer
	if err := (rawCodec{}).Unmarshal(mem.BufferSlice{mem.SliceBuffer([]byte{0x0a, 0x05, 0x08})}, &a); err == nil {
		t.Error("truncated message: want an error")
	}
}
