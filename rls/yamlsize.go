package rls

import (
	"fmt"

	"github.com/goccy/go-yaml/ast"
)

// MaxExpandedNodes bounds the YAML nodes one config file may stand for once
// its aliases are expanded: nested aliases multiply ("billion laughs"),
// and the decoder would build every copy.
const MaxExpandedNodes = 1 << 20

// checkExpansion refuses a file whose aliases expand past MaxExpandedNodes,
// or that defines an anchor name twice; it sizes each anchor once.
func checkExpansion(name string, f *ast.File) *ConfigError {
	c := expansion{anchors: map[string]ast.Node{}, sizes: map[ast.Node]int{}}
	collect := anchorCollector{anchors: c.anchors}
	for _, doc := range f.Docs {
		ast.Walk(&collect, doc)
	}
	if collect.twice != "" {
		return &ConfigError{File: name, Msg: fmt.Sprintf("anchor &%s is defined twice", collect.twice)}
	}
	total := 0
	for _, doc := range f.Docs {
		if total += c.size(doc); total > MaxExpandedNodes {
			return &ConfigError{File: name, Msg: fmt.Sprintf("its aliases expand to more than %d YAML nodes", MaxExpandedNodes)}
		}
	}
	return nil
}

// anchorCollector records every anchor's value by name and the first name
// defined twice.
type anchorCollector struct {
	anchors map[string]ast.Node
	twice   string
}

func (a *anchorCollector) Visit(n ast.Node) ast.Visitor {
	if an, ok := n.(*ast.AnchorNode); ok && an.Name != nil {
		name := an.Name.String()
		if _, dup := a.anchors[name]; dup && a.twice == "" {
			a.twice = name
		}
		a.anchors[name] = an.Value
	}
	return a
}

// expansion sizes subtrees with their aliases expanded, saturating just
// above MaxExpandedNodes.
type expansion struct {
	anchors map[string]ast.Node
	sizes   map[ast.Node]int // anchors' values sized so far; -1 while being sized
}

func (c *expansion) size(n ast.Node) int {
	v := &counter{c: c}
	ast.Walk(v, n)
	return v.n
}

// aliased returns the expanded size of the anchor an alias names.
func (c *expansion) aliased(al *ast.AliasNode) int {
	if al.Value == nil {
		return 1
	}
	target, ok := c.anchors[al.Value.String()]
	if !ok || target == nil {
		return 1 // the decoder reports an unknown alias
	}
	switch s, seen := c.sizes[target]; {
	case seen && s < 0:
		return MaxExpandedNodes + 1 // an alias inside its own anchor
	case seen:
		return s
	}
	c.sizes[target] = -1
	s := c.size(target)
	c.sizes[target] = s
	return s
}

type counter struct {
	c *expansion
	n int
}

func (v *counter) Visit(n ast.Node) ast.Visitor {
	if v.n > MaxExpandedNodes {
		return nil
	}
	if al, ok := n.(*ast.AliasNode); ok {
		v.n = min(v.n+v.c.aliased(al), MaxExpandedNodes+1)
		return nil
	}
	v.n++
	return v
}
