// Package proxy holds no Go code: the directory ships flashgate's
// configurations for the proxies whose only authorization hook is an HTTP
// subrequest, each calling flashgate's HTTP front-end (flashgate serve
// --http-authz-addr 127.0.0.1:9193) before a request reaches the app:
//
//   - nginx/flashgate.conf: auth_request, with the denial answered as a real
//     429 through error_page (see the file's header for why a 403 on the
//     wire), the rate-limit fields copied to the client on admission too;
//     flashgate down → 503 with Retry-After: 1 (fail closed).
//   - caddy/Caddyfile: forward_auth, with header lines adding the fields to
//     an admitted answer; flashgate's 429 passes through as it is;
//     flashgate down → 503 with Retry-After: 1 (fail closed).
//   - traefik/dynamic.yaml: ForwardAuth (authResponseHeaders,
//     trustForwardHeader: false); flashgate's 429 passes through; admitted
//     answers carry no fields to the client (Traefik has no way to add
//     them); flashgate down → Traefik's 500 (fail closed).
//
// Each removes or replaces a client's copies of the headers flashgate reads
// the original request from (X-Original-URI and -Method,
// X-Forwarded-Method, -Uri and -Host, X-Flashgate-Deny-Status), and each
// puts its peer at the end of X-Forwarded-For: the descriptors file needs
// client_ip: {trusted_hops: 1}.
//
// The tests run the nginx and Caddy files in real nginx and caddy processes
// (internal/testing/proxytest) against a stand-in for the front-end and an upstream
// that counts what reaches it: the limits and headers of admissions and
// denials, the original method and path as the front-end sees them (normal
// form, spoofed headers gone), the failure behaviour, and that a flood of
// denials writes no error-log line each. Traefik is not packaged by Debian
// and is not run: its file is decoded strictly into Go types mirroring
// Traefik's dynamic configuration. The end-to-end test with the real
// flashgate serve is e2e's TestHTTPFrontBehindProxies.
package proxy
