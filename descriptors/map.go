package descriptors

import (
	"net/netip"
	"strings"

	"github.com/flashgate/flashgate/window"
)

// Request is what the rules read of one request, whichever front-end
// received it. Its methods must not fail or block.
type Request interface {
	// Path is the request's path as sent, query included.
	Path() string
	Method() string
	Authority() string
	// Header returns header name (lower case), repeated values joined
	// by ",".
	Header(name string) (value string, ok bool)
	// PeerAddress is the IP address of the connection's peer, no port.
	PeerAddress() string
	ContextExtension(key string) (value string, ok bool)
}

// Mapping is what a Mapper found for one request; reusable, not safe for
// concurrent use.
type Mapping struct {
	// Hits are the limits the request falls under, in file order.
	Hits []window.Hit
	// Rules[i] is the rule that produced Hits[i].
	Rules []*Rule
	// Missing is a matching on_missing: deny rule whose value the request
	// lacks (an enforcing one first); nil if none.
	Missing *Rule
}

// Reset empties m, keeping its storage.
func (m *Mapping) Reset() {
	clear(m.Hits)
	clear(m.Rules)
	m.Hits, m.Rules, m.Missing = m.Hits[:0], m.Rules[:0], nil
}

// Mapper maps requests to hits under one Config's rules; immutable and
// safe for concurrent use.
type Mapper struct {
	cfg  *Config
	keys window.Keys
	// constKeys are the keys of rules with no request part, by index.
	constKeys []string
}

// NewMapper returns the Mapper of cfg's rules with keys.
func NewMapper(cfg *Config, keys window.Keys) *Mapper {
	p := &Mapper{cfg: cfg, keys: keys, constKeys: make([]string, len(cfg.Rules))}
	for i, r := range cfg.Rules {
		if r.nvar == 0 {
			p.constKeys[i] = keys.Key(r.Name, r.constKey)
		}
	}
	return p
}

// Config returns the rules p maps by.
func (p *Mapper) Config() *Config { return p.cfg }

// Map computes the hits of req into m (reset first), all shadow hits when
// shadowAll. It never fails, whatever req holds, and reads no clock.
func (p *Mapper) Map(req Request, shadowAll bool, m *Mapping) {
	m.Reset()
	c := p.cfg
	v := view{cfg: c, req: req}
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
		case r.nvar == 0 && p.constKeys != nil:
			key = p.constKeys[r.idx]
		case r.nvar == 0:
			key = p.keys.Key(r.Name, r.constKey)
		case np == 1:
			key = p.keys.Key(r.Name, single)
		default:
			var buf [256]byte
			key = p.keys.KeyBytes(r.Name, appendJoined(buf[:0], parts[:np]))
		}
		m.Hits = append(m.Hits, window.Hit{Key: key, Rule: r.Name, Limit: r.Limit, Shadow: r.Shadow || shadowAll})
		m.Rules = append(m.Rules, r)
	}
}

// view reads values out of one request, memoising them per source.
type view struct {
	cfg   *Config
	req   Request
	state [MaxSources]uint8 // 0 unknown, 1 present, 2 missing
	vals  [MaxSources]string
	// alt is the path read with encoded slashes kept, computed on demand.
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
		s, ok := v.req.Header(src.Name)
		return firstElement(s), ok
	case SourcePath:
		return v.pathValue()
	case SourceMethod:
		m := v.req.Method()
		return m, m != ""
	case SourceAuthority:
		h := v.req.Authority()
		return h, h != ""
	case SourceContextExtension:
		return v.req.ContextExtension(src.Name)
	case SourceRemoteAddress:
		return v.clientIP()
	}
	return "", false
}

// firstElement is what a header source reads: the value before its first
// comma, trimmed, so a repeated or listed header never opens a fresh
// bucket.
func firstElement(s string) string {
	if i := strings.IndexByte(s, ','); i >= 0 {
		return strings.Trim(s[:i], " \t")
	}
	return s
}

// clientIP returns the peer's address, or with trusted hops the Nth entry
// from the right of x-forwarded-for.
func (v *view) clientIP() (string, bool) {
	peer := v.req.PeerAddress()
	if strings.IndexByte(peer, ':') >= 0 {
		// Canonical, so one client is one bucket however it arrives.
		if c := normalizeIP(peer); c != "" {
			peer = c
		}
	}
	n := v.cfg.ClientIP.TrustedHops
	if n == 0 {
		return peer, peer != ""
	}
	xff, ok := v.req.Header("x-forwarded-for")
	if !ok {
		return peer, peer != ""
	}
	ip, ok := nthFromRight(xff, n)
	if !ok || ip == "" {
		// Too few entries or garbage: the peer is the client, which lumps
		// such requests together but never lets them escape.
		return peer, peer != ""
	}
	return ip, true
}

// nthFromRight returns the nth entry from the right of list as a canonical
// IP ("" when not one); false if list has fewer entries.
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

// normalizeIP returns an IP or IP:port canonical, IPv4-mapped unmapped;
// "" if s is no address.
func normalizeIP(s string) string {
	if a, err := netip.ParseAddr(s); err == nil {
		return a.Unmap().WithZone("").String()
	}
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return ap.Addr().Unmap().WithZone("").String()
	}
	return ""
}
