package extauthz

import (
	"net/netip"
	"strings"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"

	"github.com/flashgate/flashgate/enforce"
	"github.com/flashgate/flashgate/window"
)

// Mapping is the outcome of [Config.Map] for one request. Reuse one across
// requests to spare allocations; it is not safe for concurrent use.
type Mapping struct {
	// Hits are the limits the request falls under, one per matching rule,
	// in file order.
	Hits []window.Hit
	// Rules[i] is the rule that produced Hits[i].
	Rules []*Rule
	// Missing is a matching rule with on_missing: deny whose value the
	// request lacks (an enforcing one if any, else a shadow one); nil if none.
	Missing *Rule

	// tags[i] is Hits[i]'s Tag: its rule, and the hit's own outcome that
	// the limiter reports into it.
	tags []enforce.HitTag
	// req is what the server asks the core, its answer's storage reused.
	req enforce.Request
}

// Report returns what the last decision on m's hits reported of Hits[i]'s
// own window; Known is false when it reported nothing.
func (m *Mapping) Report(i int) window.HitReport { return m.tags[i].Report }

// Reset empties m, keeping its storage.
func (m *Mapping) Reset() {
	clear(m.Hits)
	clear(m.Rules)
	clear(m.tags)
	m.Hits, m.Rules, m.tags, m.Missing = m.Hits[:0], m.Rules[:0], m.tags[:0], nil
}

// constKeys returns, by rule index, the limit key of every rule whose key
// has no part from the request (nvar 0), built with keys; "" for the others.
// A caller that maps many requests builds it once per Config (see mapWith).
func (c *Config) constKeys(keys window.Keys) []string {
	out := make([]string, len(c.Rules))
	for i, r := range c.Rules {
		if r.nvar == 0 {
			out[i] = keys.Key(r.Name, r.constKey)
		}
	}
	return out
}

// mapWith is Map with the constant keys prebuilt (constKeys from
// c.constKeys(keys), or nil to build them per request), and every hit a
// shadow hit when shadowAll (the server's --shadow).
func (c *Config) mapWith(req *authv3.CheckRequest, keys window.Keys, constKeys []string, shadowAll bool, m *Mapping) {
	m.Reset()
	if c == nil {
		return
	}
	v := view{cfg: c, attrs: req.GetAttributes()}
	v.http = v.attrs.GetRequest().GetHttp()
	var parts [MaxDepth]string
	for _, r := range c.Rules {
		applies, missing := true, false
		np := 0
		var single string
		for i := range r.Match {
			mt := &r.Match[i]
			val, ok := v.value(mt.src)
			if mt.HasValue {
				if !ok || !v.holds(mt, val) {
					applies = false
					break
				}
				parts[np] = mt.pattern
			} else {
				if !ok {
					missing = true
				}
				parts[np], single = val, val
			}
			np++
		}
		if !applies {
			continue
		}
		if missing {
			if r.OnMissing == MissingDeny && (m.Missing == nil || m.Missing.Shadow && !r.Shadow) {
				m.Missing = r
			}
			continue
		}
		var key string
		switch {
		case r.nvar == 0 && constKeys != nil:
			key = constKeys[r.idx]
		case r.nvar == 0:
			key = keys.Key(r.Name, r.constKey)
		case np == 1:
			key = keys.Key(r.Name, single)
		default:
			// The joined value only feeds the key: build it on the stack.
			var buf [256]byte
			key = keys.KeyBytes(r.Name, appendJoined(buf[:0], parts[:np]))
		}
		m.Hits = append(m.Hits, window.Hit{
			Key: key, Rule: r.Name, Limit: r.Limit, Shadow: r.Shadow || shadowAll,
		})
		m.Rules = append(m.Rules, r)
		m.tags = append(m.tags, enforce.HitTag{Rule: r, Mode: r.FailureMode})
	}
	// Tagged once the tags stop moving.
	for i := range m.Hits {
		m.Hits[i].Tag = &m.tags[i]
	}
}

// view reads values out of one CheckRequest, memoising them per source.
type view struct {
	cfg   *Config
	attrs *authv3.AttributeContext
	http  *authv3.AttributeContext_HttpRequest
	state [MaxSources]uint8 // 0 unknown, 1 present, 2 missing
	vals  [MaxSources]string
	// alt is the path's reading with encoded slashes kept (hasAlt: it has
	// one), computed once a path pattern is asked about it (altDone).
	alt             string
	hasAlt, altDone bool
}

func (v *view) value(i int) (string, bool) {
	switch v.state[i] {
	case 1:
		return v.vals[i], true
	case 2:
		return "", false
	}
	s, ok := v.compute(v.cfg.sources[i])
	if ok && s != "" {
		v.state[i], v.vals[i] = 1, s
		return s, true
	}
	v.state[i] = 2
	return "", false
}

func (v *view) compute(src Source) (string, bool) {
	switch src.Kind {
	case SourceHeader:
		s, ok := v.header(src.Name)
		return firstElement(s), ok
	case SourcePath:
		return v.pathValue()
	case SourceMethod:
		m := v.http.GetMethod()
		if m == "" {
			m, _ = v.header(":method")
		}
		return m, m != ""
	case SourceAuthority:
		h := v.http.GetHost()
		if h == "" {
			h, _ = v.header(":authority")
		}
		return h, h != ""
	case SourceContextExtension:
		s, ok := v.attrs.GetContextExtensions()[src.Name]
		return s, ok
	case SourceRemoteAddress:
		return v.clientIP()
	}
	return "", false
}

// header returns a request header by lower-case name: from the headers map
// Envoy fills by default, else from header_map (encode_raw_headers), where
// repeated headers are joined with "," as Envoy does in the map.
func (v *view) header(name string) (string, bool) {
	if s, ok := v.http.GetHeaders()[name]; ok {
		return s, true
	}
	var (
		first string
		b     strings.Builder // used from the second occurrence on: linear, not quadratic
		n     int
	)
	for _, h := range v.http.GetHeaderMap().GetHeaders() {
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

// firstElement is what a header source reads of a header value: the text
// before its first comma, without the whitespace around it. Envoy joins a
// repeated header's values with ",", so a client that repeats a header, or
// lists values in one, is keyed by its first value alone: what it appends
// never opens a fresh bucket. A value that itself holds commas is keyed by
// its first element, which can merge buckets but never split one.
func firstElement(s string) string {
	if i := strings.IndexByte(s, ','); i >= 0 {
		return strings.Trim(s[:i], " \t")
	}
	return s
}

// clientIP returns Envoy's source address, or with trusted hops the Nth
// entry from the right of x-forwarded-for (source address if it has fewer).
func (v *view) clientIP() (string, bool) {
	peer := v.attrs.GetSource().GetAddress().GetSocketAddress().GetAddress()
	if strings.IndexByte(peer, ':') >= 0 {
		// IPv6 (a dual-stack listener reports IPv4 clients as ::ffff:a.b.c.d):
		// canonical, so one client is one bucket however it arrives.
		if c := normalizeIP(peer); c != "" {
			peer = c
		}
	}
	n := v.cfg.ClientIP.TrustedHops
	if n == 0 {
		return peer, peer != ""
	}
	xff, ok := v.header("x-forwarded-for")
	if !ok {
		return peer, peer != ""
	}
	ip, ok := nthFromRight(xff, n)
	if !ok || ip == "" {
		// Fewer entries than trusted hops, or garbage where a trusted proxy
		// should have written an address: the peer (a proxy) is the client.
		// That lumps such requests together; it never lets them escape.
		return peer, peer != ""
	}
	return ip, true
}

// nthFromRight returns the nth (1-based) comma-separated entry from the right
// of list as a canonical IP address; ok is false if list has fewer entries.
// An entry that is not an IP (or IP:port) yields "", true.
func nthFromRight(list string, n int) (string, bool) {
	for i := 1; ; i++ {
		j := strings.LastIndexByte(list, ',')
		if i == n {
			entry := strings.TrimSpace(list[j+1:])
			return normalizeIP(entry), true
		}
		if j < 0 {
			return "", false
		}
		list = list[:j]
	}
}

// normalizeIP returns s (an IP, or IP:port) in canonical form, IPv4-mapped
// IPv6 unmapped, so that one client cannot spell its address many ways; ""
// if s is no address.
func normalizeIP(s string) string {
	if a, err := netip.ParseAddr(s); err == nil {
		return a.Unmap().WithZone("").String()
	}
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return ap.Addr().Unmap().WithZone("").String()
	}
	return ""
}

// asciiEqualFold reports whether a and b are equal under ASCII case folding,
// as HTTP header names compare (RFC 9110: tokens are ASCII); unlike
// strings.EqualFold it folds no other letter (U+212A KELVIN SIGN is not k).
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
