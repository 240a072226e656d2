package reqpath

import (
	"errors"
	"strings"
)

// Form says how [Canonical] reads a path beyond the forms every reading
// shares. The zero Form is the default: case kept, an encoded slash a
// separator.
type Form struct {
	// FoldCase lower-cases ASCII letters (not the hex digits of escapes),
	// for upstreams that serve paths case-insensitively.
	FoldCase bool
	// KeepEncodedSlash keeps "%2F" as an escape inside its segment instead
	// of reading it as a separator: the reading of an upstream that does
	// not decode it.
	KeepEncodedSlash bool
}

// Canonical returns p in the canonical form the package comment describes:
// it begins with "/", has no empty, "." or ".." segment, no trailing slash
// (unless it is "/"), no query, fragment or ";" parameter, no escape of an
// unreserved character, and every other escape upper-case. A p that is
// empty once its query is dropped gives "/".
func Canonical(p string, f Form) string {
	if i := strings.IndexAny(p, "?#"); i >= 0 {
		p = p[:i]
	}
	if isCanonical(p, f.FoldCase) {
		return p
	}
	return string(appendCanonical(make([]byte, 0, len(p)+8), p, f))
}

// HasEncodedSlash reports whether p, up to its query, holds "%2F" or
// "%2f": whether Canonical's two readings of an encoded slash can differ.
func HasEncodedSlash(p string) bool {
	if i := strings.IndexAny(p, "?#"); i >= 0 {
		p = p[:i]
	}
	for i := strings.IndexByte(p, '%'); i >= 0 && i+2 < len(p); {
		if p[i+1] == '2' && (p[i+2] == 'F' || p[i+2] == 'f') {
			return true
		}
		j := strings.IndexByte(p[i+1:], '%')
		if j < 0 {
			break
		}
		i += 1 + j
	}
	return false
}

// isCanonical reports whether p is its own canonical form, without
// building it: the common case, checked without allocating.
func isCanonical(p string, fold bool) bool {
	if p == "/" {
		return true
	}
	if len(p) < 2 || p[0] != '/' || p[len(p)-1] == '/' {
		return false
	}
	seg := 1 // start of the current segment
	for i := 1; i <= len(p); i++ {
		if i == len(p) || p[i] == '/' {
			switch p[seg:i] {
			case "", ".", "..":
				return false
			}
			seg = i + 1
			continue
		}
		c := p[i]
		if !rawPchar(c) || fold && 'A' <= c && c <= 'Z' {
			return false
		}
	}
	return true
}

// appendCanonical appends Canonical(p, f) to out, p without query.
func appendCanonical(out []byte, p string, f Form) []byte {
	base := len(out)
	seg := base // where the current segment's text begins, after its "/"
	out = append(out, '/')
	seg++
	param := false // inside a ";" parameter, which runs to the next separator
	end := func() {
		switch string(out[seg:]) {
		case "", ".":
			out = out[:seg-1]
		case "..":
			out = out[:seg-1]
			if i := lastSlash(out, base); i >= 0 {
				out = out[:i]
			}
		}
	}
	next := func() {
		end()
		out = append(out, '/')
		seg, param = len(out), false
	}
	for i := 0; i < len(p); i++ {
		c := p[i]
		if c == '%' && i+2 < len(p) && isHex(p[i+1]) && isHex(p[i+2]) {
			b := unhex(p[i+1])<<4 | unhex(p[i+2])
			i += 2
			switch {
			case b == '/' && !f.KeepEncodedSlash:
				next()
			case param:
			case unreserved(b):
				out = append(out, fold(b, f.FoldCase))
			default:
				out = appendEscape(out, b)
			}
			continue
		}
		switch {
		case c == '/':
			next()
		case param:
		case c == ';':
			param = true
		case c == '%':
			out = append(out, "%25"...)
		case rawPchar(c):
			out = append(out, fold(c, f.FoldCase))
		default:
			out = appendEscape(out, c)
		}
	}
	end()
	if len(out) == base {
		out = append(out, '/')
	}
	return out
}

// lastSlash returns the index of the last '/' of out at or after base, or
// -1.
func lastSlash(out []byte, base int) int {
	for i := len(out) - 1; i >= base; i-- {
		if out[i] == '/' {
			return i
		}
	}
	return -1
}

// Pattern returns the canonical form of a rule's path pattern body (the
// value as written, less the trailing "*" of a prefix), to be compared
// with Canonical's output under the same Form. For an exact pattern it is
// Canonical(body). For a prefix ending in "/" it is the canonical directory
// with a trailing "/", and dir is true: the prefix holds the directory
// itself ("/api/coupon/*" holds "/api/coupon" and "/api/coupon/"). Any
// other prefix ends inside a segment, which is taken as written
// ("/api/.*" stays "/api/."). It fails for a body that does not begin with
// "/" or holds "?", "#" or ";", which no canonical path holds.
func Pattern(body string, prefix bool, f Form) (value string, dir bool, err error) {
	switch {
	case body == "" || body[0] != '/':
		return "", false, errors.New("a path value must begin with /")
	case strings.ContainsAny(body, "?#"):
		return "", false, errors.New("a path value cannot hold ? or #: a path is matched without its query")
	case strings.IndexByte(body, ';') >= 0:
		return "", false, errors.New("a path value cannot hold ;: a path is matched without its ; parameters")
	case !prefix:
		return Canonical(body, f), false, nil
	case body[len(body)-1] == '/':
		c := Canonical(body, f)
		if c != "/" {
			c += "/"
		}
		return c, true, nil
	}
	// A letter after the partial last segment keeps it from reading as a
	// dot segment or an unfinished escape; it survives canonicalisation as
	// the last byte.
	c := Canonical(body+"x", f)
	return c[:len(c)-1], false, nil
}

// Matches reports whether the canonical path v is held by a pattern of
// Pattern's value and dir: equal to an exact one, under a prefix (dir: the
// directory itself too).
func Matches(v, value string, prefix, dir bool) bool {
	switch {
	case !prefix:
		return v == value
	case strings.HasPrefix(v, value):
		return true
	}
	return dir && len(v) == len(value)-1 && value[:len(v)] == v
}

// unreserved reports whether c is an RFC 3986 unreserved character.
func unreserved(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' ||
		c == '-' || c == '.' || c == '_' || c == '~'
}

// rawPchar reports whether c may stand unescaped in a canonical segment:
// an RFC 3986 pchar other than ";" and "%".
func rawPchar(c byte) bool {
	if unreserved(c) {
		return true
	}
	switch c {
	case '!', '$', '&', '\'', '(', ')', '*', '+', ',', '=', ':', '@':
		return true
	}
	return false
}

func fold(c byte, on bool) byte {
	if on && 'A' <= c && c <= 'Z' {
		return c + 'a' - 'A'
	}
	return c
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

func unhex(c byte) byte {
	switch {
	case c <= '9':
		return c - '0'
	case c >= 'a':
		return c - 'a' + 10
	}
	return c - 'A' + 10
}

const upperHex = "0123456789ABCDEF"

func appendEscape(out []byte, b byte) []byte {
	return append(out, '%', upperHex[b>>4], upperHex[b&15])
}
