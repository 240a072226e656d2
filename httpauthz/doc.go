// Package httpauthz is flashgate's HTTP front-end: an http.Handler for
// Envoy's ext_authz http_service and the forward-auth hooks of nginx,
// Caddy and Traefik. Each request it serves is a check: it reads the
// original request from the proxy's headers into a descriptors.Request,
// asks a [Decider] (*extauthz.Server) for the core's answer, and writes it
// as HTTP: 200 when allowed, 429 (or the 401/403 X-Flashgate-Deny-Status
// asks for) with Retry-After and the problem body when denied. So rules,
// failure modes, shadow and header fields are the gRPC front-end's.
// docs/http-front-end.md lists the headers each proxy sets.
//
// A proxy that forwards the client's own X-Original-* or
// X-Forwarded-Method/-Uri headers lets the client choose the path and
// method the rules see: the proxy must set or strip them. A request that
// is no check is answered 400; a Decider error 503, which a proxy reads as
// "the authorizer failed", never as over limit.
package httpauthz
