package descriptors

import (
	"github.com/goccy/go-yaml/ast"

	"github.com/flashgate/flashgate/internal/reqpath"
)

// This file is how rules see a request path: one canonical form (package
// reqpath) for the request's path and for a rule's path patterns alike, so
// that no spelling of a path walks around a rule on it.

// PathCase says whether path rules tell letter case apart (the
// descriptors file's path_case).
type PathCase uint8

const (
	// PathCaseSensitive: "/API/login" is not "/api/login" (the default, as
	// RFC 3986 and most servers have it).
	PathCaseSensitive PathCase = iota
	// PathCaseInsensitive: paths are matched and keyed with ASCII letters
	// lower-cased, for upstreams that serve paths case-insensitively.
	PathCaseInsensitive
)

// String returns "sensitive" or "insensitive".
func (c PathCase) String() string {
	if c == PathCaseInsensitive {
		return "insensitive"
	}
	return "sensitive"
}

// pathForm is the reqpath.Form of c's paths; keepSlash reads an encoded
// slash as data (the second reading, see reqpath).
func (c *Config) pathForm(keepSlash bool) reqpath.Form {
	return reqpath.Form{FoldCase: c.PathCase == PathCaseInsensitive, KeepEncodedSlash: keepSlash}
}

// holds reports whether m's value pattern holds v, the request's value as
// the rules read it (canonical, for a path).
func (m *Match) holds(v string) bool { return reqpath.Matches(v, m.Value, m.Prefix, m.dir) }

// holds reports whether mt's value pattern holds the request's value val
// of mt's source; for a path with an encoded slash, in either reading.
func (v *view) holds(mt *Match, val string) bool {
	if mt.holds(val) {
		return true
	}
	if mt.Source.Kind != SourcePath {
		return false
	}
	if !v.altDone {
		v.altDone = true
		if p := v.req.Path(); reqpath.HasEncodedSlash(p) {
			v.alt, v.hasAlt = reqpath.Canonical(p, v.cfg.pathForm(true)), true
		}
	}
	return v.hasAlt && mt.holds(v.alt)
}

// pathValue is the path a path source reads: canonical, with its encoded
// slashes decoded; absent for an empty path.
func (v *view) pathValue() (string, bool) {
	p := v.req.Path()
	if p == "" || p[0] == '?' || p[0] == '#' {
		return "", false
	}
	return reqpath.Canonical(p, v.cfg.pathForm(false)), true
}

// pathCase reads the file's path_case.
func (p *cfgParser) pathCase(n ast.Node) error {
	s, err := p.str(n, "path_case")
	if err != nil {
		return err
	}
	switch s {
	case "sensitive":
		p.cfg.PathCase = PathCaseSensitive
	case "insensitive":
		p.cfg.PathCase = PathCaseInsensitive
	default:
		return p.errf(n, "path_case %q must be sensitive or insensitive", s)
	}
	return nil
}

// pathPattern makes m's value, a path pattern, canonical as requests' paths
// are (body is the value less a prefix's "*").
func (p *cfgParser) pathPattern(n ast.Node, body string, m *Match) error {
	v, dir, err := reqpath.Pattern(body, m.Prefix, p.cfg.pathForm(false))
	if err != nil {
		return p.errf(n, "value %q: %s", m.pattern, err)
	}
	m.Value, m.dir = v, dir
	return nil
}
