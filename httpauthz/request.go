package httpauthz

import (
	"errors"
	"net/http"
	"net/netip"
	"strings"
	"unicode/utf8"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
)

// The request headers a proxy sets to describe the original request (Go's
// canonical spelling; HTTP header names are case-insensitive).
const (
	HeaderOriginalMethod  = "X-Original-Method"
	HeaderOriginalURI     = "X-Original-Uri"
	HeaderForwardedMethod = "X-Forwarded-Method"
	HeaderForwardedURI    = "X-Forwarded-Uri"
	HeaderForwardedHost   = "X-Forwarded-Host"
	HeaderForwardedProto  = "X-Forwarded-Proto"
	// HeaderDenyStatus asks for a denial's status: 401 or 403.
	HeaderDenyStatus = "X-Flashgate-Deny-Status"
)

// MaxHeaderBytes bounds the request line's URI and the headers of one
// check, counted as HTTP/2 counts a header list: each field's name and
// value plus 32 bytes. Larger checks are refused with 400.
const MaxHeaderBytes = 64 << 10

// maxMethodLen bounds a method token.
const maxMethodLen = 64

// Reasons of flashgate_http_authz_rejected_total: why a request got no
// decision.
const (
	ReasonBadMethod       = "bad_method"
	ReasonBadURI          = "bad_uri"
	ReasonOutsidePrefix   = "outside_prefix"
	ReasonHeadersTooLarge = "headers_too_large"
	ReasonCheckFailed     = "check_failed"
)

// reasons are every reason, for the metric's series.
var reasons = [...]string{ReasonBadMethod, ReasonBadURI, ReasonOutsidePrefix, ReasonHeadersTooLarge, ReasonCheckFailed}

// rejection is a request that is no check: its reason (a metric label) and
// the plain-text sentence the client gets. It never holds request values.
type rejection struct {
	reason, msg string
}

func (r *rejection) Error() string { return r.msg }

var (
	errBadMethod      = &rejection{ReasonBadMethod, "the original method is not an HTTP method token"}
	errManyMethods    = &rejection{ReasonBadMethod, "the original method is given more than once"}
	errBadURI         = &rejection{ReasonBadURI, "the original URI is neither a path nor an absolute http(s) URI"}
	errManyURIs       = &rejection{ReasonBadURI, "the original URI is given more than once"}
	errOutsidePrefix  = &rejection{ReasonOutsidePrefix, "the request path is outside the path prefix (--http-authz-path-prefix)"}
	errHeadersTooBig  = &rejection{ReasonHeadersTooLarge, "the request's headers are too large"}
	errCheckFailedMsg = "the check failed"
)

// checkMsg holds the messages of one CheckRequest in one allocation.
type checkMsg struct {
	req   authv3.CheckRequest
	attrs authv3.AttributeContext
	src   authv3.AttributeContext_Peer
	addr  corev3.Address
	sock  corev3.Address_SocketAddress
	sa    corev3.SocketAddress
	port  corev3.SocketAddress_PortValue
	areq  authv3.AttributeContext_Request
	http  authv3.AttributeContext_HttpRequest
}

// checkRequest returns the CheckRequest Envoy's gRPC ext_authz filter would
// send for the request r describes (see the package comment), or a
// *rejection. prefix is the normalized path prefix ("" for none).
func checkRequest(r *http.Request, prefix string) (*authv3.CheckRequest, error) {
	if headerBytes(r) > MaxHeaderBytes {
		return nil, errHeadersTooBig
	}
	method, err := originalMethod(r)
	if err != nil {
		return nil, err
	}
	path, err := originalURI(r, prefix)
	if err != nil {
		return nil, err
	}
	host := r.Host
	if v := forwarded(r.Header, HeaderForwardedHost); v != "" {
		host = v
	}
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	if v := forwarded(r.Header, HeaderForwardedProto); v != "" {
		scheme = v
	}
	host, scheme = validUTF8(host), validUTF8(scheme)

	m := &checkMsg{}
	m.http.Method = method
	m.http.Path = path
	m.http.Host = host
	m.http.Scheme = scheme
	m.http.Protocol = r.Proto
	m.http.Headers = headerMap(r.Header, method, path, host, scheme)
	m.http.Id = m.http.Headers["x-request-id"]
	m.areq.Http = &m.http
	m.attrs.Request = &m.areq
	if ap, err := netip.ParseAddrPort(r.RemoteAddr); err == nil {
		m.sa.Protocol = corev3.SocketAddress_TCP
		m.sa.Address = ap.Addr().String()
		m.port.PortValue = uint32(ap.Port())
		m.sa.PortSpecifier = &m.port
		m.sock.SocketAddress = &m.sa
		m.addr.Address = &m.sock
		m.src.Address = &m.addr
		m.attrs.Source = &m.src
	}
	m.req.Attributes = &m.attrs
	return &m.req, nil
}

// forwarded returns the first element of X-Forwarded-Host or -Proto, the
// value the proxy nearest the client set ("" when absent).
func forwarded(h http.Header, name string) string {
	vs := h[name]
	if len(vs) == 0 {
		return ""
	}
	v, _, _ := strings.Cut(vs[0], ",")
	return strings.TrimSpace(v)
}

// headerBytes is the size of r's URI and headers as MaxHeaderBytes counts
// it.
func headerBytes(r *http.Request) int {
	n := len(r.RequestURI) + len(r.Host) + 32
	for k, vs := range r.Header {
		for _, v := range vs {
			n += len(k) + len(v) + 32
		}
	}
	return n
}

// originalMethod returns the checked request's method.
func originalMethod(r *http.Request) (string, error) {
	for _, name := range [...]string{HeaderOriginalMethod, HeaderForwardedMethod} {
		switch vs := r.Header[name]; len(vs) {
		case 0:
			continue
		case 1:
			m := strings.TrimSpace(vs[0])
			if !validMethod(m) {
				return "", errBadMethod
			}
			return m, nil
		default:
			return "", errManyMethods
		}
	}
	return r.Method, nil
}

// validMethod reports whether m is an HTTP method token (RFC 9110) of at
// most maxMethodLen bytes.
func validMethod(m string) bool {
	if m == "" || len(m) > maxMethodLen {
		return false
	}
	for i := 0; i < len(m); i++ {
		if !isTokenChar(m[i]) {
			return false
		}
	}
	return true
}

func isTokenChar(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
}

// originalURI returns the checked request's path, query included, as Envoy
// sends :path: from a proxy's header, else the request's own URI less
// prefix.
func originalURI(r *http.Request, prefix string) (string, error) {
	for _, name := range [...]string{HeaderOriginalURI, HeaderForwardedURI} {
		switch vs := r.Header[name]; len(vs) {
		case 0:
			continue
		case 1:
			return requestPath(strings.TrimSpace(vs[0]))
		default:
			return "", errManyURIs
		}
	}
	p, err := requestPath(r.RequestURI)
	if err != nil || prefix == "" {
		return p, err
	}
	return stripPrefix(p, prefix)
}

// requestPath returns the origin form (path and query) of a request
// target: uri itself when it starts with "/", the part after the authority
// of an absolute http or https URI ("/" when it has no path); any other
// target is no usable URI.
func requestPath(uri string) (string, error) {
	if strings.HasPrefix(uri, "/") {
		return validUTF8(uri), nil
	}
	rest, ok := cutSchemePrefix(uri)
	if !ok {
		return "", errBadURI
	}
	i := strings.IndexAny(rest, "/?#")
	if i < 0 {
		return "/", nil
	}
	if rest[i] != '/' {
		return validUTF8("/" + rest[i:]), nil
	}
	return validUTF8(rest[i:]), nil
}

// cutSchemePrefix returns uri without a leading "http://" or "https://"
// (any case).
func cutSchemePrefix(uri string) (string, bool) {
	for _, s := range [...]string{"http://", "https://"} {
		if len(uri) >= len(s) && strings.EqualFold(uri[:len(s)], s) {
			return uri[len(s):], true
		}
	}
	return "", false
}

// stripPrefix removes prefix (no trailing "/") from path at a "/" boundary:
// "/authz/api/x" → "/api/x", "/authz" → "/", "/authz?q" → "/?q"; a path
// outside the prefix ("/authzx", "/other") is refused.
func stripPrefix(path, prefix string) (string, error) {
	rest, ok := strings.CutPrefix(path, prefix)
	if !ok {
		return "", errOutsidePrefix
	}
	switch {
	case rest == "":
		return "/", nil
	case rest[0] == '/':
		return rest, nil
	case rest[0] == '?' || rest[0] == '#':
		return "/" + rest, nil
	}
	return "", errOutsidePrefix
}

// NormalizePrefix returns prefix as the Handler matches it: "" for none
// (or "/"), else a path starting with "/" and without trailing "/". It
// fails for a prefix that is not a path.
func NormalizePrefix(prefix string) (string, error) {
	if prefix == "" {
		return "", nil
	}
	if !strings.HasPrefix(prefix, "/") || strings.ContainsAny(prefix, "?# \t") {
		return "", errors.New("a path prefix must be a path starting with / (no query, no spaces)")
	}
	return strings.TrimRight(prefix, "/"), nil
}

// headerMap returns h as Envoy's headers map: lower-case names, a repeated
// header's values joined by ",", and the pseudo-headers of the checked
// request.
func headerMap(h http.Header, method, path, host, scheme string) map[string]string {
	m := make(map[string]string, len(h)+4)
	for k, vs := range h {
		var v string
		if len(vs) == 1 {
			v = vs[0]
		} else {
			v = strings.Join(vs, ",")
		}
		m[lower(k)] = validUTF8(v)
	}
	m[":method"] = method
	m[":path"] = path
	m[":authority"] = host
	m[":scheme"] = scheme
	return m
}

// lower returns s in ASCII lower case; s itself when it has no upper-case
// letter.
func lower(s string) string {
	for i := 0; i < len(s); i++ {
		if c := s[i]; 'A' <= c && c <= 'Z' {
			b := []byte(s)
			for j := i; j < len(b); j++ {
				if c := b[j]; 'A' <= c && c <= 'Z' {
					b[j] = c + 'a' - 'A'
				}
			}
			return string(b)
		}
	}
	return s
}

// validUTF8 returns s with each run of invalid UTF-8 replaced by U+FFFD, as
// the ext_authz gRPC codec repairs a request's strings.
func validUTF8(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	return strings.ToValidUTF8(s, "\uFFFD")
}
