package httpauthz

import (
	"errors"
	"net/http"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/flashgate/flashgate/descriptors"
)

// The request headers a proxy sets to describe the original request.
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

// MaxHeaderBytes bounds a check's URI and headers, counted as HTTP/2 counts
// a header list; larger checks are refused with 400.
const MaxHeaderBytes = 64 << 10

const maxMethodLen = 64

// Reasons a request got no decision, the rejected counter's labels.
const (
	ReasonBadMethod       = "bad_method"
	ReasonBadURI          = "bad_uri"
	ReasonOutsidePrefix   = "outside_prefix"
	ReasonHeadersTooLarge = "headers_too_large"
	ReasonCheckFailed     = "check_failed"
)

var reasons = [...]string{ReasonBadMethod, ReasonBadURI, ReasonOutsidePrefix, ReasonHeadersTooLarge, ReasonCheckFailed}

// rejection is a request that is no check: its reason and the client's
// plain-text sentence, never holding request values.
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

// attrs is the checked request as the rules read it; a Handler reuses
// them.
type attrs struct {
	r                    *http.Request
	method, path, scheme string
	canon                *names
}

var _ descriptors.Request = (*attrs)(nil)

// names interns canonical header names by their lower-case spelling.
type names = intern[string, string]

// fill makes a the checked request of r, or returns a *rejection.
func (a *attrs) fill(r *http.Request, prefix string, canon *names) error {
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
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	if v := forwarded(r.Header, HeaderForwardedProto); v != "" {
		scheme = v
	}
	*a = attrs{r: r, method: method, path: path, scheme: validUTF8(scheme), canon: canon}
	return nil
}

// Path implements descriptors.Request: the original URI.
func (a *attrs) Path() string { return a.path }

// Method implements descriptors.Request: the original method.
func (a *attrs) Method() string { return a.method }

// Authority implements descriptors.Request: X-Forwarded-Host, else Host.
func (a *attrs) Authority() string {
	if v := forwarded(a.r.Header, HeaderForwardedHost); v != "" {
		return validUTF8(v)
	}
	return validUTF8(a.r.Host)
}

// PeerAddress implements descriptors.Request: the proxy's IP.
func (a *attrs) PeerAddress() string {
	ip, _ := splitPeer(a.r.RemoteAddr)
	return ip
}

// ContextExtension implements descriptors.Request: always absent here.
func (a *attrs) ContextExtension(string) (string, bool) { return "", false }

// Header implements descriptors.Request as Envoy's headers map reads: the
// checked request's pseudo-headers, else the header in any case, repeated
// values joined by ",", invalid UTF-8 repaired.
func (a *attrs) Header(name string) (string, bool) {
	if strings.HasPrefix(name, ":") {
		switch name {
		case ":method":
			return a.method, true
		case ":path":
			return a.path, true
		case ":authority":
			return a.Authority(), true
		case ":scheme":
			return a.scheme, true
		}
		return "", false
	}
	vs, ok := a.r.Header[a.canon.get(name, len(name), http.CanonicalHeaderKey)]
	if !ok {
		// A name net/http did not canonicalise.
		for k, v := range a.r.Header {
			if lowerEquals(k, name) {
				vs, ok = v, true
				break
			}
		}
		if !ok {
			return "", false
		}
	}
	if len(vs) == 1 {
		return validUTF8(vs[0]), true
	}
	return validUTF8(strings.Join(vs, ",")), true
}

// splitPeer returns the IP of a RemoteAddr; false without IP and port.
func splitPeer(addr string) (ip string, ok bool) {
	i := strings.LastIndexByte(addr, ':')
	if i <= 0 {
		return "", false
	}
	if _, err := strconv.ParseUint(addr[i+1:], 10, 16); err != nil {
		return "", false
	}
	ip = addr[:i]
	if len(ip) > 2 && ip[0] == '[' && ip[len(ip)-1] == ']' {
		ip = ip[1 : len(ip)-1]
	}
	return ip, ip != ""
}

// forwarded returns the first element of X-Forwarded-Host or -Proto.
func forwarded(h http.Header, name string) string {
	vs := h[name]
	if len(vs) == 0 {
		return ""
	}
	v, _, _ := strings.Cut(vs[0], ",")
	return strings.TrimSpace(v)
}

// headerBytes is r's size as MaxHeaderBytes counts it.
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

// validMethod reports whether m is a method token of at most maxMethodLen.
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

// originalURI returns the checked request's path and query as Envoy sends
// :path; the rules canonicalise it.
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

// requestPath returns the origin form of a request target: uri when it
// starts with "/", else the path of an absolute http(s) URI.
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

// cutSchemePrefix returns uri without a leading "http://" or "https://".
func cutSchemePrefix(uri string) (string, bool) {
	for _, s := range [...]string{"http://", "https://"} {
		if len(uri) >= len(s) && strings.EqualFold(uri[:len(s)], s) {
			return uri[len(s):], true
		}
	}
	return "", false
}

// stripPrefix removes prefix from path at a "/" boundary ("/authz" → "/");
// a path outside the prefix is refused.
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

// NormalizePrefix returns prefix as the Handler matches it: "" for none,
// else "/…" without a trailing "/". It fails for a prefix that is no path.
func NormalizePrefix(prefix string) (string, error) {
	if prefix == "" {
		return "", nil
	}
	if !strings.HasPrefix(prefix, "/") || strings.ContainsAny(prefix, "?# \t") {
		return "", errors.New("a path prefix must be a path starting with / (no query, no spaces)")
	}
	return strings.TrimRight(prefix, "/"), nil
}

// lowerEquals reports whether k in ASCII lower case is lower.
func lowerEquals(k, lower string) bool {
	if len(k) != len(lower) {
		return false
	}
	for i := 0; i < len(k); i++ {
		c := k[i]
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		if c != lower[i] {
			return false
		}
	}
	return true
}

// validUTF8 returns s with invalid UTF-8 runs as U+FFFD, as the gRPC
// codec repairs them.
func validUTF8(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	return strings.ToValidUTF8(s, "\uFFFD")
}
