// Package rlshttp is envoyproxy/ratelimit's HTTP side over an
// envoy.service.ratelimit.v3 server: GET /healthcheck and POST /json.
package rlshttp
