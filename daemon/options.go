package daemon

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/flashgate/flashgate/enforce"
	"github.com/flashgate/flashgate/rls"
	"github.com/flashgate/flashgate/window"
	"github.com/flashgate/flashgate/window/redisstore"
)

// Backends of [Options.Backend].
const (
	BackendMemory = "memory"
	BackendRedis  = "redis"
)

// Options are the whole process's settings, as plain values: serve's flags
// parsed (docs/configuration.md names each flag that sets a field). The
// caller validates what the flags say together; [New] refuses what it
// cannot build.
type Options struct {
	// Config is the descriptors file; "" enforces the built-in example,
	// unless the RLS is configured (RLSOnly), when ext_authz is not served.
	Config string
	// GRPCAddr and HTTPAddr are the listen addresses of the gRPC server
	// and of /metrics, /healthz and /readyz ("" : no HTTP).
	GRPCAddr, HTTPAddr string
	// GRPCMaxConns, GRPCMaxPending and HTTPMaxConns cap their connections
	// (host.Options).
	GRPCMaxConns, GRPCMaxPending, HTTPMaxConns int
	// GRPCTLS serves TLS on GRPCAddr, reloaded when the files change.
	GRPCTLS TLSFiles
	// DrainTimeout bounds the drain of in-flight checks when Serve's
	// context ends.
	DrainTimeout time.Duration
	// Pprof serves /debug/pprof/ on HTTPAddr.
	Pprof bool

	// Backend is BackendMemory or BackendRedis.
	Backend string
	// Redis is the checks' Redis client; its Timeout is the most one call
	// is given (the budget's maximum), RedisTimeout the budget's minimum.
	Redis        redisstore.ClientConfig
	RedisTimeout time.Duration
	// RedisMode names the Redis mode in use (redisstore.ModeStandalone ...)
	// for the log and the pipelines.
	RedisMode string
	// RedisAutoPipeline and RedisBatchWindow are redisstore.Options's.
	RedisAutoPipeline bool
	RedisBatchWindow  time.Duration
	Clock             redisstore.Clock
	Keys              window.Keys
	// Breaker: BreakerFailures < 0 turns the circuit breaker off.
	BreakerFailures int
	BreakerRate     float64
	BreakerMinCalls int
	BreakerCooldown time.Duration
	// FleetSize fixes the fleet's size; 0 discovers it by heartbeats that
	// count for FleetTTL.
	FleetSize int
	FleetTTL  time.Duration
	// WarmupTimeout bounds how long health waits for a warm Redis (0: no
	// bound).
	WarmupTimeout time.Duration
	// CheckDeadline is the most a check waits for Redis; DeadlineRaised
	// says it was raised to fit RedisTimeout (logged at start).
	CheckDeadline  time.Duration
	DeadlineRaised bool

	// FailureMode, Shadow, Headers and Ban are the core's defaults.
	FailureMode enforce.FailureMode
	Shadow      bool
	Headers     enforce.Families
	Ban         window.Ban
	// LocalCacheSize is the local cache's budget in bytes; MemoryMaxKeys
	// bounds the in-process limiters (0: their default).
	LocalCacheSize int64
	MemoryMaxKeys  int

	// RLSConfig is a ratelimit config directory; with it, or with
	// XDS.Server, the gRPC server serves the RLS.
	RLSConfig string
	// RLSResponseHeaders, RLSHeaderNames and RLSOmitExtras shape its
	// answers (rls.Options).
	RLSResponseHeaders bool
	RLSHeaderNames     rls.HeaderNames
	RLSOmitExtras      bool
	// RLSHTTPAddr serves /healthcheck and /json ("" : none), capped at
	// RLSHTTPMaxConns.
	RLSHTTPAddr     string
	RLSHTTPMaxConns int
	// XDS takes the RLS's config from an xDS server.
	XDS XDSOptions

	// HTTPAuthzAddr serves the HTTP front-end ("" : none).
	HTTPAuthzAddr       string
	HTTPAuthzPathPrefix string
	HTTPAuthzMaxConns   int

	// LogHandler receives the process's log records; its warnings and
	// errors are limited per kind (see logLimit).
	LogHandler slog.Handler
}

// TLSFiles are PEM files of a TLS endpoint; Cert and Key go together, and
// "" for Cert means no TLS.
type TLSFiles struct {
	Cert, Key, CA string
}

// XDSOptions are the RLS's xDS client; Server "" means none.
type XDSOptions struct {
	Server, NodeID, NodeMetadata string
	RetryInterval                time.Duration
	// TLS connects over TLS: Files (all optional) are the client
	// certificate and the CA bundle, ServerName the name verified (default:
	// Server's host).
	TLS        bool
	Files      TLSFiles
	ServerName string
	// ForceStart turns ready before a first config.
	ForceStart bool
}

// RLSOnly reports whether the process serves the RLS without a
// descriptors file: ext_authz is not served then.
func (o *Options) RLSOnly() bool {
	return o.Config == "" && (o.RLSConfig != "" || o.XDS.Server != "")
}

// validate refuses what New cannot build.
func (o *Options) validate() error {
	switch {
	case o.LogHandler == nil:
		return errors.New("no log handler")
	case o.Backend != BackendMemory && o.Backend != BackendRedis:
		return fmt.Errorf("backend %q: want %s or %s", o.Backend, BackendMemory, BackendRedis)
	case o.DrainTimeout <= 0:
		return fmt.Errorf("drain timeout %s: must be positive", o.DrainTimeout)
	case o.RLSConfig != "" && o.XDS.Server != "":
		return errors.New("a ratelimit config directory and an xDS server exclude each other")
	}
	return nil
}
