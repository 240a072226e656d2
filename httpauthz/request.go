package httpauthz

import (
	"errors"
	"net/http"
	"strconv"
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

// checkMsg holds the messages of one CheckRequest. A Handler reuses them
// (a Checker keeps no request), its headers map included.
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

// maxPooledHeaders bounds the headers map a reused checkMsg keeps: the
// map of a request with more is dropped with it, not kept for the next.
const maxPooledHeaders = 64

// names interns lower-case header names.
type names = intern[string, string]

// checkRequest returns the CheckRequest Envoy's gRPC ext_authz filter would
// send for the request r describes (see the package comment), or a
// *rejection. prefix is the normalized path prefix ("" for none).
func checkRequest(r *http.Request, prefix string) (*authv3.CheckRequest, error) {
	var m checkMsg
	if err := m.fill(r, prefix, &names{}); err != nil {
		return nil, err
	}
	return &m.req, nil
}

// fill makes m the CheckRequest of r (see checkRequest), lower-case
// header names from lower; m's previous request is gone.
func (m *checkMsg) fill(r *http.Request, prefix string, lower *names) error {
	if headerBytes(r) > MaxHeaderBytes {
		return errHeadersTooBig
	}
	method, err := originalMethod(r)
	if err != nil {
		return err
	}
	path, err := originalURI(r, prefix)
	if err != nil {
		return err
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

	m.http.Method = method
	m.http.Path = path
	m.http.Host = host
	m.http.Scheme = scheme
	m.http.Protocol = r.Proto
	if m.http.Headers == nil {
		m.http.Headers = make(map[string]string, len(r.Header)+4)
	} else {
		clear(m.http.Headers)
	}
	fillHeaders(m.http.Headers, r.Header, lower)
	hs := m.http.Headers
	hs[":method"], hs[":path"], hs[":authority"], hs[":scheme"] = method, path, host, scheme
	m.http.Id = hs["x-request-id"]
	m.areq.Http = &m.http
	m.attrs.Request = &m.areq
	m.attrs.Source = nil
	if ip, port, ok := splitPeer(r.RemoteAddr); ok {
		m.sa.Protocol = corev3.SocketAddress_TCP
		m.sa.Address = ip
		m.port.PortValue = port
		m.sa.PortSpecifier = &m.port
		m.sock.SocketAddress = &m.sa
		m.addr.Address = &m.sock
		m.src.Address = &m.addr
		m.attrs.Source = &m.src
	}
	m.req.Attributes = &m.attrs
	return nil
}

// reusable reports whether m may serve another request: its headers map
// is not one a large request grew.
func (m *checkMsg) reusable() bool { return len(m.http.Headers) <= maxPooledHeaders }

// splitPeer splits an http.Request's RemoteAddr ("ip:port", "[ipv6]:port")
// into the IP and port; ok is false for a peer without them (a unix
// socket's).
func splitPeer(addr string) (ip string, port uint32, ok bool) {
	i := strings.LastIndexByte(addr, ':')
	if i <= 0 {
		return "", 0, false
	}
	n, err := strconv.ParseUint(addr[i+1:], 10, 16)
	if err != nil {
		return "", 0, false
	}
	ip = addr[:i]
	if len(ip) > 2 && ip[0] == '[' && ip[len(ip)-1] == ']' {
		ip = ip[1 : len(ip)-1]
	}
	return ip, uint32(n), ip != ""
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
// prefix. It is not canonicalised here: the rules read every path source
// in its canonical form, whichever front-end asked.
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

// fillHeaders adds h to m as Envoy's headers map: lower-case names (from
// lower), a repeated header's values joined by ",".
func fillHeaders(m map[string]string, h http.Header, lower *names) {
	for k, vs := range h {
		var v string
		if len(vs) == 1 {
			v = vs[0]
		} else {
			v = strings.Join(vs, ",")
		}
		m[lower.get(k, len(k), toLower)] = validUTF8(v)
	}
}

// toLower returns s in ASCII lower case; s itself when it has no
// upper-case letter.
func toLower(s string) string {
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
