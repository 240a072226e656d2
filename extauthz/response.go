package extauthz

import (
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"

	"github.com/flashgate/flashgate/descriptors"
	"github.com/flashgate/flashgate/enforce"
	"github.com/flashgate/flashgate/window"
)

// Responses are assembled from parts built once per rule set (every rule's
// headers, whole-second headers up to maxCachedSeconds, the policies of a
// set of rules). A response whose parts are all bounded is shared whole
// by its respKey in a lock-free direct-mapped table and encoded once for
// the codec; any other allocates its messages in one piece.

// respConsts are the response parts every rule shares; never modified.
type respConsts struct {
	families               enforce.Families
	statusOK, statusDenied *status.Status
	http429                *typev3.HttpStatus
	hdrShadow, hdrContent  *corev3.HeaderValueOption
	retryAfter, reset      [maxCachedSeconds + 1]*corev3.HeaderValueOption // [n]: n seconds, n ≥ 1
}

// maxCachedSeconds bounds the precomputed whole-second headers and the
// windows whose RateLimit items and OK responses are kept.
const maxCachedSeconds = 120

// maxCachedStates bounds the RateLimit items of one state a rule keeps,
// and maxCachedResponses the responses a rule set keeps (a power of two).
const (
	maxCachedStates    = 4096
	maxCachedResponses = 4096
)

func newRespConsts(f enforce.Families) *respConsts {
	k := &respConsts{
		families:     f,
		statusOK:     &status.Status{Code: int32(codes.OK)},
		statusDenied: &status.Status{Code: int32(codes.ResourceExhausted)},
		http429:      &typev3.HttpStatus{Code: typev3.StatusCode_TooManyRequests},
		hdrShadow:    header(enforce.HeaderShadow, "1"),
		hdrContent:   header(enforce.HeaderContentType, enforce.ProblemContentType),
	}
	for n := 1; n <= maxCachedSeconds; n++ {
		k.retryAfter[n] = header(enforce.HeaderRetryAfter, strconv.Itoa(n))
		k.reset[n] = header(enforce.HeaderReset, strconv.Itoa(n))
	}
	return k
}

// secondsHeader returns the header name: secs (≥ 1) from cached, or a new one.
func secondsHeader(cached *[maxCachedSeconds + 1]*corev3.HeaderValueOption, name string, secs int64) *corev3.HeaderValueOption {
	if secs >= 1 && secs <= maxCachedSeconds {
		return cached[secs]
	}
	return header(name, strconv.FormatInt(secs, 10))
}

// header returns a header that replaces any of the same name.
func header(k, v string) *corev3.HeaderValueOption {
	return &corev3.HeaderValueOption{
		Header:       &corev3.HeaderValue{Key: k, Value: v},
		AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD,
	}
}

// maxCachedRemaining bounds a rule's precomputed x-ratelimit-remaining.
const maxCachedRemaining = 1024

// ruleSet is a Config with what responses need precomputed; immutable but
// for its caches, and shared by concurrent checks.
type ruleSet struct {
	k       *respConsts
	cfg     *descriptors.Config
	rules   []ruleResp // by Rule.Index
	mapper  *descriptors.Mapper
	none    *enforce.RuleCounters
	okPlain *authv3.CheckResponse
	// fields is what the rules read of a request.
	fields requestFields
	// encoded maps each shared response to its wire bytes for the codec;
	// each rule set starts a new map.
	encoded  *sync.Map
	resps    slotCache[respKey, *authv3.CheckResponse]
	policies slotCache[policyKey, *corev3.HeaderValueOption]
}

// ruleResp is one rule's response parts.
type ruleResp struct {
	idx       int
	policy    *enforce.Policy
	policyHdr *corev3.HeaderValueOption   // RateLimit-Policy of this rule alone
	limit     *corev3.HeaderValueOption   // x-ratelimit-limit
	remaining []*corev3.HeaderValueOption // x-ratelimit-remaining, index = remaining count
	// states are RateLimit headers of this rule's state alone, built on
	// first use: index remaining·w + t−1.
	states    []atomic.Pointer[corev3.HeaderValueOption]
	stateRows int
	counters  *enforce.RuleCounters
	// refusal is the rule's on_missing: deny refusal.
	refusal enforce.Refusal
}

func (s *Server) newRuleSet(cfg *descriptors.Config, counters map[enforce.RuleLabel]*enforce.RuleCounters) *ruleSet {
	rs := &ruleSet{
		k:      s.resp,
		cfg:    cfg,
		mapper: descriptors.NewMapper(cfg, s.opts.Keys),
		fields: fieldsOf(cfg),
		none:   counters[enforce.RuleLabel{Domain: cfg.Domain}],
		okPlain: &authv3.CheckResponse{
			Status:       s.resp.statusOK,
			HttpResponse: &authv3.CheckResponse_OkResponse{OkResponse: &authv3.OkHttpResponse{}},
		},
		encoded: new(sync.Map),
	}
	preEncode(rs.encoded, rs.okPlain)
	rs.resps = newSlotCache[respKey](maxCachedResponses, func(r *authv3.CheckResponse) { rs.encoded.Delete(r) })
	rs.policies = newSlotCache[policyKey, *corev3.HeaderValueOption](maxCachedPolicies, nil)
	rs.rules = make([]ruleResp, len(cfg.Rules))
	for i, r := range cfg.Rules {
		rr := &rs.rules[i]
		rr.idx = i
		rr.policy = enforce.NewPolicy(r.Name, r.Limit)
		rr.policy.Ref = i
		rr.policyHdr = header(enforce.HeaderRateLimitPolicy, rr.policy.Item())
		rr.limit = header(enforce.HeaderLimit, rr.policy.Limit())
		rr.remaining = make([]*corev3.HeaderValueOption, min(r.Limit.Requests, maxCachedRemaining)+1)
		for n := range rr.remaining {
			rr.remaining[n] = header(enforce.HeaderRemaining, strconv.Itoa(n))
		}
		if w := int(rr.policy.Window()); w <= maxCachedSeconds {
			rr.stateRows = min(r.Limit.Requests+1, max(maxCachedStates/w, 1))
			rr.states = make([]atomic.Pointer[corev3.HeaderValueOption], rr.stateRows*w)
		}
		rr.counters = counters[enforce.RuleLabel{Domain: cfg.Domain, Rule: r.Name}]
		rr.refusal = enforce.Refusal{Policy: rr.policy, Counters: rr.counters, RetryAfter: time.Second, Shadow: r.Shadow}
	}
	return rs
}

func (rr *ruleResp) remainingHeader(n int) *corev3.HeaderValueOption {
	if n >= 0 && n < len(rr.remaining) {
		return rr.remaining[n]
	}
	return header(enforce.HeaderRemaining, strconv.Itoa(max(n, 0)))
}

// stateHeader returns the shared RateLimit header of st, or nil when rr
// keeps none for it.
func (rr *ruleResp) stateHeader(st *enforce.State) *corev3.HeaderValueOption {
	w := int(rr.policy.Window())
	if st.Remaining < 0 || st.Remaining >= rr.stateRows || st.T < 1 || st.T > int64(w) {
		return nil
	}
	p := &rr.states[st.Remaining*w+int(st.T)-1]
	if h := p.Load(); h != nil {
		return h
	}
	h := header(enforce.HeaderRateLimit, string(rr.policy.AppendState(nil, st.Remaining, st.T)))
	if !p.CompareAndSwap(nil, h) {
		return p.Load()
	}
	return h
}

// preEncode stores r's wire bytes in encoded for the codec; gRPC only
// reads them, so every send shares them.
func preEncode(encoded *sync.Map, r *authv3.CheckResponse) {
	if b, err := proto.Marshal(r); err == nil {
		encoded.Store(r, mem.BufferSlice{mem.SliceBuffer(b)})
	}
}

func newMapping() *mapping {
	const n = 8
	return &mapping{
		Mapping: descriptors.Mapping{Hits: make([]window.Hit, 0, n), Rules: make([]*descriptors.Rule, 0, n)},
		tags:    make([]enforce.HitTag, 0, n),
	}
}

// request makes m's request for the core under rs.
func (rs *ruleSet) request(m *mapping) *enforce.Request {
	r := &m.req
	r.Hits, r.Tags, r.None, r.Refusal = m.Hits, m.tags, rs.none, nil
	for j, rule := range m.Rules {
		rr := &rs.rules[rule.Index()]
		m.tags[j].Policy, m.tags[j].Counters = rr.policy, rr.counters
	}
	if mr := m.Missing; mr != nil {
		r.Refusal = &rs.rules[mr.Index()].refusal
	}
	return r
}

// answer returns the response of p: the plain OK when it says nothing.
func (rs *ruleSet) answer(p *enforce.Answer) *authv3.CheckResponse {
	if !p.Denied && !p.Shadow && len(p.Policies) == 0 {
		return rs.okPlain
	}
	return rs.build(p)
}

// build returns the response p describes, shared when its key fits.
func (rs *ruleSet) build(p *enforce.Answer) *authv3.CheckResponse {
	key, ok := rs.key(p)
	if !ok {
		return rs.assemble(p)
	}
	if r, ok := rs.resps.get(key); ok {
		return r
	}
	r := rs.assemble(p)
	preEncode(rs.encoded, r) // before it is shared: every kept response has its encoding
	rs.resps.put(key, r)
	return r
}

// okMsg and deniedMsg hold the messages of one response in one allocation.
type okMsg struct {
	resp authv3.CheckResponse
	wrap authv3.CheckResponse_OkResponse
	ok   authv3.OkHttpResponse
	hdrs msgHeaders
}

type deniedMsg struct {
	resp authv3.CheckResponse
	wrap authv3.CheckResponse_DeniedResponse
	den  authv3.DeniedHttpResponse
	hdrs msgHeaders
}

// msgHeaders are a response's header list and its own RateLimit header.
type msgHeaders struct {
	list [enforce.MaxFields]*corev3.HeaderValueOption
	rl   corev3.HeaderValueOption
	rlv  corev3.HeaderValue
}

// assemble builds the response p describes in enforce's header order,
// shared parts where rs keeps them and the rest formatted in one string.
func (rs *ruleSet) assemble(p *enforce.Answer) *authv3.CheckResponse {
	k := rs.k
	var bind *ruleResp
	var bst *enforce.State
	if p.Binding >= 0 {
		bind, bst = rs.ruleOf(p.States[p.Binding].Policy), &p.States[p.Binding]
	}
	var rlHdr *corev3.HeaderValueOption
	buildRL := false
	if k.families.IETF() && len(p.States) > 0 {
		if len(p.States) == 1 {
			rlHdr = rs.ruleOf(p.States[0].Policy).stateHeader(&p.States[0])
		}
		buildRL = rlHdr == nil
	}
	var body, rlValue string
	if p.Denied || buildRL {
		var pol *enforce.Policy
		if bind != nil {
			pol = bind.policy
		}
		var buf [512]byte
		b := buf[:0]
		if p.Denied {
			b = pol.AppendProblem(b, p.RetryAfter)
		}
		n := len(b)
		if buildRL {
			b = enforce.AppendStates(b, p.States)
		}
		text := string(b)
		body, rlValue = text[:n], text[n:]
	}

	var fields [enforce.MaxFields]enforce.Field
	if p.Denied {
		m := &deniedMsg{}
		m.den.Status = k.http429
		m.den.Body = body
		m.wrap.DeniedResponse = &m.den
		m.resp.Status = k.statusDenied
		m.resp.HttpResponse = &m.wrap
		m.den.Headers = m.hdrs.fill(rs, p, k.families.AppendFields(fields[:0], true, false), bind, bst, rlHdr, rlValue)
		return &m.resp
	}
	m := &okMsg{}
	m.wrap.OkResponse = &m.ok
	m.resp.Status = k.statusOK
	m.resp.HttpResponse = &m.wrap
	m.ok.ResponseHeadersToAdd = m.hdrs.fill(rs, p, k.families.AppendFields(fields[:0], false, p.Shadow), bind, bst, rlHdr, rlValue)
	return &m.resp
}

// fill lists the headers of fields into h and returns the list.
func (h *msgHeaders) fill(rs *ruleSet, p *enforce.Answer, fields []enforce.Field, bind *ruleResp, bst *enforce.State,
	rlHdr *corev3.HeaderValueOption, rlValue string) []*corev3.HeaderValueOption {
	k := rs.k
	list := h.list[:0]
	for _, f := range fields {
		var hv *corev3.HeaderValueOption
		switch f {
		case enforce.FieldRetryAfter:
			hv = secondsHeader(&k.retryAfter, enforce.HeaderRetryAfter, p.RetryAfterSeconds())
		case enforce.FieldPolicy:
			if len(p.Policies) > 0 {
				hv = rs.policyHeader(p)
			}
		case enforce.FieldRateLimit:
			switch {
			case rlHdr != nil:
				hv = rlHdr
			case rlValue != "":
				h.rlv = corev3.HeaderValue{Key: enforce.HeaderRateLimit, Value: rlValue}
				h.rl.Header = &h.rlv
				h.rl.AppendAction = corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD
				hv = &h.rl
			}
		case enforce.FieldLimit:
			if bind != nil {
				hv = bind.limit
			}
		case enforce.FieldRemaining:
			if bind != nil {
				hv = bind.remainingHeader(bst.Remaining)
			}
		case enforce.FieldReset:
			if bind != nil {
				hv = secondsHeader(&k.reset, enforce.HeaderReset, bst.T)
			}
		case enforce.FieldShadow:
			hv = k.hdrShadow
		case enforce.FieldContentType:
			hv = k.hdrContent
		}
		if hv != nil {
			list = append(list, hv)
		}
	}
	return list
}

// ruleOf returns the parts of p's rule, or ones made for a core's policy.
func (rs *ruleSet) ruleOf(p *enforce.Policy) *ruleResp {
	if rs.own(p) {
		return &rs.rules[p.Ref]
	}
	return &ruleResp{idx: -1, policy: p, policyHdr: header(enforce.HeaderRateLimitPolicy, p.Item()), limit: header(enforce.HeaderLimit, p.Limit())}
}

// own reports whether p is one of rs's policies, whose responses it keeps.
func (rs *ruleSet) own(p *enforce.Policy) bool {
	return p.Ref >= 0 && p.Ref < len(rs.rules) && rs.rules[p.Ref].policy == p
}

// maxKeyRules bounds the rules of a response that respKey fits.
const maxKeyRules = 4

// respKey names a shared response of a rule set; the server's families
// are fixed, so the key makes the response.
type respKey struct {
	n, has, bind, kind uint8
	t                  [maxKeyRules]uint8
	idx                [maxKeyRules]uint16
	r                  [maxKeyRules]uint16
	ms                 uint32
}

func (k respKey) hash() uint64 {
	h := mix(uint64(k.n)|uint64(k.has)<<8|uint64(k.bind)<<16|uint64(k.kind)<<24|uint64(k.ms)<<32, 0)
	for i := range int(k.n) {
		h = mix(h, uint64(k.idx[i])|uint64(k.r[i])<<16|uint64(k.t[i])<<32)
	}
	return h
}

// key returns the key of p's response; false when p does not fit one.
func (rs *ruleSet) key(p *enforce.Answer) (respKey, bool) {
	var key respKey
	n := len(p.Policies)
	if n > maxKeyRules || len(p.States) > n || p.Binding >= maxKeyRules {
		return key, false
	}
	key.n, key.bind = uint8(n), uint8(p.Binding+1)
	if p.Denied {
		ms := (p.RetryAfter + time.Millisecond - 1) / time.Millisecond
		if p.RetryAfter > maxCachedSeconds*time.Second {
			return key, false
		}
		key.kind, key.ms = 1, uint32(max(ms, 1))
	}
	if p.Shadow {
		key.kind |= 2
	}
	k := 0 // the next state
	for i, pol := range p.Policies {
		if pol.Ref > 0xffff || !rs.own(pol) {
			return key, false
		}
		key.idx[i] = uint16(pol.Ref)
		if k == len(p.States) || p.States[k].Policy != pol {
			continue
		}
		s := &p.States[k]
		if s.T < 1 || s.T > maxCachedSeconds || s.Remaining < 0 || s.Remaining > 0xffff {
			return key, false
		}
		key.has |= 1 << i
		key.t[i], key.r[i] = uint8(s.T), uint16(s.Remaining)
		k++
	}
	return key, k == len(p.States)
}

// maxKeyPolicies bounds the rules a policyKey names; maxCachedPolicies the
// policy headers a rule set keeps (a power of two).
const (
	maxKeyPolicies    = 8
	maxCachedPolicies = 1024
)

// policyKey names a set of rules, by index.
type policyKey struct {
	n   uint8
	idx [maxKeyPolicies]uint16
}

func (k policyKey) hash() uint64 {
	h := mix(uint64(k.n), 0)
	for i := range int(k.n) {
		h = mix(h, uint64(k.idx[i]))
	}
	return h
}

// policyHeader returns the RateLimit-Policy header of p's policies.
func (rs *ruleSet) policyHeader(p *enforce.Answer) *corev3.HeaderValueOption {
	if len(p.Policies) == 1 {
		return rs.ruleOf(p.Policies[0]).policyHdr
	}
	key, ok := policyKey{n: uint8(len(p.Policies))}, len(p.Policies) <= maxKeyPolicies
	for i := 0; ok && i < len(p.Policies); i++ {
		ok = p.Policies[i].Ref <= 0xffff && rs.own(p.Policies[i])
		key.idx[i] = uint16(p.Policies[i].Ref)
	}
	if ok {
		if h, found := rs.policies.get(key); found {
			return h
		}
	}
	h := header(enforce.HeaderRateLimitPolicy, string(enforce.AppendPolicies(nil, p.Policies)))
	if ok {
		rs.policies.put(key, h)
	}
	return h
}

// slotCache is a lock-free direct-mapped cache: a value put in a key's slot
// replaces the one before (dropped is called for it). Values are rebuilt
// alike when asked again, so the cache is a hint.
type slotCache[K cacheKey, V any] struct {
	slots   []atomic.Pointer[slotEntry[K, V]]
	dropped func(V)
}

// cacheKey is a slotCache's key: comparable, with a hash.
type cacheKey interface {
	comparable
	hash() uint64
}

type slotEntry[K comparable, V any] struct {
	key K
	val V
}

// newSlotCache returns a cache of n slots, n a power of two.
func newSlotCache[K cacheKey, V any](n int, dropped func(V)) slotCache[K, V] {
	return slotCache[K, V]{slots: make([]atomic.Pointer[slotEntry[K, V]], n), dropped: dropped}
}

func (c *slotCache[K, V]) slot(k K) *atomic.Pointer[slotEntry[K, V]] {
	return &c.slots[k.hash()&uint64(len(c.slots)-1)]
}

func (c *slotCache[K, V]) get(k K) (V, bool) {
	if e := c.slot(k).Load(); e != nil && e.key == k {
		return e.val, true
	}
	var zero V
	return zero, false
}

// put keeps v under k, in place of what k's slot held.
func (c *slotCache[K, V]) put(k K, v V) {
	if old := c.slot(k).Swap(&slotEntry[K, V]{key: k, val: v}); old != nil && c.dropped != nil {
		c.dropped(old.val)
	}
}

// mix folds x into the hash h (a multiply-xorshift step).
func mix(h, x uint64) uint64 {
	h = (h ^ x) * 0x9e3779b97f4a7c15
	return h ^ h>>29
}
