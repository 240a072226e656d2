package descriptors

import (
	"github.com/goccy/go-yaml/ast"

	"github.com/flashgate/flashgate/internal/reqpath"
)

// This file reads request paths and path patterns in one canonical form
// (package reqpath), so no spelling of a path walks around a rule on it.

// PathCase says whether path rules tell letter case apart.
type PathCase uint8

const (
	// PathCaseSensitive: "/API/login" is not "/api/login" (the default).
	PathCaseSensitive PathCase = iota
	// PathCaseInsensitive: paths are matched and keyed ASCII lower-cased.
	PathCaseInsensitive
)

// String returns "sensitive" or "insensitive".
func (c PathCase) String() string {
	if c == PathCaseInsensitive {
		return "insensitive"
	}
	return "sensitive"
}

// pathForm is c's reqpath.Form; keepSlash reads an encoded slash as data.
func (c *Config) pathForm(keepSlash bool) reqpath.Form {
	return reqpath.Form{FoldCase: c.PathCase == PathCaseInsensitive, KeepEncodedSlash: keepSlash}
}

// holds reports whether m's pattern holds v, as the rules read it.
func (m *Match) holds(v string) bool { return reqpath.Matches(v, m.Value, m.Prefix, m.dir) }

// holds reports whether mt's pattern holds val; for a path with an
// encoded slash, in either reading.
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

// pathValue is the canonical path, encoded slashes decoded; absent when
// empty.
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

// pathPattern makes path pattern body canonical as requests' paths are.
func (p *cfgParser) pathPattern(n ast.Node, body string, m *Match) error {
	v, dir, err := reqpath.Pattern(body, m.Prefix, p.cfg.pathForm(false))
	if err != nil {
		return p.errf(n, "value %q: %s", m.pattern, err)
	}
	m.Value, m.dir = v, dir
	return nil
}
