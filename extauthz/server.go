package extauthz

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"

	"github.com/flashgate/flashgate/descriptors"
	"github.com/flashgate/flashgate/enforce"
	"github.com/flashgate/flashgate/window"
)

var _ authv3.AuthorizationServer = (*Server)(nil)

// Options configure a [Server]. Only Core is required.
type Options struct {
	// Core decides the hits; the Server uses its registry, logger and
	// clock too.
	Core *enforce.Core
	// Keys builds limit keys; the zero Keys uses the prefix "fg".
	Keys window.Keys
}

// Server is the ext_authz Check server, built with [NewServer]; safe for
// concurrent use.
type Server struct {
	opts    Options
	core    *enforce.Front
	log     *slog.Logger
	now     func() time.Time
	metrics *metrics
	resp    *respConsts

	rules   atomic.Pointer[ruleSet]
	encoded atomic.Pointer[sync.Map]
	pool    sync.Pool // *mapping
}

// NewServer returns a Server enforcing cfg; it registers metrics on the
// core's Registerer, so call it once per core.
func NewServer(cfg *descriptors.Config, opts Options) (*Server, error) {
	if cfg == nil {
		return nil, errors.New("extauthz: no descriptors config given")
	}
	if opts.Core == nil {
		return nil, errors.New("extauthz: no enforcement core given")
	}
	front, err := opts.Core.Front(frontEnd)
	if err != nil {
		return nil, fmt.Errorf("extauthz: %w", err)
	}
	s := &Server{
		opts:    opts,
		core:    front,
		log:     opts.Core.Logger(),
		now:     opts.Core.Clock(),
		metrics: newMetrics(front.Metrics()),
		resp:    newRespConsts(front.Headers()),
	}
	s.pool.New = func() any { return newMapping() }
	if err := s.SetConfig(cfg); err != nil {
		return nil, err
	}
	return s, nil
}

// SetConfig swaps in cfg's rules atomically; it fails only for a nil cfg.
func (s *Server) SetConfig(cfg *descriptors.Config) error {
	if cfg == nil {
		return errors.New("extauthz: no descriptors config given")
	}
	s.core.Series().Install(seriesOf(cfg), true, func(counters map[enforce.RuleLabel]*enforce.RuleCounters) {
		rs := s.newRuleSet(cfg, counters)
		s.encoded.Store(rs.encoded)
		s.rules.Store(rs)
	})
	if !s.core.HasFallback() && slices.ContainsFunc(cfg.Rules, func(r *descriptors.Rule) bool { return s.core.Mode(r.FailureMode) == enforce.FailureLocal }) {
		s.log.Warn("failure mode local has no fallback limiter here: it admits like allow")
	}
	s.log.Info("rules loaded", "file", cfg.Name, "domain", cfg.Domain, "rules", len(cfg.Rules))
	return nil
}

// Config returns the rules in force.
func (s *Server) Config() *descriptors.Config { return s.rules.Load().cfg }

// Check implements authv3.AuthorizationServer: OK or 429 whatever the
// backend does. Its one error is codes.InvalidArgument for bytes that are
// not a CheckRequest. The response may be shared: never modify it.
func (s *Server) Check(ctx context.Context, req *authv3.CheckRequest) (*authv3.CheckResponse, error) {
	start := s.now()
	rs := s.rules.Load()
	if b := wireOf(req); b != nil {
		if err := decodeCheck(b, &rs.fields, req); err != nil {
			return nil, grpcstatus.Error(codes.InvalidArgument, err.Error())
		}
	}
	m := s.pool.Get().(*mapping)
	m.grpc.set(req)
	return s.check(ctx, rs, &m.grpc, m, start), nil
}
