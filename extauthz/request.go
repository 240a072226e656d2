package extauthz

import (
	"context"
	"strings"
	"time"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"

	"github.com/flashgate/flashgate/descriptors"
	"github.com/flashgate/flashgate/enforce"
	"github.com/flashgate/flashgate/window"
)

// mapping is one check's hits, tagged, with the scratch its answer is
// built in. Pooled; not safe for concurrent use.
type mapping struct {
	descriptors.Mapping

	tags []enforce.HitTag
	req  enforce.Request
	grpc checkAttrs
}

// Report returns the last decision's report of Hits[i]'s window.
func (m *mapping) Report(i int) window.HitReport { return m.tags[i].Report }

func (m *mapping) Reset() {
	m.Mapping.Reset()
	clear(m.tags)
	m.tags = m.tags[:0]
	m.grpc = checkAttrs{}
}

// mapRequest maps req under p into m, which is reset, and tags its hits.
func (m *mapping) mapRequest(p *descriptors.Mapper, req descriptors.Request, shadowAll bool) {
	p.Map(req, shadowAll, &m.Mapping)
	for _, r := range m.Rules {
		m.tags = append(m.tags, enforce.HitTag{Rule: r, Mode: r.FailureMode})
	}
	for i := range m.Hits {
		m.Hits[i].Tag = &m.tags[i]
	}
}

// Decide decides req as Check decides a CheckRequest and makes a the
// core's answer, reusing a's storage. Its error is always nil.
func (s *Server) Decide(ctx context.Context, req descriptors.Request, a *enforce.Answer) error {
	start := s.now()
	m := s.pool.Get().(*mapping)
	copyAnswer(a, s.decide(ctx, s.rules.Load(), req, m))
	s.release(m, start)
	return nil
}

// Headers returns the rate-limit header families (enforce.Options.Headers).
func (s *Server) Headers() enforce.Families { return s.core.Headers() }

// check answers req under rs, mapped in m, which it returns to the pool.
func (s *Server) check(ctx context.Context, rs *ruleSet, req descriptors.Request, m *mapping, start time.Time) *authv3.CheckResponse {
	resp := rs.answer(s.decide(ctx, rs, req, m))
	s.release(m, start)
	return resp
}

// decide maps req under rs into m and returns the core's answer, valid
// until m is reset.
func (s *Server) decide(ctx context.Context, rs *ruleSet, req descriptors.Request, m *mapping) *enforce.Answer {
	m.mapRequest(rs.mapper, req, s.core.Shadow())
	return s.core.Decide(ctx, rs.request(m)).Answer
}

// release returns m to the pool and observes the check's duration.
func (s *Server) release(m *mapping, start time.Time) {
	m.Reset()
	s.pool.Put(m)
	s.metrics.checkDur.Observe(s.now().Sub(start).Seconds())
}

// copyAnswer makes dst a copy of src, reusing dst's storage.
func copyAnswer(dst, src *enforce.Answer) {
	ps, ss := dst.Policies[:0], dst.States[:0]
	*dst = *src
	dst.Policies, dst.States = append(ps, src.Policies...), append(ss, src.States...)
}

// checkAttrs reads a CheckRequest as a descriptors.Request.
type checkAttrs struct {
	attrs *authv3.AttributeContext
	http  *authv3.AttributeContext_HttpRequest
}

var _ descriptors.Request = (*checkAttrs)(nil)

func (a *checkAttrs) set(req *authv3.CheckRequest) {
	a.attrs = req.GetAttributes()
	a.http = a.attrs.GetRequest().GetHttp()
}

// Path implements descriptors.Request.
func (a *checkAttrs) Path() string { return a.http.GetPath() }

// Method implements descriptors.Request: the method field, else :method.
func (a *checkAttrs) Method() string {
	if m := a.http.GetMethod(); m != "" {
		return m
	}
	m, _ := a.Header(":method")
	return m
}

// Authority implements descriptors.Request: the host field, else
// :authority.
func (a *checkAttrs) Authority() string {
	if h := a.http.GetHost(); h != "" {
		return h
	}
	h, _ := a.Header(":authority")
	return h
}

// PeerAddress implements descriptors.Request: Envoy's source address.
func (a *checkAttrs) PeerAddress() string {
	return a.attrs.GetSource().GetAddress().GetSocketAddress().GetAddress()
}

// ContextExtension implements descriptors.Request.
func (a *checkAttrs) ContextExtension(key string) (string, bool) {
	s, ok := a.attrs.GetContextExtensions()[key]
	return s, ok
}

// Header implements descriptors.Request: from the headers map, else from
// header_map with repeated headers joined by ",".
func (a *checkAttrs) Header(name string) (string, bool) {
	if s, ok := a.http.GetHeaders()[name]; ok {
		return s, true
	}
	var (
		first string
		b     strings.Builder // used from the second occurrence on: linear, not quadratic
		n     int
	)
	for _, h := range a.http.GetHeaderMap().GetHeaders() {
		if !asciiEqualFold(h.GetKey(), name) {
			continue
		}
		s := h.GetValue()
		if s == "" && len(h.GetRawValue()) > 0 {
			s = string(h.GetRawValue())
		}
		switch n++; n {
		case 1:
			first = s
		case 2:
			b.WriteString(first)
			fallthrough
		default:
			b.WriteByte(',')
			b.WriteString(s)
		}
	}
	if n > 1 {
		return b.String(), true
	}
	return first, n == 1
}

// asciiEqualFold reports whether a and b are equal under ASCII case
// folding only, as HTTP header names compare.
func asciiEqualFold[A, B ~string | ~[]byte](a A, b B) bool {
	if len(a) != len(b) {
		return false
	}
	for i := 0; i < len(a); i++ {
		x, y := a[i], b[i]
		if 'A' <= x && x <= 'Z' {
			x += 'a' - 'A'
		}
		if 'A' <= y && y <= 'Z' {
			y += 'a' - 'A'
		}
		if x != y {
			return false
		}
	}
	return true
}
