package checkreq

import (
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"fmt"
	"net"
	"net/netip"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/spf13/pflag"

	"github.com/flashgate/flashgate/internal/tlsreload"
)

// Spec describes the HTTP request an Envoy ext_authz filter would ask
// about; Build turns it into a CheckRequest the way Envoy does.
type Spec struct {
	Method string
	// Path is as Envoy sends it: with the query string.
	Path   string
	Host   string
	Scheme string
	// Headers have lower-case names, a repeated name's values already
	// joined by "," (as ParseHeaders returns them).
	Headers map[string]string
	// IP is the downstream client address (source.address).
	IP netip.Addr
	// ContextExtensions are the per-route context_extensions; nil for none.
	ContextExtensions map[string]string
	// ID is the request id (attributes.request.http.id); empty for none.
	ID string
}

// Build returns the CheckRequest Envoy would send for s. Like Envoy, it also
// lists the pseudo-headers :authority, :method and :path and the
// x-request-id among the headers; a header of s of the same name wins. The
// request shares s's ContextExtensions map but not its Headers.
func Build(s Spec) *authv3.CheckRequest {
	headers := make(map[string]string, len(s.Headers)+4)
	headers[":authority"] = s.Host
	headers[":method"] = s.Method
	headers[":path"] = s.Path
	if s.ID != "" {
		headers["x-request-id"] = s.ID
	}
	for k, v := range s.Headers {
		headers[k] = v
	}
	return &authv3.CheckRequest{
		Attributes: &authv3.AttributeContext{
			Source: &authv3.AttributeContext_Peer{
				Address: socketAddress(s.IP.String(), 0),
			},
			Destination: &authv3.AttributeContext_Peer{
				Address: socketAddress("127.0.0.1", 8080),
			},
			Request: &authv3.AttributeContext_Request{
				Http: &authv3.AttributeContext_HttpRequest{
					Id:       s.ID,
					Method:   s.Method,
					Path:     s.Path,
					Host:     s.Host,
					Scheme:   s.Scheme,
					Protocol: "HTTP/1.1",
					Headers:  headers,
				},
			},
			ContextExtensions: s.ContextExtensions,
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

// ParseHeaders parses -H values of the form "name: value" (a pseudo-header
// such as ":authority: x" included) into a map with lower-case names and
// trimmed values; a repeated name's values are joined by "," as Envoy does.
// It returns an error for a value without a colon or with an empty name.
func ParseHeaders(raw []string) (map[string]string, error) {
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

// ParsePairs parses the "key=value" values of the flag --flag into a map (a
// later key wins); nil for none. The key must not be empty.
func ParsePairs(flag string, raw []string) (map[string]string, error) {
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

// ParseIP parses the value of an --ip flag.
func ParseIP(s string) (netip.Addr, error) {
	ip, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("--ip %q: not an IP address: %w", s, err)
	}
	return ip, nil
}

// Dial returns a gRPC client connection to the --addr value addr
// ("host:port" or "unix:///path"), plaintext unless opts give transport
// credentials (they follow the plaintext default). It does not connect
// until the first call; the caller closes it.
func Dial(addr string, opts ...grpc.DialOption) (*grpc.ClientConn, error) {
	if addr == "" {
		return nil, fmt.Errorf("--addr is empty")
	}
	conn, err := grpc.NewClient(addr, append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, opts...)...)
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w", addr, err)
	}
	return conn, nil
}

// NewID returns a random 128-bit request id in hex. It is safe for
// concurrent use.
func NewID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand documents it)
	return hex.EncodeToString(b[:])
}

// TLS is the client side of TLS to a gRPC server, as the --tls* flags of
// check and flashgate-bench give it. The zero value is plaintext.
type TLS struct {
	// On asks for TLS verified against the system roots; CA, Cert or Key
	// imply it.
	On bool
	// CA is a PEM bundle to verify the server against; Cert and Key a
	// client certificate and its key for mTLS.
	CA, Cert, Key string
	// ServerName is the name (or IP address) the server's certificate
	// must carry; "": addr's host.
	ServerName string
}

// AddFlags adds --tls, --tls-ca, --tls-cert, --tls-key and
// --tls-server-name, setting t, to f (check's and flashgate-bench's).
func (t *TLS) AddFlags(f *pflag.FlagSet) {
	f.BoolVar(&t.On, "tls", false, "gRPC: connect with TLS, verifying the server against the system roots (implied by --tls-ca, --tls-cert)")
	f.StringVar(&t.CA, "tls-ca", "", "gRPC: PEM CA bundle to verify the server's certificate against (implies --tls)")
	f.StringVar(&t.Cert, "tls-cert", "", "gRPC: PEM client certificate for mTLS, with --tls-key (implies --tls)")
	f.StringVar(&t.Key, "tls-key", "", "gRPC: PEM private key of --tls-cert")
	f.StringVar(&t.ServerName, "tls-server-name", "", "gRPC: the name (or IP address) the server's certificate must carry (default: --addr's host)")
}

// TLSFlagNames returns the names of the flags of AddFlags.
func TLSFlagNames() []string {
	return []string{"tls", "tls-ca", "tls-cert", "tls-key", "tls-server-name"}
}

// DialOptions returns the transport credentials of t for a server at
// addr, for Dial: none (plaintext) for the zero TLS. Errors name the file.
func (t TLS) DialOptions(addr string) ([]grpc.DialOption, error) {
	if t == (TLS{}) {
		return nil, nil
	}
	name := t.ServerName
	if host, _, err := net.SplitHostPort(addr); err == nil && name == "" {
		name = host
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: name}
	if t.CA != "" || t.Cert != "" || t.Key != "" {
		r, err := tlsreload.New(tlsreload.Options{Files: tlsreload.Files{Cert: t.Cert, Key: t.Key, CA: t.CA}})
		if err != nil {
			return nil, fmt.Errorf("--tls-ca, --tls-cert, --tls-key: %w", err)
		}
		cfg = r.ClientConfig(name)
	}
	return []grpc.DialOption{grpc.WithTransportCredentials(credentials.NewTLS(cfg))}, nil
}
