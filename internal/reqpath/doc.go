// Package reqpath puts a request path in the one canonical form that
// flashgate's rules match and key it by, so that the many spellings of one
// path an upstream serves alike are one path to a rule.
//
// [Canonical] reads a path (the :path Envoy sends, a forward-auth proxy's
// original URI) as RFC 3986 section 6 normalises one, then as the servers a
// rule protects read it:
//
//	query, fragment        dropped: "/a?x#y" is "/a"
//	repeated slashes       merged:  "//a///b" is "/a/b"
//	trailing slash         dropped: "/a/" is "/a" (the root stays "/")
//	dot segments           resolved, never above the root: "/a/./b/../c" and "/../a/c" are "/a/c"
//	unreserved escapes     decoded: "%6C" is "l", "%7E" is "~", "%2E%2E" is a dot segment
//	other escapes          kept, hex upper-cased: "%3b" is "%3B"; a "%" not followed by two hex digits is "%25"
//	raw bytes outside RFC 3986's pchar (space, non-ASCII, controls, "\" ...) percent-encoded: "/café" is "/caf%C3%A9"
//	";" parameters         dropped per segment: "/a;jsessionid=1/b;v=2" is "/a/b", "/a/..;/b" is "/b"
//	"%2F" / "%2f"          a separator: "/a%2Fb" is "/a/b" (see below)
//	case                   kept, unless Form.FoldCase: then ASCII letters are lower-cased
//
// An encoded slash is where upstreams disagree: Envoy and nginx's
// $request_uri keep it, Go's net/http and nginx's $uri decode it, Tomcat
// refuses it. A rule that must hold against every one of them reads a path
// with an encoded slash twice: with the slash decoded (the form it is keyed
// by) and with it kept as an escape inside its segment ([Form.KeepEncodedSlash]),
// and holds the request if either reading matches; [HasEncodedSlash] says
// when the second reading differs.
//
// Canonical is a pure function, safe for concurrent use, and idempotent: a
// canonical path is its own canonical form, and then returned without
// allocating.
package reqpath
