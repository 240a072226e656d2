package main

import (
	"bufio"
	"context"
	"encoding/json"
	"net"
	"strings"
	"testing"

	"github.com/flashgate/flashgate/internal/checkreq"
	"github.com/flashgate/flashgate/internal/testing/authtest"
)

func TestCheckAllowedThenDenied(t *testing.T) {
	auth := authtest.NewLimitAuth(5)
	addr := authtest.StartGRPC(t, auth)
	out, _, err := runCmd(t, context.Background(), "check", "--addr", addr, "--path", "/api/coupon/1?x=1",
		"--method", "post", "-H", "X-Uid: alice", "-H", "x-device-fp: fp1", "--ip", "192.0.2.7",
		"--context-extension", "route=coupon", "-n", "6")
	if err != nil {
		t.Fatalf("check: %v\n%s", err, out)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 6 {
		t.Fatalf("got %d lines, want 6:\n%s", len(lines), out)
	}
	for i, l := range lines[:5] {
		if !strings.HasPrefix(l, "#") || !strings.Contains(l, " allowed 200 ") || !strings.Contains(l, "x-ratelimit-limit: 5") {
			t.Errorf("line %d = %q, want an allowed 200 with x-ratelimit-limit", i+1, l)
		}
	}
	if !strings.Contains(lines[4], "x-ratelimit-remaining: 0") {
		t.Errorf("line 5 = %q, want remaining 0", lines[4])
	}
	for _, want := range []string{"#6 denied 429 ", "retry-after: 1", "x-ratelimit-remaining: 0", `ratelimit: "per_uid";r=0;t=1`,
		"content-type: application/problem+json", `"error":"too_many_requests"`} {
		if !strings.Contains(lines[5], want) {
			t.Errorf("line 6 = %q, want %q in it", lines[5], want)
		}
	}

	// The request is built the way Envoy builds it.
	req := auth.Last()
	http := req.GetAttributes().GetRequest().GetHttp()
	if http.GetPath() != "/api/coupon/1?x=1" || http.GetMethod() != "POST" || http.GetHost() != "localhost" || http.GetScheme() != "http" {
		t.Errorf("http attributes = %v", http)
	}
	h := http.GetHeaders()
	if h["x-uid"] != "alice" || h["x-device-fp"] != "fp1" || h[":path"] != "/api/coupon/1?x=1" || h[":method"] != "POST" || h["x-request-id"] == "" {
		t.Errorf("headers = %v", h)
	}
	if ip := req.GetAttributes().GetSource().GetAddress().GetSocketAddress().GetAddress(); ip != "192.0.2.7" {
		t.Errorf("source address = %q, want 192.0.2.7", ip)
	}
	if got := req.GetAttributes().GetContextExtensions()["route"]; got != "coupon" {
		t.Errorf("context extension route = %q, want coupon", got)
	}
}

func TestCheckJSON(t *testing.T) {
	addr := authtest.StartGRPC(t, authtest.NewLimitAuth(1))
	out, _, err := runCmd(t, context.Background(), "check", "--addr", addr, "--path", "/", "-H", "x-uid: bob", "-n", "2", "--json")
	if err != nil {
		t.Fatalf("check: %v", err)
	}
	var got []checkreq.Result
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		var r checkreq.Result
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatalf("line %q: %v", sc.Text(), err)
		}
		got = append(got, r)
	}
	if len(got) != 2 {
		t.Fatalf("got %d JSON lines, want 2:\n%s", len(got), out)
	}
	if a := got[0]; !a.Allowed || a.Status != 200 || a.Code != "OK" || a.Headers["x-ratelimit-remaining"] != "0" || a.N != 1 {
		t.Errorf("first answer = %+v", a)
	}
	if d := got[1]; d.Allowed || d.Status != 429 || d.Code != "ResourceExhausted" || d.Headers["retry-after"] != "1" ||
		!strings.Contains(d.Body, "too_many_requests") || d.LatencyMS <= 0 {
		t.Errorf("second answer = %+v", d)
	}
}

func TestCheckManyAllowed(t *testing.T) {
	addr := authtest.StartGRPC(t, authtest.NewLimitAuth(1<<30))
	out, _, err := runCmd(t, context.Background(), "check", "--addr", addr, "--path", "/healthz", "-n", "3")
	if err != nil {
		t.Fatalf("check: %v", err)
	}
	if n := strings.Count(out, " allowed 200 "); n != 3 {
		t.Errorf("got %d allowed answers, want 3:\n%s", n, out)
	}
}

func TestCheckTransportError(t *testing.T) {
	// A port that was just free: connection refused.
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	lis.Close()
	out, _, err := runCmd(t, context.Background(), "check", "--addr", addr, "--path", "/", "-n", "2", "--timeout", "500ms")
	if err == nil || !strings.Contains(err.Error(), "2 of 2 checks failed") {
		t.Fatalf("err = %v, want 2 of 2 failed", err)
	}
	if strings.Count(out, " error ") != 2 {
		t.Errorf("want two error lines:\n%s", out)
	}
}
