package main

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/netip"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// requestSpec describes the HTTP request an Envoy ext_authz filter would ask
// about; buildCheckRequest turns it into a CheckRequest the way Envoy does.
type requestSpec struct {
	method string
	path   string // as Envoy sends it: with the query string
	host   string
	scheme string
	// headers with lower-case names; repeated names already joined by ",".
	headers map[string]string
	// ip is the downstream client address (source.address).
	ip netip.Addr
	// contextExtensions are the per-route context_extensions.
	contextExtensions map[string]string
	// id is the request id (attributes.request.http.id); empty for none.
	id string
}

// buildCheckRequest returns the CheckRequest Envoy would send for s. Like
// Envoy, it also lists the pseudo-headers :authority, :method and :path and
// the x-request-id among the headers.
func buildCheckRequest(s requestSpec) *authv3.CheckRequest {
	headers := make(map[string]string, len(s.headers)+4)
	headers[":authority"] = s.host
	headers[":method"] = s.method
	headers[":path"] = s.path
	if s.id != "" {
		headers["x-request-id"] = s.id
	}
	for k, v := range s.headers {
		headers[k] = v
	}
	return &authv3.CheckRequest{
		Attributes: &authv3.AttributeContext{
			Source: &authv3.AttributeContext_Peer{
				Address: socketAddress(s.ip.String(), 0),
			},
			Destination: &authv3.AttributeContext_Peer{
				Address: socketAddress("127.0.0.1", 8080),
			},
			Request: &authv3.AttributeContext_Request{
				Http: &authv3.AttributeContext_HttpRequest{
					Id:       s.id,
					Method:   s.method,
					Path:     s.path,
					Host:     s.host,
					Scheme:   s.scheme,
					Protocol: "HTTP/1.1",
					Headers:  headers,
				},
			},
			ContextExtensions: s.contextExtensions,
		},
	}
}

func socketAddress(ip string, port uint32) *corev3.Address {
	return &corev3.Address{Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
		Protocol:      corev3.SocketAddress_TCP,
		Address:       ip,
		PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: port},
	}}}
}

// parseHeaders parses -H values of the form "name: value" into a map with
// lower-case names; a repeated name's values are joined by "," as Envoy does.
func parseHeaders(raw []string) (map[string]string, error) {
	headers := make(map[string]string, len(raw))
	for _, h := range raw {
		// A pseudo-header (":authority: x") starts with a colon.
		start := 0
		if strings.HasPrefix(h, ":") {
			start = 1
		}
		i := strings.IndexByte(h[start:], ':')
		if i < 0 {
			return nil, fmt.Errorf("header %q: want 'name: value'", h)
		}
		name := strings.ToLower(strings.TrimSpace(h[:start+i]))
		value := strings.TrimSpace(h[start+i+1:])
		if name == "" || name == ":" {
			return nil, fmt.Errorf("header %q: empty name", h)
		}
		if old, ok := headers[name]; ok {
			value = old + "," + value
		}
		headers[name] = value
	}
	return headers, nil
}

// parsePairs parses "key=value" flags into a map.
func parsePairs(flag string, raw []string) (map[string]string, error) {
	if len(raw) == 0 {
		return nil, nil
	}
	m := make(map[string]string, len(raw))
	for _, p := range raw {
		k, v, ok := strings.Cut(p, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("--%s %q: want key=value", flag, p)
		}
		m[k] = v
	}
	return m, nil
}

// parseIP parses the --ip flag.
func parseIP(s string) (netip.Addr, error) {
	ip, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("--ip %q: not an IP address: %w", s, err)
	}
	return ip, nil
}

// dial returns a plaintext gRPC client connection to addr ("host:port" or
// "unix:///path"). It does not connect until the first call.
func dial(addr string) (*grpc.ClientConn, error) {
	if addr == "" {
		return nil, fmt.Errorf("--addr is empty")
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w", addr, err)
	}
	return conn, nil
}

// newRequestID returns a random 128-bit request id in hex.
func newRequestID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand documents it)
	return hex.EncodeToString(b[:])
}
