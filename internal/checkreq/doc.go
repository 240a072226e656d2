// Package checkreq builds the ext_authz CheckRequest Envoy's ext_authz filter
// sends for one HTTP request, from the command-line values that describe it
// (-H headers, --ip, key=value pairs), and dials the server it goes to; or
// the request Envoy's http_service sends to flashgate's HTTP front-end, and
// the client it goes by. The
// flashgate commands that send requests (check, and the flashgate-bench load
// generator) share it, so that what they send is built one way.
package checkreq
