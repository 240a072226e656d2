package extauthz

import (
	"strings"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"google.golang.org/protobuf/proto"

	"github.com/flashgate/flashgate/descriptors"
	"github.com/flashgate/flashgate/window"
)

const fuzzYAML = `
domain: fuzz
client_ip: {trusted_hops: 2}
sources:
  uid: {request_headers: {header_name: x-uid}}
  tenant: {context_extension: {key: tenant}}
descriptors:
  - key: path
    value: /api/*
    descriptors:
      - key: uid
        on_missing: deny
        descriptors:
          - key: method
            rate_limit: {requests: 5, window: 1s}
  - key: tenant
    rate_limit: {requests: 5, window: 1s}
  - key: remote_address
    rate_limit: {requests: 5, window: 1s}
  - key: host
    value: example.com
    rate_limit: {requests: 5, window: 1s}
`

// FuzzMapping feeds arbitrary request fields (and arbitrary protobuf bytes)
// to the mapping: it must never panic, and every key must be bounded.
func FuzzMapping(f *testing.F) {
	f.Add("/api/coupon/x?y=1", "GET", "example.com", "u1", "10.0.0.1", "1.2.3.4, 5.6.7.8", "acme", []byte(nil))
	f.Add("", "", "", "", "", "", "", []byte{0x0a, 0x00})
	f.Add("/api/\x00", "\xff", "{x}", strings.Repeat("a", 2000), "::1", ",,,", "", []byte{0xff, 0xff})
	cfg, err := descriptors.ParseConfig("fuzz.yaml", []byte(fuzzYAML))
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, path, method, host, uid, ip, xff, tenant string, raw []byte) {
		reqs := []*authv3.CheckRequest{{Attributes: &authv3.AttributeContext{
			Source: &authv3.AttributeContext_Peer{Address: &corev3.Address{Address: &corev3.Address_SocketAddress{
				SocketAddress: &corev3.SocketAddress{Address: ip},
			}}},
			Request: &authv3.AttributeContext_Request{Http: &authv3.AttributeContext_HttpRequest{
				Path: path, Method: method, Host: host,
				Headers: map[string]string{"x-uid": uid, "x-forwarded-for": xff},
				HeaderMap: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{
					{Key: "X-Uid", RawValue: []byte(uid)}, {Key: "x-uid", Value: tenant},
				}},
			}},
			ContextExtensions: map[string]string{"tenant": tenant},
		}}}
		var fromBytes authv3.CheckRequest
		if proto.Unmarshal(raw, &fromBytes) == nil {
			reqs = append(reqs, &fromBytes)
		}
		var m mapping
		for _, r := range reqs {
			mapCheck(cfg, r, window.Keys{}, &m)
			for _, h := range m.Hits {
				if h.Key == "" || len(h.Key) > window.MaxKeyLen || h.Limit.Validate() != nil {
					t.Fatalf("hit %+v", h)
				}
			}
		}
	})
}
