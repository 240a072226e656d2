package rls

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/flashgate/flashgate/enforce"
	"github.com/flashgate/flashgate/window"
)

var _ rlsv3.RateLimitServiceServer = (*Server)(nil)

// ServiceName is the gRPC service Server implements.
const ServiceName = "envoy.service.ratelimit.v3.RateLimitService"

// Options configure a [Server]. Only Core is required.
type Options struct {
	// Core decides the hits; the Server uses its registry, logger and
	// clock too.
	Core *enforce.Core
	// Keys builds limit keys; the zero Keys uses the prefix "fg".
	Keys window.Keys
	// ResponseHeaders adds ratelimit's LIMIT_RESPONSE_HEADERS_ENABLED
	// headers, named by HeaderNames.
	ResponseHeaders bool
	// HeaderNames names those headers; a zero field takes
	// DefaultHeaderNames'.
	HeaderNames HeaderNames
	// OmitExtras leaves out flashgate's additions that are not rate-limit
	// header fields (retry-after, content-type, raw_body, the shadow mark).
	OmitExtras bool
}

// HeaderNames are the names of ratelimit's response headers.
type HeaderNames struct {
	Limit, Remaining, Reset string
}

// DefaultHeaderNames returns ratelimit's defaults: RateLimit-Limit,
// RateLimit-Remaining and RateLimit-Reset.
func DefaultHeaderNames() HeaderNames {
	return HeaderNames{Limit: "RateLimit-Limit", Remaining: "RateLimit-Remaining", Reset: "RateLimit-Reset"}
}

// ParseHeaderNames reads "LIMIT,REMAINING,RESET"; "" is
// DefaultHeaderNames.
func ParseHeaderNames(s string) (HeaderNames, error) {
	if s == "" {
		return DefaultHeaderNames(), nil
	}
	parts := strings.Split(s, ",")
	if len(parts) != 3 {
		return HeaderNames{}, fmt.Errorf("header names %q: want three, LIMIT,REMAINING,RESET", s)
	}
	for i, p := range parts {
		p = strings.TrimSpace(p)
		if strings.HasPrefix(p, ":") || !enforce.ValidHeaderName(p) {
			return HeaderNames{}, fmt.Errorf("header names %q: %q is not a valid HTTP header name", s, p)
		}
		parts[i] = p
	}
	if strings.EqualFold(parts[0], parts[1]) || strings.EqualFold(parts[0], parts[2]) || strings.EqualFold(parts[1], parts[2]) {
		return HeaderNames{}, fmt.Errorf("header names %q: the three must differ", s)
	}
	return HeaderNames{Limit: parts[0], Remaining: parts[1], Reset: parts[2]}, nil
}

// Limits of one request, bounding what one call makes the backend do.
const (
	// MaxDescriptors is the most descriptors a request may carry.
	MaxDescriptors = 64
	// MaxEntries is the most entries a descriptor may carry.
	MaxEntries = 32
)

// Server is the RateLimitService server, built with [NewServer]; safe for
// concurrent use.
type Server struct {
	opts    Options
	core    *enforce.Front
	log     *slog.Logger
	now     func() time.Time
	metrics *metrics
	in      atomic.Pointer[installed]
	// compat are ratelimit's header names, lower case, which the
	// rate-limit headers leave to them.
	compat map[string]bool
}

// NewServer returns a Server enforcing cfg; it registers metrics on the
// core's Registerer, so call it once per core.
func NewServer(cfg *Config, opts Options) (*Server, error) {
	if cfg == nil {
		return nil, errors.New("rls: no ratelimit config given")
	}
	if opts.Core == nil {
		return nil, errors.New("rls: no enforcement core given")
	}
	def := DefaultHeaderNames()
	for _, f := range []struct{ name, def *string }{
		{&opts.HeaderNames.Limit, &def.Limit},
		{&opts.HeaderNames.Remaining, &def.Remaining},
		{&opts.HeaderNames.Reset, &def.Reset},
	} {
		if *f.name == "" {
			*f.name = *f.def
		}
	}
	front, err := opts.Core.Front(frontEnd)
	if err != nil {
		return nil, fmt.Errorf("rls: %w", err)
	}
	s := &Server{opts: opts, core: front, log: opts.Core.Logger(), now: opts.Core.Clock(), metrics: newMetrics(front.Metrics())}
	if opts.ResponseHeaders {
		s.compat = map[string]bool{}
		for _, n := range []string{opts.HeaderNames.Limit, opts.HeaderNames.Remaining, opts.HeaderNames.Reset} {
			s.compat[strings.ToLower(n)] = true
		}
	}
	if err := s.SetConfig(cfg); err != nil {
		return nil, err
	}
	return s, nil
}

// Register registers s as the RateLimitService on r.
func (s *Server) Register(r grpc.ServiceRegistrar) { rlsv3.RegisterRateLimitServiceServer(r, s) }

// installed is a config in force with the counters its calls count into.
type installed struct {
	cfg      *Config
	counters map[enforce.RuleLabel]*enforce.RuleCounters
}

// Config returns the config in force.
func (s *Server) Config() *Config { return s.in.Load().cfg }

// SetConfig swaps cfg in: calls already running finish with the old one.
func (s *Server) SetConfig(cfg *Config) error {
	if cfg == nil {
		return errors.New("rls: no ratelimit config given")
	}
	s.core.Series().Install(seriesOf(cfg), false, func(counters map[enforce.RuleLabel]*enforce.RuleCounters) {
		s.in.Store(&installed{cfg: cfg, counters: counters})
	})
	rules := 0
	for _, d := range cfg.domains {
		rules += len(d.rules)
	}
	s.log.Info("ratelimit config loaded", "dir", cfg.Dir, "domains", len(cfg.domains), "rules", rules)
	if quota := cfg.quotaRules(); len(quota) > 0 {
		s.log.Warn("quota_mode is enforced as an ordinary limit: these rules refuse a request when over, whatever the other quota rules say",
			"dir", cfg.Dir, "rules", quota)
	}
	return nil
}

// ShouldRateLimit implements the RateLimitService. It refuses an empty
// domain or descriptor list and requests beyond MaxDescriptors or
// MaxEntries (InvalidArgument) and answers OK for an unknown domain;
// otherwise it never fails. Error messages never quote request values.
func (s *Server) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	start := s.now()
	defer func() { s.metrics.duration.Observe(s.now().Sub(start).Seconds()) }()
	if req.GetDomain() == "" {
		return nil, status.Error(codes.InvalidArgument, "rate limit domain must not be empty")
	}
	if len(req.GetDescriptors()) == 0 {
		return nil, status.Error(codes.InvalidArgument, "rate limit descriptor list must not be empty")
	}
	if n := len(req.GetDescriptors()); n > MaxDescriptors {
		return nil, status.Errorf(codes.InvalidArgument, "rate limit request has %d descriptors, more than flashgate's %d", n, MaxDescriptors)
	}
	for i, d := range req.GetDescriptors() {
		if n := len(d.GetEntries()); n > MaxEntries {
			return nil, status.Errorf(codes.InvalidArgument, "rate limit descriptor %d has %d entries, more than flashgate's %d", i, n, MaxEntries)
		}
	}
	in := s.in.Load()
	dom := in.cfg.domains[req.GetDomain()]
	if dom == nil {
		in.counters[enforce.RuleLabel{}].Inc(enforce.LabelAllowed)
		return okForAll(len(req.GetDescriptors())), nil
	}
	c := s.newCall(in, dom, req)
	c.v = s.core.Decide(ctx, &c.r)
	return c.respond(), nil
}

// okForAll is the answer for an unknown domain.
func okForAll(n int) *rlsv3.RateLimitResponse {
	resp := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK, Statuses: make([]*rlsv3.RateLimitResponse_DescriptorStatus, n)}
	for i := range resp.Statuses {
		resp.Statuses[i] = &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK}
	}
	return resp
}

// call is one ShouldRateLimit in progress.
type call struct {
	s     *Server
	dom   *Domain
	req   *rlsv3.RateLimitRequest
	ms    []match
	hitOf []int // hit index of each descriptor, -1 for none
	// never marks the descriptors that can never be admitted; blockedAt
	// is the first enforcing one, or -1.
	never     []bool
	blockedAt int
	// r is what the call asks the core; r.Tags[j] is r.Hits[j]'s Tag.
	r enforce.Request
	v enforce.Verdict
}

func (s *Server) newCall(in *installed, dom *Domain, req *rlsv3.RateLimitRequest) *call {
	descs := req.GetDescriptors()
	c := &call{s: s, dom: dom, req: req, ms: make([]match, len(descs)), hitOf: make([]int, len(descs)),
		never: make([]bool, len(descs)), blockedAt: -1}
	c.r.None = in.counters[enforce.RuleLabel{Domain: dom.Name}]
	counters := func(r *Rule) *enforce.RuleCounters {
		return in.counters[enforce.RuleLabel{Domain: dom.Name, Rule: r.Label()}]
	}
	for i, d := range descs {
		c.ms[i] = dom.lookup(d)
	}
	applyReplaces(c.ms)
	for i := range c.ms {
		c.hitOf[i] = -1
		r := c.ms[i].limit()
		if r == nil || r.Unlimited {
			continue
		}
		cost := hitsAddend(req, descs[i])
		if r.RequestsPerUnit == 0 || cost > window.MaxRequests {
			c.never[i] = true
			switch {
			case !c.shadow(r) && c.blockedAt < 0:
				c.blockedAt = i
				c.r.Refusal = &enforce.Refusal{Policy: r.policyOf(), Counters: counters(r), RetryAfter: r.Window}
			case c.shadow(r):
				c.r.Never = append(c.r.Never, enforce.Never{At: len(c.r.Hits), Policy: r.policyOf()})
				if c.r.Refusal == nil {
					c.r.Refusal = &enforce.Refusal{Policy: r.policyOf(), Counters: counters(r), RetryAfter: r.Window, Shadow: true}
				}
			}
			continue
		}
		c.hitOf[i] = len(c.r.Hits)
		c.r.Tags = append(c.r.Tags, enforce.HitTag{Rule: r, Mode: r.FailureMode, Policy: r.policyOf(), Counters: counters(r)})
		c.r.Hits = append(c.r.Hits, window.Hit{
			Key:    s.opts.Keys.Key(dom.keyRule, c.ms[i].value),
			Rule:   r.Label(),
			Limit:  r.WindowLimit(),
			Cost:   int(cost),
			Shadow: c.shadow(r),
		})
	}
	for j := range c.r.Hits {
		c.r.Hits[j].Tag = &c.r.Tags[j]
	}
	return c
}

// hitsAddend is the Cost of descriptor d: its own hits_addend, else the
// request's; 0 counts as 1, since a window has no check that records
// nothing.
func hitsAddend(req *rlsv3.RateLimitRequest, d *ratelimitv3.RateLimitDescriptor) uint64 {
	n := uint64(req.GetHitsAddend())
	if h := d.GetHitsAddend(); h != nil {
		n = h.GetValue()
	}
	return max(n, 1)
}

func (c *call) shadow(r *Rule) bool { return r.Shadow || c.s.core.Shadow() }

// applyReplaces drops the rules another matched rule replaces, as
// ratelimit does; an unlimited rule stays unlimited.
func applyReplaces(ms []match) {
	var replaced map[string]bool
	for i := range ms {
		if r := ms[i].rule; r != nil && ms[i].override == nil {
			for _, name := range r.Replaces {
				if replaced == nil {
					replaced = map[string]bool{}
				}
				replaced[name] = true
			}
		}
	}
	for i := range ms {
		if r := ms[i].rule; r != nil && ms[i].override == nil && !r.Unlimited && r.Name != "" && replaced[r.Name] {
			ms[i].rule = nil
		}
	}
}

func (c *call) respond() *rlsv3.RateLimitResponse {
	resp := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK, Statuses: make([]*rlsv3.RateLimitResponse_DescriptorStatus, len(c.ms))}
	for i := range c.ms {
		resp.Statuses[i] = c.status(i)
	}
	over := c.refused()
	if over {
		resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
	}
	a := *c.v.Answer
	extras := !c.s.opts.OmitExtras
	if !extras {
		// The header families alone.
		a.Denied, a.Shadow = false, false
	}
	compat := c.s.opts.ResponseHeaders && c.v.Via != enforce.ViaAllow && c.v.Via != enforce.ViaDeny
	a.Headers(c.s.core.Headers(), func(k, v string) {
		if !compat || !c.s.compat[k] {
			resp.ResponseHeadersToAdd = append(resp.ResponseHeadersToAdd, &corev3.HeaderValue{Key: k, Value: v})
		}
	})
	if compat {
		resp.ResponseHeadersToAdd = append(resp.ResponseHeadersToAdd, limitHeaders(c.s.opts.HeaderNames, resp.Statuses, c.binding())...)
	}
	if over && extras {
		resp.RawBody = []byte(a.Problem())
	}
	return resp
}

// status is descriptor i's status (see the package doc).
func (c *call) status(i int) *rlsv3.RateLimitResponse_DescriptorStatus {
	r := c.ms[i].limit()
	switch {
	case r == nil:
		return &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK}
	case r.Unlimited:
		return &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK, LimitRemaining: math.MaxUint32}
	}
	st := &rlsv3.RateLimitResponse_DescriptorStatus{
		Code:               rlsv3.RateLimitResponse_OK,
		CurrentLimit:       currentLimit(r),
		DurationUntilReset: untilReset(r.Window),
	}
	// uncounted is the status of a descriptor this call learnt nothing
	// of: no limit on a refusal, else the binding hit's remaining.
	uncounted := func(remaining int) *rlsv3.RateLimitResponse_DescriptorStatus {
		if c.refused() {
			return &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK}
		}
		st.LimitRemaining = uint32(max(min(remaining, int(r.RequestsPerUnit)), 0))
		return st
	}
	overCode := rlsv3.RateLimitResponse_OVER_LIMIT
	if r.Shadow {
		overCode = rlsv3.RateLimitResponse_OK
	}
	if c.never[i] {
		st.Code = overCode
		return st
	}
	j, o, d := c.hitOf[i], &c.v.Outcome, &c.v.Decision
	switch {
	case o.Via == enforce.ViaDeny:
		if !c.r.Hits[j].Shadow && c.s.core.Mode(r.FailureMode) == enforce.FailureDeny {
			st.Code, st.DurationUntilReset = rlsv3.RateLimitResponse_OVER_LIMIT, untilReset(time.Second)
			return st
		}
		return uncounted(0)
	case o.Via != enforce.ViaLimiter && o.Via != enforce.ViaFallback:
		return uncounted(0)
	case !o.Decided(j):
		return uncounted(0)
	case c.r.Tags[j].Report.Known:
		// Its own window was counted: its numbers are exact.
		if rep := &c.r.Tags[j].Report; rep.Over {
			st.Code, st.DurationUntilReset = overCode, untilReset(rep.RetryAfter)
		} else {
			st.LimitRemaining = uint32(max(min(rep.Remaining, int(r.RequestsPerUnit)), 0))
			st.DurationUntilReset = admitReset(rep.Reset, r.Window)
		}
	case !d.Allowed && j == o.Hit(d.Index):
		st.Code, st.DurationUntilReset = rlsv3.RateLimitResponse_OVER_LIMIT, untilReset(d.RetryAfter)
	case d.Shadowed && j == o.Hit(d.ShadowIndex):
		st.Code = overCode
	case d.Allowed && j == o.Hit(d.Index):
		st.LimitRemaining = uint32(max(min(d.Remaining, int(r.RequestsPerUnit)), 0))
		st.DurationUntilReset = admitReset(d.Reset, r.Window)
	case d.Allowed:
		return uncounted(d.Remaining)
	default:
		return uncounted(0)
	}
	return st
}

// refused reports whether the call's answer is OVER_LIMIT.
func (c *call) refused() bool { return c.v.Denied() }

// untilReset is d in whole seconds, rounded up, at least 1: Envoy reads
// the seconds alone, so 0.4 s must not read as 0.
func untilReset(d time.Duration) *durationpb.Duration {
	return &durationpb.Duration{Seconds: enforce.RetrySeconds(d)}
}

// admitReset is an admitted descriptor's duration_until_reset: when its
// window's oldest admission leaves it, at most win (win when unknown).
func admitReset(reset, win time.Duration) *durationpb.Duration {
	if reset <= 0 || reset > win {
		reset = win
	}
	return untilReset(reset)
}

func currentLimit(r *Rule) *rlsv3.RateLimitResponse_RateLimit {
	l := &rlsv3.RateLimitResponse_RateLimit{Name: r.Name, RequestsPerUnit: r.RequestsPerUnit, Unit: r.Unit}
	return l
}

// binding returns the descriptor whose numbers are exact, or -1.
func (c *call) binding() int {
	if c.v.Via == enforce.ViaRefusal {
		return c.blockedAt
	}
	if j := c.v.Hit(c.v.Decision.Index); (c.v.Via == enforce.ViaLimiter || c.v.Via == enforce.ViaFallback) && j >= 0 {
		for i, h := range c.hitOf {
			if h == j {
				return i
			}
		}
	}
	return -1
}

// limitHeaders are ratelimit's response headers for the descriptor with a
// limit and the fewest remaining (pref among equals); nil for none.
func limitHeaders(names HeaderNames, sts []*rlsv3.RateLimitResponse_DescriptorStatus, pref int) []*corev3.HeaderValue {
	var min *rlsv3.RateLimitResponse_DescriptorStatus
	if pref >= 0 && sts[pref].GetCurrentLimit() != nil {
		min = sts[pref]
	}
	for _, st := range sts {
		if st.GetCurrentLimit() != nil && (min == nil || st.GetLimitRemaining() < min.GetLimitRemaining()) {
			min = st
		}
	}
	if min == nil {
		return nil
	}
	reset := min.GetDurationUntilReset().AsDuration()
	secs := max(int64((reset+time.Second-1)/time.Second), 1)
	return []*corev3.HeaderValue{
		{Key: names.Limit, Value: strconv.FormatUint(uint64(min.GetCurrentLimit().GetRequestsPerUnit()), 10)},
		{Key: names.Remaining, Value: strconv.FormatUint(uint64(min.GetLimitRemaining()), 10)},
		{Key: names.Reset, Value: strconv.FormatInt(secs, 10)},
	}
}
