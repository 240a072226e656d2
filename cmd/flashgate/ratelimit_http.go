package main

import (
	"fmt"
	"io"
	"net"
	"net/http"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/flashgate/flashgate/host"
)

// maxJSONBody bounds the body of POST /json.
const maxJSONBody = 1 << 20

// ratelimitHTTPHandler serves envoyproxy/ratelimit's HTTP side: GET
// /healthcheck (200 "OK" while serving, 500 otherwise) and /json, the JSON
// form of ShouldRateLimit (a protojson RateLimitRequest in, the protojson
// RateLimitResponse out: 200, 429 when OVER_LIMIT, 500 when UNKNOWN; 400
// for a body that is not a request or a call that fails), as ratelimit
// answers them.
func ratelimitHTTPHandler(svc rlsv3.RateLimitServiceServer, serving func() bool) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthcheck", func(w http.ResponseWriter, _ *http.Request) {
		if !serving() {
			http.Error(w, "NOT OK", http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = io.WriteString(w, "OK")
	})
	mux.HandleFunc("/json", func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxJSONBody))
		var req rlsv3.RateLimitRequest
		if err == nil {
			err = protojson.Unmarshal(body, &req)
		}
		if err != nil {
			http.Error(w, http.StatusText(http.StatusBadRequest), http.StatusBadRequest)
			return
		}
		resp, err := svc.ShouldRateLimit(r.Context(), &req)
		if err != nil {
			http.Error(w, http.StatusText(http.StatusBadRequest), http.StatusBadRequest)
			return
		}
		out, err := protojson.Marshal(resp)
		if err != nil {
			http.Error(w, http.StatusText(http.StatusInternalServerError), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		switch resp.GetOverallCode() {
		case rlsv3.RateLimitResponse_OVER_LIMIT:
			w.WriteHeader(http.StatusTooManyRequests)
		case rlsv3.RateLimitResponse_UNKNOWN:
			w.WriteHeader(http.StatusInternalServerError)
		}
		_, _ = w.Write(out)
	})
	return mux
}

// ratelimitHTTP is serve's --rls-http-addr listener, served on the host
// (its cap, timeouts, metrics, error log and drain); a nil one serves
// nothing.
type ratelimitHTTP struct {
	lis net.Listener
}

// newRatelimitHTTP listens on addr ("" : nil, nil).
func newRatelimitHTTP(addr string) (*ratelimitHTTP, error) {
	if addr == "" {
		return nil, nil
	}
	lis, err := host.Listen(addr)
	if err != nil {
		return nil, fmt.Errorf("--rls-http-addr: %w", err)
	}
	return &ratelimitHTTP{lis: lis}, nil
}

// listener returns the listener and svc's handler, whose /healthcheck
// follows serving; nil, nil for a nil r or a nil svc.
func (r *ratelimitHTTP) listener(svc rlsv3.RateLimitServiceServer, serving func() bool) (net.Listener, http.Handler) {
	if r == nil || svc == nil {
		return nil, nil
	}
	return r.lis, ratelimitHTTPHandler(svc, serving)
}

// close releases the listener of one that will not be served.
func (r *ratelimitHTTP) close() {
	if r != nil {
		r.lis.Close()
	}
}
