package extauthz

import (
	"context"
	"errors"
	"fmt"
	"io"
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
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	"google.golang.org/grpc/mem"
	grpcstatus "google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/flashgate/flashgate/window"
)

var _ authv3.AuthorizationServer = (*Server)(nil)

// Options configure a [Server]. Only Limiter is required.
type Options struct {
	// Limiter decides hits: the whole stack the wiring built, e.g.
	// window.Guard(fallback.Watch(Breaker(Budget(Redis)))) or
	// window.Guard(Memory). Whether a
	// call has a deadline, a breaker or a local cache in front is the
	// stack's business; the Server calls Decide and, on an error, applies
	// the failure modes.
	Limiter window.Limiter
	// Fallback decides the hits of failure mode "local" when Limiter fails:
	// an in-process limiter that never waits (window.Fallback), told why
	// the backend failed. Nil makes "local" behave as "allow".
	Fallback Fallback
	// Keys builds limit keys; the zero Keys uses the prefix "fg".
	Keys window.Keys
	// FailureMode applies to rules that set none; FailureDefault means
	// FailureLocal.
	FailureMode FailureMode
	// Shadow makes every hit a shadow hit (--shadow): decide and count, but
	// admit everything.
	Shadow bool
	// Registerer receives the metrics; nil means a new private registry
	// (served by HTTPHandler). The global registry is never used implicitly.
	Registerer prometheus.Registerer
	// Gatherer serves /metrics; nil means Registerer if it is a Gatherer.
	Gatherer prometheus.Gatherer
	// Logger receives structured logs; nil discards them. Request values
	// (headers, IPs) are never logged above debug level.
	Logger *slog.Logger
	// Now is the clock for durations and log sampling; nil means time.Now.
	Now func() time.Time
	// HealthServices are more gRPC health service names that follow
	// SetServing with "" and HealthService: the other services the same
	// gRPC server hosts (serve's RLS).
	HealthServices []string
}

// Fallback is what failure mode "local" needs: window.Fallback. It decides
// hits in process after the backend failed with cause; it must not wait.
type Fallback interface {
	DecideAfter(ctx context.Context, hits []window.Hit, cause error) (window.Decision, error)
}

// Server is the ext_authz Check server. Build it with [NewServer]. All its
// methods are safe for concurrent use.
type Server struct {
	opts     Options
	log      *slog.Logger
	now      func() time.Time
	metrics  *metrics
	health   *health.Server
	gatherer prometheus.Gatherer
	resp     *respConsts

	rules atomic.Pointer[ruleSet]
	// encoded is the rule set's encoded map (see ruleSet), for the codec.
	encoded atomic.Pointer[sync.Map]
	serving atomic.Bool
	closed  atomic.Bool
	pool    sync.Pool // *Mapping
	lastLog atomic.Int64

	// reloadMu is held for a whole reload (read, parse, swap), so that a
	// SIGHUP and the file watcher cannot install their files out of order;
	// it guards the fields below.
	reloadMu sync.Mutex
	path     string // file the rules came from; "" for the built-in example
	badHash  [32]byte
}

// NewServer returns a Server enforcing cfg with opts. It registers the
// metrics on opts.Registerer, so call it once per registry. Health starts
// NOT_SERVING; call [Server.SetServing] once the backend is up (serve does
// when it is warm).
func NewServer(cfg *Config, opts Options) (*Server, error) {
	if cfg == nil {
		return nil, errors.New("extauthz: no descriptors config given")
	}
	if opts.Limiter == nil {
		return nil, errors.New("extauthz: no limiter given")
	}
	if opts.FailureMode == FailureDefault {
		opts.FailureMode = FailureLocal
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if opts.Registerer == nil {
		opts.Registerer = prometheus.NewRegistry()
	}
	if opts.Gatherer == nil {
		g, ok := opts.Registerer.(prometheus.Gatherer)
		if !ok {
			return nil, errors.New("extauthz: the Registerer is not a Gatherer: set Options.Gatherer")
		}
		opts.Gatherer = g
	}
	m, err := newMetrics(opts.Registerer)
	if err != nil {
		return nil, fmt.Errorf("extauthz: %w", err)
	}
	s := &Server{
		opts:     opts,
		log:      opts.Logger,
		now:      opts.Now,
		metrics:  m,
		health:   health.NewServer(),
		gatherer: opts.Gatherer,
		resp:     newRespConsts(),
	}
	s.pool.New = func() any { return &Mapping{Hits: make([]window.Hit, 0, 8), Rules: make([]*Rule, 0, 8)} }
	s.SetServing(false)
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
	s.reloadMu.Lock()
	defer s.reloadMu.Unlock()
	s.installLocked(cfg)
	return nil
}

// installLocked swaps in cfg's compiled rules and drops the metric series
// of the rules it no longer has; reloadMu is held.
func (s *Server) installLocked(cfg *Config) {
	rs := s.newRuleSet(cfg)
	if s.opts.Fallback == nil && slices.ContainsFunc(rs.rules, func(r ruleResp) bool { return r.mode == FailureLocal }) {
		s.log.Warn("failure mode local has no fallback limiter here: it admits like allow")
	}
	s.encoded.Store(rs.encoded)
	if old := s.rules.Swap(rs); old != nil {
		s.metrics.dropRules(old.cfg, cfg)
	}
	s.path = cfg.path
	s.log.Info("rules loaded", "file", cfg.Name, "domain", cfg.Domain, "rules", len(cfg.Rules))
}

// Config returns the rules in force.
func (s *Server) Config() *Config { return s.rules.Load().cfg }

// Check implements authv3.AuthorizationServer. Whatever the request holds
// and whatever the backend does, it answers OK or 429 (the limiter's own
// deadline bounds how long it waits). Its one error: a request that reached
// it from [Server.NewGRPCServer]'s codec as bytes that are not a
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
	rs.cfg.mapWith(req, s.opts.Keys, rs.constKeys, s.opts.Shadow, m)
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
		if !r.Shadow && !s.opts.Shadow {
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
	t0 := s.now()
	d, err := s.opts.Limiter.Decide(ctx, m.Hits)
	if err != nil || d.Source == window.SourceBackend {
		s.metrics.backendDur.Observe(s.now().Sub(t0).Seconds())
	}
	if err != nil {
		return s.failure(ctx, rs, m, err)
	}
	return s.respond(rs, m.Rules, d, shadowMissing, m.Missing)
}

// failure decides a request whose backend call failed, by failure mode: deny
// if any enforcing hit's mode is deny; else the local hits by the fallback;
// else allow.
func (s *Server) failure(ctx context.Context, rs *ruleSet, m *Mapping, err error) *authv3.CheckResponse {
	kind := window.Classify(err)
	s.metrics.backendErr(kind).Inc()
	if kind != window.KindBreakerOpen { // serve logs the breaker's opening, not each check it holds off
		s.logSampled("backend failed; deciding by failure mode", "kind", kind.String(), "error", err)
	}

	var denyRule *Rule
	shadowDeny := false
	nlocal := 0
	for i, r := range m.Rules {
		switch rs.rules[r.idx].mode {
		case FailureDeny:
			if m.Hits[i].Shadow {
				shadowDeny = true
			} else if denyRule == nil {
				denyRule = r
			}
		case FailureLocal:
			nlocal++
		}
	}
	if denyRule != nil {
		s.metrics.failDeny.Inc()
		rr := &rs.rules[denyRule.idx]
		rr.counters.errored.Inc()
		return rr.denied(time.Second)
	}
	if nlocal > 0 && s.opts.Fallback != nil {
		hits, rules := m.Hits, m.Rules // all local: the usual case
		if nlocal < len(m.Rules) {
			hits, rules = make([]window.Hit, 0, nlocal), make([]*Rule, 0, nlocal)
			for i, r := range m.Rules {
				if rs.rules[r.idx].mode == FailureLocal {
					hits = append(hits, m.Hits[i])
					rules = append(rules, r)
				}
			}
		}
		// The fallback is in process and never waits; it decides even if
		// Envoy has given up on this check, so that its log stays whole.
		d, ferr := s.opts.Fallback.DecideAfter(context.WithoutCancel(ctx), hits, err)
		if ferr == nil {
			s.metrics.failLocal.Inc()
			return s.respond(rs, rules, d, shadowDeny || m.Missing != nil, m.Missing)
		}
		s.metrics.fallbackErr.Inc()
		s.logSampled("fallback limiter failed; admitting", "error", ferr)
	}
	s.metrics.failAllow.Inc()
	rs.rules[m.Rules[0].idx].counters.errored.Inc()
	if shadowDeny || m.Missing != nil {
		return rs.okShadow(nil, 0)
	}
	return rs.okPlain
}

// respond turns a Decision on hits produced by rules into a response, and
// counts it.
func (s *Server) respond(rs *ruleSet, rules []*Rule, d window.Decision, shadow bool, missing *Rule) *authv3.CheckResponse {
	if !d.Allowed {
		if d.Index < 0 || d.Index >= len(rules) {
			// A limiter broke its contract; admit rather than guess.
			rs.none.errored.Inc()
			return rs.okPlain
		}
		rr := &rs.rules[rules[d.Index].idx]
		rr.counters.denied.Inc()
		switch d.Source {
		case window.SourceLocalFull:
			s.metrics.localFull.Inc()
		case window.SourceLocalBanned:
			s.metrics.localBanned.Inc()
		}
		return rr.denied(d.RetryAfter)
	}
	var binding *ruleResp
	if d.Index >= 0 && d.Index < len(rules) {
		binding = &rs.rules[rules[d.Index].idx]
	}
	if d.Shadowed || shadow {
		switch {
		case d.Shadowed && d.ShadowIndex >= 0 && d.ShadowIndex < len(rules):
			rs.rules[rules[d.ShadowIndex].idx].counters.shadowDenied.Inc()
		case missing != nil:
			rs.rules[missing.idx].counters.shadowDenied.Inc()
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

// logSampled logs a warning at most once a second.
func (s *Server) logSampled(msg string, args ...any) {
	now := s.now().UnixNano()
	last := s.lastLog.Load()
	if now-last < int64(time.Second) || !s.lastLog.CompareAndSwap(last, now) {
		return
	}
	s.log.Warn(msg, args...)
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
	mode     FailureMode // resolved: the rule's, else the server's default
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
		rr.mode = r.FailureMode
		if rr.mode == FailureDefault {
			rr.mode = s.opts.FailureMode
		}
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
