// Package httpauthz is flashgate's HTTP front-end: an http.Handler for
// Envoy's ext_authz http_service and for the forward-auth hooks of nginx
// (auth_request), Caddy (forward_auth) and Traefik (ForwardAuth). Every
// request it serves is a check: it reads the request into the attributes
// the rules map (a descriptors.Request, as the gRPC front-end reads a
// CheckRequest into one), asks a [Decider] (the ext_authz server,
// *extauthz.Server, is one) for the enforcement core's answer
// (enforce.Answer), and writes that answer as HTTP. So every decision is
// the ext_authz server's (rules, failure modes, shadow, reload and metrics
// are the same on both front-ends), and every header field the one the
// gRPC front-end sends, both made by package enforce.
//
//	h, err := httpauthz.New(httpauthz.Options{Decider: srv, PathPrefix: "/authz", Registerer: reg})
//	// serve h on its own listener (package host: Options.HTTPAuthz)
//
// # The checked request
//
// The proxy is the peer: the original request is read from the headers it
// sets, each field from the first source present:
//
//	method     X-Original-Method (nginx) > X-Forwarded-Method (Caddy, Traefik) > the request's method (Envoy)
//	path       X-Original-URI (nginx) > X-Forwarded-Uri (Caddy, Traefik) > the request's URI, less PathPrefix (Envoy)
//	authority  X-Forwarded-Host > the request's Host
//	scheme     X-Forwarded-Proto > http (https on TLS)
//	client IP  the peer's address; with the rules' trusted_hops, the Nth entry from the right of X-Forwarded-For
//
// The path is read as received (PathPrefix, which the proxy prepends as
// written, removed first), as Envoy sends :path; the rules match it in the
// one canonical form the gRPC front-end's paths have too (package
// descriptors: trailing slash, "//", dot segments, unreserved escapes,
// "%2F" and ";" parameters are no way around a rule).
//
// The rules read the request's headers as Envoy's headers map holds them:
// by lower-case name, a repeated header's values joined by ",", the
// pseudo-headers :method, :path, :authority and :scheme of the checked
// request, invalid UTF-8 repaired to U+FFFD as the gRPC front-end's codec
// repairs it. A proxy that forwards the client's own X-Original-* or
// X-Forwarded-Method/-Uri headers lets the client choose the path and
// method the rules see: the proxy must set or strip them.
// Envoy's per-route context_extensions never reach this front-end: rules
// reading them do not apply to its checks.
//
// # The answer
//
// Allowed: 200 with the answer's rate-limit header fields, no body.
// Denied: 429 with Retry-After, the rate-limit fields and the RFC 9457
// problem body (application/problem+json). The request header
// X-Flashgate-Deny-Status: 401 or 403 (which nginx's auth_request needs:
// it passes only 2xx, 401 and 403) answers a denial with that status
// instead; the header fields stay, and the body's "status" and "title"
// members follow the status sent. Any other value is ignored.
//
// A request that is no check (a method or URI that cannot be the original
// request's, a path outside PathPrefix, headers above [MaxHeaderBytes]) is
// answered 400 with a plain-text reason and counted in
// flashgate_http_authz_rejected_total{reason}. A Decider error, which the
// ext_authz server never returns (it decides backend trouble by its
// failure modes), is answered 503, counted under
// reason check_failed, and logged: a proxy reads a 5xx as "the authorizer
// failed" (Envoy applies its failure_mode_allow), never as over limit.
package httpauthz
