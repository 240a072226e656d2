package enforce

import "strings"

// ValidHeaderName reports whether s is an HTTP header name (RFC 9110
// token, at most 256 bytes), or an HTTP/2 pseudo-header such as :authority.
func ValidHeaderName(s string) bool {
	s = strings.TrimPrefix(s, ":")
	if s == "" || len(s) > 256 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0 {
			continue
		}
		return false
	}
	return true
}
