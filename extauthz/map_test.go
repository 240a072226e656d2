package extauthz

import (
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"

	"github.com/flashgate/flashgate/descriptors"
	"github.com/flashgate/flashgate/window"
)

// mapCheck maps req under c's rules with keys into m (reset first), as
// Check maps a request without --shadow, its hits tagged.
func mapCheck(c *descriptors.Config, req *authv3.CheckRequest, keys window.Keys, m *mapping) {
	m.Reset()
	m.grpc.set(req)
	m.mapRequest(descriptors.NewMapper(c, keys), &m.grpc, false)
}
