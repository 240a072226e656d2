package extauthz

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/mem"
	grpcstatus "google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/flashgate/flashgate/enforce"
	"github.com/flashgate/flashgate/window"
)

var _ authv3.AuthorizationServer = (*Server)(nil)

// Options configure a [Server]. Only Core is required.
type Options struct {
	// Core decides the hits of a check: the limiter, the failure modes,
	// shadow (--shadow), and the registry, logger and clock the Server uses
	// too.
	Core *enforce.Core
	// Keys builds limit keys; the zero Keys uses the prefix "fg".
	Keys window.Keys
}

// Server is the ext_authz Check server. Build it with [NewServer]. All its
// methods are safe for concurrent use.
type Server struct {
	opts    Options
	core    *enforce.Front
	log     *slog.Logger
	now     func() time.Time
	metrics *metrics
	resp    *respConsts

	rules atomic.Pointer[ruleSet]
	// encoded is the rule set's encoded map (see ruleSet), for the codec.
	encoded atomic.Pointer[sync.Map]
	pool    sync.Pool // *Mapping

	// installMu orders installs: the metric series a rule set drops are
	// those of the rule set it replaced.
	installMu sync.Mutex
}

// NewServer returns a Server enforcing cfg with opts. It registers the
// metrics on the core's Registerer, so call it once per core.
func NewServer(cfg *Config, opts Options) (*Server, error) {
	if cfg == nil {
		return nil, errors.New("extauthz: no descriptors config given")
	}
	if opts.Core == nil {
		return nil, errors.New("extauthz: no enforcement core given")
	}
	front, err := opts.Core.Front(enforce.ExtAuthz)
	if err != nil {
		return nil, fmt.Errorf("extauthz: %w", err)
	}
	s := &Server{
		opts:    opts,
		core:    front,
		log:     opts.Core.Logger(),
		now:     opts.Core.Clock(),
		metrics: newMetrics(front.Metrics()),
		resp:    newRespConsts(),
	}
	s.pool.New = func() any { return &Mapping{Hits: make([]window.Hit, 0, 8), Rules: make([]*Rule, 0, 8)} }
	if err := s.SetConfig(cfg); err != nil {
		return nil, err
	}
	return s, nil
}

// SetConfig swaps in cfg's rules atomically: checks already running finish
// with the old rules, the next ones use cfg. It fails only for a nil cfg.
func (s *Server) SetConfig(cfg *Config) error {
	if cfg == nil {
		return errors.New("extauthz: no descriptors config given")
	}
	s.installMu.Lock()
	defer s.installMu.Unlock()
	s.installLocked(cfg)
	return nil
}

// installLocked swaps in cfg's compiled rules and drops the metric series
// of the rules it no longer has; installMu is held.
func (s *Server) installLocked(cfg *Config) {
	rs := s.newRuleSet(cfg)
	if !s.core.HasFallback() && slices.ContainsFunc(cfg.Rules, func(r *Rule) bool { return s.core.Mode(r.FailureMode) == enforce.FailureLocal }) {
		s.log.Warn("failure mode local has no fallback limiter here: it admits like allow")
	}
	s.encoded.Store(rs.encoded)
	if old := s.rules.Swap(rs); old != nil {
		s.metrics.dropRules(old.cfg, cfg)
	}
	s.log.Info("rules loaded", "file", cfg.Name, "domain", cfg.Domain, "rules", len(cfg.Rules))
}

// Config returns the rules in force.
func (s *Server) Config() *Config { return s.rules.Load().cfg }

// Check implements authv3.AuthorizationServer. Whatever the request holds
// and whatever the backend does, it answers OK or 429 (the limiter's own
// deadline bounds how long it waits). Its one error: a request that reached
// it from [Server.Codec] as bytes that are not a
// CheckRequest (codes.InvalidArgument), which a decoding codec would have
// refused before Check.
func (s *Server) Check(ctx context.Context, req *authv3.CheckRequest) (*authv3.CheckResponse, error) {
	start := s.now()
	rs := s.rules.Load()
	if b := wireOf(req); b != nil {
		if err := decodeCheck(b, &rs.fields, req); err != nil {
			return nil, grpcstatus.Error(codes.InvalidArgument, err.Error())
		}
	}
	m := s.pool.Get().(*Mapping)
	rs.cfg.mapWith(req, s.opts.Keys, rs.constKeys, s.core.Shadow(), m)
	resp := s.decide(ctx, rs, m)
	m.Reset()
	s.pool.Put(m)
	s.metrics.checkDur.Observe(s.now().Sub(start).Seconds())
	return resp, nil
}

// decide answers one mapped request.
func (s *Server) decide(ctx context.Context, rs *ruleSet, m *Mapping) *authv3.CheckResponse {
	shadowMissing := false
	if r := m.Missing; r != nil {
		if !r.Shadow && !s.core.Shadow() {
			rr := &rs.rules[r.idx]
			rr.counters.denied.Inc()
			return rr.denied(time.Second)
		}
		shadowMissing = true
	}
	if len(m.Hits) == 0 {
		if shadowMissing {
			rs.rules[m.Missing.idx].counters.shadowDenied.Inc()
			return rs.okShadow(nil, 0)
		}
		rs.none.allowed.Inc()
		return rs.okPlain
	}
	o := s.core.Decide(ctx, m.Hits, m)
	switch o.Via {
	case enforce.ViaLimiter:
		return s.respond(rs, m, &o, shadowMissing)
	case enforce.ViaFallback:
		return s.respond(rs, m, &o, o.ShadowDeny || shadowMissing)
	case enforce.ViaDeny:
		rr := &rs.rules[m.Rules[o.Denier].idx]
		rr.counters.errored.Inc()
		return rr.denied(time.Second)
	}
	rs.rules[m.Rules[0].idx].counters.errored.Inc()
	if o.ShadowDeny || shadowMissing {
		return rs.okShadow(nil, 0)
	}
	return rs.okPlain
}

// respond turns o's Decision on m's hits into a response, and counts it.
func (s *Server) respond(rs *ruleSet, m *Mapping, o *enforce.Outcome, shadow bool) *authv3.CheckResponse {
	d := &o.Decision
	rule := func(k int) *ruleResp {
		if j := o.Hit(k); j >= 0 && j < len(m.Rules) {
			return &rs.rules[m.Rules[j].idx]
		}
		return nil
	}
	binding := rule(d.Index)
	if !d.Allowed {
		if binding == nil {
			// A limiter broke its contract; admit rather than guess.
			rs.none.errored.Inc()
			return rs.okPlain
		}
		binding.counters.denied.Inc()
		return binding.denied(d.RetryAfter)
	}
	if d.Shadowed || shadow {
		var sr *ruleResp
		if d.Shadowed {
			sr = rule(d.ShadowIndex)
		}
		switch {
		case sr != nil:
			sr.counters.shadowDenied.Inc()
		case m.Missing != nil:
			rs.rules[m.Missing.idx].counters.shadowDenied.Inc()
		default:
			rs.none.shadowDenied.Inc()
		}
		return rs.okShadow(binding, d.Remaining)
	}
	if binding == nil {
		rs.none.allowed.Inc()
		return rs.okPlain
	}
	binding.counters.allowed.Inc()
	return binding.ok(d.Remaining)
}

// Response building: constant parts are built once per rule set.

// respConsts are the response parts every rule shares. They are built once
// per Server and never modified.
type respConsts struct {
	statusOK, statusDenied               *status.Status
	http429                              *typev3.HttpStatus
	hdrShadow, hdrRemaining0, hdrContent *corev3.HeaderValueOption
	// retryAfter[n] and reset[n] are the headers for n seconds, n ≥ 1.
	retryAfter, reset [maxCachedSeconds + 1]*corev3.HeaderValueOption
}

// maxCachedSeconds bounds the precomputed retry-after and x-ratelimit-reset
// headers.
const maxCachedSeconds = 120

func newRespConsts() *respConsts {
	k := &respConsts{
		statusOK:      &status.Status{Code: int32(codes.OK)},
		statusDenied:  &status.Status{Code: int32(codes.ResourceExhausted)},
		http429:       &typev3.HttpStatus{Code: typev3.StatusCode_TooManyRequests},
		hdrShadow:     header("x-ratelimit-shadow", "1"),
		hdrRemaining0: header("x-ratelimit-remaining", "0"),
		hdrContent:    header("content-type", "application/json"),
	}
	for n := 1; n <= maxCachedSeconds; n++ {
		k.retryAfter[n] = header("retry-after", strconv.Itoa(n))
		k.reset[n] = header("x-ratelimit-reset", strconv.Itoa(n))
	}
	return k
}

// secondsHeaders returns the retry-after and x-ratelimit-reset headers for
// secs seconds (≥ 1).
func (k *respConsts) secondsHeaders(secs int64) (retryAfter, reset *corev3.HeaderValueOption) {
	if secs >= 1 && secs <= maxCachedSeconds {
		return k.retryAfter[secs], k.reset[secs]
	}
	t := strconv.FormatInt(secs, 10)
	return header("retry-after", t), header("x-ratelimit-reset", t)
}

// header returns a header that replaces any of the same name.
func header(k, v string) *corev3.HeaderValueOption {
	return &corev3.HeaderValueOption{
		Header:       &corev3.HeaderValue{Key: k, Value: v},
		AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD,
	}
}

// maxCachedRemaining bounds the precomputed x-ratelimit-remaining headers
// per rule.
const maxCachedRemaining = 1024

// ruleSet is a Config with what responses need precomputed. Immutable;
// shared by concurrent checks (protobuf messages are safe to marshal
// concurrently).
type ruleSet struct {
	k     *respConsts
	cfg   *Config
	rules []ruleResp // by Rule.idx
	// constKeys are the limit keys of rules with no request part, by
	// Rule.idx, built once here rather than per check.
	constKeys []string
	none      ruleCounters
	okPlain   *authv3.CheckResponse
	// fields is what the rules read of a request: all Check decodes of one
	// its codec kept as bytes.
	fields requestFields
	// encoded maps each shared OK response (okPlain, every okResps entry)
	// to its wire bytes, encoded when the response is built, so that the
	// Server's codec does not encode it per check. A new rule set starts a
	// new map: an old set's responses in flight are encoded as usual.
	encoded *sync.Map
}

type ruleResp struct {
	k         *respConsts
	limit     *corev3.HeaderValueOption
	remaining []*corev3.HeaderValueOption // index = remaining count
	// okResps[n] is the OK response for n remaining, built on first use
	// (same range as remaining) and then shared: responses are immutable.
	okResps  []atomic.Pointer[authv3.CheckResponse]
	encoded  *sync.Map // the rule set's
	bodyHead string
	counters ruleCounters
}

func (s *Server) newRuleSet(cfg *Config) *ruleSet {
	rs := &ruleSet{
		k:         s.resp,
		cfg:       cfg,
		constKeys: cfg.constKeys(s.opts.Keys),
		fields:    fieldsOf(cfg),
		none:      s.metrics.forRule(cfg.Domain, ""),
		okPlain: &authv3.CheckResponse{
			Status:       s.resp.statusOK,
			HttpResponse: &authv3.CheckResponse_OkResponse{OkResponse: &authv3.OkHttpResponse{}},
		},
	}
	rs.encoded = new(sync.Map)
	preEncode(rs.encoded, rs.okPlain)
	rs.rules = make([]ruleResp, len(cfg.Rules))
	for i, r := range cfg.Rules {
		rr := &rs.rules[i]
		rr.k = s.resp
		rr.encoded = rs.encoded
		rr.limit = header("x-ratelimit-limit", strconv.Itoa(r.Limit.Requests))
		rr.remaining = make([]*corev3.HeaderValueOption, min(r.Limit.Requests, maxCachedRemaining)+1)
		for n := range rr.remaining {
			rr.remaining[n] = header("x-ratelimit-remaining", strconv.Itoa(n))
		}
		rr.okResps = make([]atomic.Pointer[authv3.CheckResponse], len(rr.remaining))
		rr.bodyHead = `{"error":"too_many_requests","rule":"` + r.Name + `","retry_after_ms":`
		rr.counters = s.metrics.forRule(cfg.Domain, r.Name)
	}
	return rs
}

func (rr *ruleResp) remainingHeader(n int) *corev3.HeaderValueOption {
	if n >= 0 && n < len(rr.remaining) {
		return rr.remaining[n]
	}
	return header("x-ratelimit-remaining", strconv.Itoa(max(n, 0)))
}

// ok is the OK response with the binding rule's x-ratelimit-* headers. For
// a remaining count within the precomputed range it is shared, built once.
func (rr *ruleResp) ok(remaining int) *authv3.CheckResponse {
	if remaining < 0 || remaining >= len(rr.okResps) {
		return rr.newOK(remaining)
	}
	p := &rr.okResps[remaining]
	if r := p.Load(); r != nil {
		return r
	}
	r := rr.newOK(remaining)
	if !p.CompareAndSwap(nil, r) {
		return p.Load()
	}
	preEncode(rr.encoded, r)
	return r
}

// preEncode stores r's wire bytes in encoded for the codec, as the
// mem.BufferSlice the codec returns: gRPC only reads it (a SliceBuffer's
// Ref and Free do nothing), so every send shares it and none allocates. A
// response that does not encode (none of a Server's) is left to the codec.
func preEncode(encoded *sync.Map, r *authv3.CheckResponse) {
	if b, err := proto.Marshal(r); err == nil {
		encoded.Store(r, mem.BufferSlice{mem.SliceBuffer(b)})
	}
}

// okMsg holds the messages of one OK response in one allocation.
type okMsg struct {
	resp authv3.CheckResponse
	wrap authv3.CheckResponse_OkResponse
	ok   authv3.OkHttpResponse
	hdrs [2]*corev3.HeaderValueOption
}

func (rr *ruleResp) newOK(remaining int) *authv3.CheckResponse {
	m := &okMsg{}
	m.hdrs = [2]*corev3.HeaderValueOption{rr.limit, rr.remainingHeader(remaining)}
	m.ok.ResponseHeadersToAdd = m.hdrs[:]
	m.wrap.OkResponse = &m.ok
	m.resp.Status = rr.k.statusOK
	m.resp.HttpResponse = &m.wrap
	return &m.resp
}

// okShadow is an OK response marked x-ratelimit-shadow: 1, with the binding
// rule's headers when there is one.
func (rs *ruleSet) okShadow(rr *ruleResp, remaining int) *authv3.CheckResponse {
	hs := make([]*corev3.HeaderValueOption, 1, 3)
	hs[0] = rs.k.hdrShadow
	if rr != nil {
		hs = append(hs, rr.limit, rr.remainingHeader(remaining))
	}
	return &authv3.CheckResponse{
		Status:       rs.k.statusOK,
		HttpResponse: &authv3.CheckResponse_OkResponse{OkResponse: &authv3.OkHttpResponse{ResponseHeadersToAdd: hs}},
	}
}

// deniedMsg holds the messages of one 429 response in one allocation.
type deniedMsg struct {
	resp authv3.CheckResponse
	wrap authv3.CheckResponse_DeniedResponse
	den  authv3.DeniedHttpResponse
	hdrs [5]*corev3.HeaderValueOption
}

// denied is the rule's 429: retry-after (whole seconds, rounded up, ≥ 1),
// x-ratelimit-limit, x-ratelimit-remaining: 0, x-ratelimit-reset,
// content-type: application/json and {"error":"too_many_requests","rule":…,"retry_after_ms":…}.
func (rr *ruleResp) denied(retryAfter time.Duration) *authv3.CheckResponse {
	ms := max((retryAfter+time.Millisecond-1)/time.Millisecond, 1)
	secs := max((retryAfter+time.Second-1)/time.Second, 1)
	retryHdr, resetHdr := rr.k.secondsHeaders(int64(secs))
	var body strings.Builder
	body.Grow(len(rr.bodyHead) + 21)
	body.WriteString(rr.bodyHead)
	var num [20]byte
	body.Write(strconv.AppendInt(num[:0], int64(ms), 10))
	body.WriteByte('}')
	m := &deniedMsg{}
	m.hdrs = [5]*corev3.HeaderValueOption{retryHdr, rr.limit, rr.k.hdrRemaining0, resetHdr, rr.k.hdrContent}
	m.den.Status = rr.k.http429
	m.den.Headers = m.hdrs[:]
	m.den.Body = body.String()
	m.wrap.DeniedResponse = &m.den
	m.resp.Status = rr.k.statusDenied
	m.resp.HttpResponse = &m.wrap
	return &m.resp
}
