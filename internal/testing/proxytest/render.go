package proxytest

import (
	"bytes"
	"fmt"
	"strconv"
)

// The default addresses of the shipped configurations, which rendering
// replaces.
const (
	shippedAuthz    = "127.0.0.1:9193"
	shippedUpstream = "127.0.0.1:8081"
)

// replacement is one address of a shipped file and what it becomes.
type replacement struct{ from, to string }

// RenderNginx returns proxy/nginx/flashgate.conf (conf) with its listener,
// flashgate and app addresses replaced by listen, authz and upstream
// (host:port each).
func RenderNginx(conf []byte, listen, authz, upstream string) ([]byte, error) {
	return replaceOnce(conf, []replacement{
		{"listen 8080;", "listen " + listen + ";"},
		{"server " + shippedAuthz + ";", "server " + authz + ";"},
		{"server " + shippedUpstream + ";", "server " + upstream + ";"},
	})
}

// RenderCaddy returns proxy/caddy/Caddyfile (conf) listening on port of
// 127.0.0.1, with its admin endpoint at admin and its flashgate and app
// addresses replaced by authz and upstream (host:port each).
func RenderCaddy(conf []byte, port int, admin, authz, upstream string) ([]byte, error) {
	return replaceOnce(conf, []replacement{
		{"admin localhost:2019\n", "admin " + admin + "\n"},
		{"default_bind 0.0.0.0\n", "default_bind 127.0.0.1\n"},
		{"\n:8080 {\n", "\n:" + strconv.Itoa(port) + " {\n"},
		{"forward_auth " + shippedAuthz + " {", "forward_auth " + authz + " {"},
		{"reverse_proxy " + shippedUpstream + "\n", "reverse_proxy " + upstream + "\n"},
	})
}

// replaceOnce applies each replacement to conf; each from must occur
// exactly once.
func replaceOnce(conf []byte, rs []replacement) ([]byte, error) {
	for _, r := range rs {
		if n := bytes.Count(conf, []byte(r.from)); n != 1 {
			return nil, fmt.Errorf("the shipped file holds %q %d times, want once: update proxytest's rendering with the file", r.from, n)
		}
		conf = bytes.Replace(conf, []byte(r.from), []byte(r.to), 1)
	}
	return conf, nil
}
