package extauthz

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"

	"github.com/flashgate/flashgate/window"
)

var _ authv3.AuthorizationServer = (*Server)(nil)

// Pinger is what readiness needs of a backend: window.Redis has it.
type Pinger interface {
	Ping(ctx context.Context) error
}

// Defaults of [Options].
const (
	// DefaultTimeout is the backend budget of one check (--redis-timeout).
	DefaultTimeout = 25 * time.Millisecond
	// DefaultFallbackTimeout is the extra budget of the local fallback.
	DefaultFallbackTimeout = 5 * time.Millisecond
)

// Options configure a [Server]. Only Limiter is required.
type Options struct {
	// Limiter decides hits: window.Memory, window.Redis, usually behind a
	// window.Guard (whose GuardOptions.Ban is the default penalty box; a
	// rule's ban overrides it through window.Hit.Ban). It must honour ctx
	// cancellation; the Server stops waiting at the deadline regardless.
	Limiter window.Limiter
	// Fallback decides the hits of failure mode "local" when Limiter fails:
	// an in-process window.Memory. Nil makes "local" behave as "allow".
	Fallback window.Limiter
	// Pinger tells readiness (gRPC health, /readyz) that the backend
	// answers. Nil: Limiter if it is a Pinger, else ready at once.
	Pinger Pinger
	// Keys builds limit keys; the zero Keys uses the prefix "fg".
	Keys window.Keys
	// FailureMode applies to rules that set none; FailureDefault means
	// FailureLocal.
	FailureMode FailureMode
	// Shadow makes every hit a shadow hit (--shadow): decide and count, but
	// admit everything.
	Shadow bool
	// Timeout is the backend budget of one check; 0 means DefaultTimeout.
	// A check answers within Timeout + FallbackTimeout (plus scheduling),
	// whatever the backend does. A limiter whose Instant method reports true
	// (window.Memory, a window.Guard over one) never waits, so no deadline is
	// armed for it.
	Timeout time.Duration
	// Detach runs each backend call on its own goroutine and stops waiting
	// at the deadline even if the limiter ignores ctx (the call then finishes
	// alone). window.Memory, window.Guard and window.Redis honour ctx, so
	// this is insurance against a limiter that does not; it costs about a
	// microsecond and a few allocations per check. An Instant limiter is
	// never detached.
	Detach bool
	// FallbackTimeout is the budget of the local fallback after a backend
	// failure; 0 means DefaultFallbackTimeout. Not armed for an Instant
	// fallback (window.Memory), as Timeout is not.
	FallbackTimeout time.Duration
	// Breaker configures the circuit breaker; see [BreakerOptions].
	Breaker BreakerOptions
	// Registerer receives the metrics; nil means a new private registry
	// (served by HTTPHandler). The global registry is never used implicitly.
	Registerer prometheus.Registerer
	// Gatherer serves /metrics; nil means Registerer if it is a Gatherer.
	Gatherer prometheus.Gatherer
	// Logger receives structured logs; nil discards them. Request values
	// (headers, IPs) are never logged above debug level.
	Logger *slog.Logger
	// Now is the clock for durations and the breaker; nil means time.Now.
	Now func() time.Time
}

// Server is the ext_authz Check server. Build it with [NewServer]. All its
// methods are safe for concurrent use.
type Server struct {
	opts     Options
	log      *slog.Logger
	now      func() time.Time
	metrics  *metrics
	breaker  *breaker
	health   *health.Server
	gatherer prometheus.Gatherer
	pinger   Pinger
	resp     *respConsts
	instant  bool         // the limiter never waits: no deadline, never detached (see instant)
	split    localDecider // the limiter's two halves, if it has them (see localDecider)
	// fallbackInstant: the fallback limiter never waits (see instant).
	fallbackInstant bool

	rules   atomic.Pointer[ruleSet]
	serving atomic.Bool
	closed  atomic.Bool
	pool    sync.Pool // *Mapping
	lastLog atomic.Int64

	// reloadOp is held for a whole reload (read, parse, swap), so that a
	// SIGHUP and the file watcher cannot install their files out of order.
	reloadOp sync.Mutex

	// reloadMu guards the fields below.
	reloadMu   sync.Mutex
	path       string // file the rules came from; "" for the built-in example
	loadedHash [32]byte
	badHash    [32]byte
}

// NewServer returns a Server enforcing cfg with opts. It registers the
// metrics on opts.Registerer, so call it once per registry. Health starts
// NOT_SERVING; call [Server.WaitReady] (or SetServing) once the backend is up.
func NewServer(cfg *Config, opts Options) (*Server, error) {
	if cfg == nil {
		return nil, errors.New("extauthz: no descriptors config given")
	}
	if opts.Limiter == nil {
		return nil, errors.New("extauthz: no limiter given")
	}
	if opts.Timeout < 0 || opts.FallbackTimeout < 0 {
		return nil, errors.New("extauthz: timeouts must not be negative")
	}
	if opts.Timeout == 0 {
		opts.Timeout = DefaultTimeout
	}
	if opts.FallbackTimeout == 0 {
		opts.FallbackTimeout = DefaultFallbackTimeout
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
		breaker:  newBreaker(opts.Breaker, opts.Now),
		health:   health.NewServer(),
		gatherer: opts.Gatherer,
		pinger:   opts.Pinger,
		resp:     newRespConsts(),
	}
	if s.pinger == nil {
		s.pinger, _ = opts.Limiter.(Pinger)
	}
	s.instant, s.fallbackInstant = isInstant(opts.Limiter), isInstant(opts.Fallback)
	s.split, _ = opts.Limiter.(localDecider)
	s.pool.New = func() any { return &Mapping{Hits: make([]window.Hit, 0, 8), Rules: make([]*Rule, 0, 8)} }
	if opts.Fallback == nil && s.usesLocal(cfg) {
		s.log.Warn("failure mode local has no fallback limiter: it will admit like allow")
	}
	s.SetServing(false)
	if err := s.SetConfig(cfg); err != nil {
		return nil, err
	}
	return s, nil
}

// usesLocal reports whether some rule of cfg fails over to the fallback.
func (s *Server) usesLocal(cfg *Config) bool {
	return slices.ContainsFunc(cfg.Rules, func(r *Rule) bool { return s.modeOf(r) == FailureLocal })
}

// SetConfig swaps in cfg's rules atomically: checks already running finish
// with the old rules, the next ones use cfg. It fails only for a nil cfg.
func (s *Server) SetConfig(cfg *Config) error {
	if cfg == nil {
		return errors.New("extauthz: no descriptors config given")
	}
	s.rules.Store(s.newRuleSet(cfg))
	s.reloadMu.Lock()
	s.path = cfg.path
	s.reloadMu.Unlock()
	s.log.Info("rules loaded", "file", cfg.Name, "domain", cfg.Domain, "rules", len(cfg.Rules))
	return nil
}

// Config returns the rules in force.
func (s *Server) Config() *Config { return s.rules.Load().cfg }

// Check implements authv3.AuthorizationServer. It never returns an error:
// whatever the request holds and whatever the backend does, it answers OK
// or 429 (DESIGN.md, Responses) within the budget of [Options].
func (s *Server) Check(ctx context.Context, req *authv3.CheckRequest) (*authv3.CheckResponse, error) {
	start := s.now()
	rs := s.rules.Load()
	m := s.pool.Get().(*Mapping)
	rs.cfg.Map(req, s.opts.Keys, m)
	if s.opts.Shadow {
		for i := range m.Hits {
			m.Hits[i].Shadow = true
		}
	}
	resp, keep := s.decide(ctx, rs, m)
	if !keep {
		m.Reset()
		s.pool.Put(m)
	}
	s.metrics.checkDur.Observe(s.now().Sub(start).Seconds())
	return resp, nil
}

// decide answers one mapped request; keep reports that m is still in use by
// a backend call that outlived its budget.
func (s *Server) decide(ctx context.Context, rs *ruleSet, m *Mapping) (*authv3.CheckResponse, bool) {
	shadowMissing := false
	if r := m.Missing; r != nil {
		if !r.Shadow && !s.opts.Shadow {
			rr := &rs.rules[r.idx]
			rr.counters.denied.Inc()
			return rr.denied(time.Second), false
		}
		shadowMissing = true
	}
	if len(m.Hits) == 0 {
		if shadowMissing {
			rs.rules[m.Missing.idx].counters.shadowDenied.Inc()
			return rs.okShadow(nil, 0), false
		}
		rs.none.allowed.Inc()
		return rs.okPlain, false
	}
	d, err, keep := s.backend(ctx, m.Hits)
	if err != nil {
		return s.failure(ctx, rs, m, err), keep
	}
	return s.respond(rs, m.Rules, d, shadowMissing, m.Missing), keep
}

type result struct {
	d   window.Decision
	err error
}

// localDecider is what window.Guard offers besides Decide: its two halves.
// The server consults the local half first, so that a refusal from local
// state alone (keys full until later, the penalty box) costs no deadline
// timer and no breaker bookkeeping, and still answers while the breaker
// holds the backend off (without spending its probe); only the remote half
// runs within the backend's budget.
//
// A limiter must offer both halves to be split: one with DecideLocal alone
// is called whole, through Decide.
type localDecider interface {
	DecideLocal(hits []window.Hit) (window.Decision, bool)
	DecideRemote(ctx context.Context, hits []window.Hit) (window.Decision, error)
}

// instant is a limiter that decides without waiting on I/O (window.Memory,
// a window.Guard over one): a deadline could not interrupt it, so the server
// arms none (a timer and a context per check) and never detaches it.
type instant interface {
	Instant() bool
}

// isInstant reports whether lim (possibly nil) is an instant limiter.
func isInstant(lim window.Limiter) bool {
	i, ok := lim.(instant)
	return ok && i.Instant()
}

// errBreakerOpen is returned instead of calling a backend the breaker holds off.
var errBreakerOpen = errors.New("circuit breaker open")

// backend decides hits: a split limiter's local half first, outside the
// budget and the breaker; then the backend (the remote half, or the whole
// limiter) within the budget, if the breaker lets it. keep reports that the
// call is still running (it holds hits).
func (s *Server) backend(ctx context.Context, hits []window.Hit) (window.Decision, error, bool) {
	if s.split != nil {
		if d, refused := s.split.DecideLocal(hits); refused {
			return d, nil, false
		}
	}
	ok, probe := s.breaker.allow()
	if !ok {
		return window.Decision{}, errBreakerOpen, false
	}
	start := s.now()
	if s.instant {
		d, err := s.callBackend(ctx, hits)
		return s.backendDone(ctx, start, result{d, err}, false, probe)
	}
	cctx, cancel := context.WithTimeout(ctx, s.opts.Timeout)
	defer cancel()
	if !s.opts.Detach {
		d, err := s.callBackend(cctx, hits)
		return s.backendDone(ctx, start, result{d, err}, false, probe)
	}
	ch := make(chan result, 1)
	go func() {
		d, err := s.callBackend(cctx, hits)
		ch <- result{d, err}
	}()
	var r result
	keep := false
	select {
	case r = <-ch:
	case <-cctx.Done():
		// The limiter overran its deadline: answer now, let it finish alone.
		select {
		case r = <-ch:
		default:
			r.err, keep = fmt.Errorf("backend did not answer within %s: %w", s.opts.Timeout, cctx.Err()), true
		}
	}
	return s.backendDone(ctx, start, r, keep, probe)
}

// callBackend asks the backend: the remote half of a split limiter (whose
// local half has been consulted), or the whole limiter.
func (s *Server) callBackend(ctx context.Context, hits []window.Hit) (window.Decision, error) {
	if s.split != nil {
		return s.split.DecideRemote(ctx, hits)
	}
	return s.opts.Limiter.Decide(ctx, hits)
}

// backendDone records a backend call's outcome (metrics, breaker).
// A probe (see breaker.allow) is always settled here.
func (s *Server) backendDone(ctx context.Context, start time.Time, r result, keep bool, probe uint64) (window.Decision, error, bool) {
	if r.err == nil && r.d.Source != window.SourceBackend {
		// A local guard answer says nothing about the backend's health.
		if probe != 0 {
			s.breaker.release(probe)
		}
		return r.d, nil, keep
	}
	s.metrics.backendDur.Observe(s.now().Sub(start).Seconds())
	if r.err != nil && ctx.Err() != nil && !errors.Is(r.err, context.DeadlineExceeded) {
		// Envoy gave up on this check; not the backend's fault.
		if probe != 0 {
			s.breaker.release(probe)
		}
		return r.d, r.err, keep
	}
	s.breaker.record(r.err == nil || errors.Is(r.err, window.ErrInvalidHit))
	return r.d, r.err, keep
}

// errKind classifies a backend error for flashgate_backend_errors_total.
func errKind(err error) string {
	var ne net.Error
	switch {
	case errors.Is(err, errBreakerOpen):
		return kindBreakerOpen
	case errors.Is(err, window.ErrInvalidHit):
		return kindInvalidHit
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &ne) && ne.Timeout():
		return kindTimeout
	case errors.Is(err, context.Canceled):
		return kindCanceled
	case errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE),
		errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, net.ErrClosed), errors.As(err, &ne):
		return kindConnection
	}
	return kindOther
}

// fallback decides hits on the fallback limiter, within FallbackTimeout
// unless it never waits (see instant), and even if Envoy has given up on
// the check.
func (s *Server) fallback(ctx context.Context, hits []window.Hit) (window.Decision, error) {
	ctx = context.WithoutCancel(ctx)
	if !s.fallbackInstant {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, s.opts.FallbackTimeout)
		defer cancel()
	}
	return s.opts.Fallback.Decide(ctx, hits)
}

// failure decides a request whose backend call failed, by failure mode: deny
// if any enforcing hit's mode is deny; else the local hits by the fallback;
// else allow.
func (s *Server) failure(ctx context.Context, rs *ruleSet, m *Mapping, err error) *authv3.CheckResponse {
	kind := errKind(err)
	s.metrics.backendErr(kind).Inc()
	s.logSampled("backend failed; deciding by failure mode", "kind", kind, "error", err)

	var denyRule *Rule
	shadowDeny := false
	nlocal := 0
	for i, r := range m.Rules {
		switch s.modeOf(r) {
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
				if s.modeOf(r) == FailureLocal {
					hits = append(hits, m.Hits[i])
					rules = append(rules, r)
				}
			}
		}
		d, ferr := s.fallback(ctx, hits)
		if ferr == nil {
			s.metrics.failLocal.Inc()
			return s.respond(rs, rules, d, shadowDeny || m.Missing != nil, m.Missing)
		}
		s.metrics.backendErr(kindFallback).Inc()
		s.logSampled("fallback limiter failed; admitting", "error", ferr)
	}
	s.metrics.failAllow.Inc()
	rs.rules[m.Rules[0].idx].counters.errored.Inc()
	if shadowDeny || m.Missing != nil {
		return rs.okShadow(nil, 0)
	}
	return rs.okPlain
}

func (s *Server) modeOf(r *Rule) FailureMode {
	if r.FailureMode != FailureDefault {
		return r.FailureMode
	}
	return s.opts.FailureMode
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
	k       *respConsts
	cfg     *Config
	rules   []ruleResp // by Rule.idx
	none    ruleCounters
	okPlain *authv3.CheckResponse
}

type ruleResp struct {
	k         *respConsts
	limit     *corev3.HeaderValueOption
	remaining []*corev3.HeaderValueOption // index = remaining count
	// okResps[n] is the OK response for n remaining, built on first use
	// (same range as remaining) and then shared: responses are immutable.
	okResps  []atomic.Pointer[authv3.CheckResponse]
	bodyHead string
	counters ruleCounters
}

func (s *Server) newRuleSet(cfg *Config) *ruleSet {
	rs := &ruleSet{
		k:    s.resp,
		cfg:  cfg,
		none: s.metrics.forRule(cfg.Domain, ""),
		okPlain: &authv3.CheckResponse{
			Status:       s.resp.statusOK,
			HttpResponse: &authv3.CheckResponse_OkResponse{OkResponse: &authv3.OkHttpResponse{}},
		},
	}
	rs.rules = make([]ruleResp, len(cfg.Rules))
	for i, r := range cfg.Rules {
		rr := &rs.rules[i]
		rr.k = s.resp
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
		r = p.Load()
	}
	return r
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

// denied is the 429 of DESIGN.md for this rule.
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
