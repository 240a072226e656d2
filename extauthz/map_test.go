package extauthz

import (
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"

	"github.com/flashgate/flashgate/window"
)

// Map (for tests) computes the hits of req under c's rules, into m (reset first). It is
// a pure function of its arguments: it never fails and never panics,
// whatever req holds (nil included), and reads no clock.
//
// A rule matches when every descriptor with a value finds its pattern in the
// request (exact, or prefix for a trailing *). A matching rule whose other
// descriptors all find a value (present and non-empty) yields a hit keyed by keys.Key(rule name, joined parts), the parts
// being each descriptor's pattern or the request's value; otherwise the rule
// is skipped, or recorded in m.Missing under on_missing: deny.
//
// Map is safe for concurrent use on one Config with distinct Mappings.
func (c *Config) Map(req *authv3.CheckRequest, keys window.Keys, m *Mapping) {
	c.mapWith(req, keys, nil, false, m)
}
