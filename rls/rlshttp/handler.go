package rlshttp

import (
	"io"
	"net/http"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/encoding/protojson"
)

// MaxJSONBody bounds the body of POST /json.
const MaxJSONBody = 1 << 20

// Handler serves GET /healthcheck (200 while serving reports true, else
// 500) and POST /json, ShouldRateLimit in protojson (200, 429 when
// OVER_LIMIT, 500 when UNKNOWN, 400 for a bad request), as ratelimit does.
func Handler(svc rlsv3.RateLimitServiceServer, serving func() bool) http.Handler {
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
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxJSONBody))
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
