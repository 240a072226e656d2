// Package rlshttp is envoyproxy/ratelimit's HTTP side over an
// envoy.service.ratelimit.v3 server: GET /healthcheck and POST /json, the
// JSON form of ShouldRateLimit. It is an http.Handler; the process host
// serves it on a listener of its own, with that listener's connection cap,
// metrics and drain.
package rlshttp
