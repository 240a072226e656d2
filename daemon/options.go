package daemon

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"time"

	"github.com/flashgate/flashgate/enforce"
	"github.com/flashgate/flashgate/httpauthz"
	"github.com/flashgate/flashgate/rls"
	"github.com/flashgate/flashgate/window"
	"github.com/flashgate/flashgate/window/guard"
	"github.com/flashgate/flashgate/window/redisstore"
)

// Backends of [Options.Backend].
const (
	BackendMemory = "memory"
	BackendRedis  = "redis"
)

// Defaults of serve's flags that are the daemon's own.
const (
	DefaultCheckDeadline     = 40 * time.Millisecond // below the shipped Envoy configs' ext_authz timeout
	DefaultWarmupTimeout     = 30 * time.Second
	DefaultHTTPMaxConns      = 128
	DefaultGRPCMaxConns      = 1024
	DefaultGRPCMaxPending    = 256
	DefaultHTTPAuthzMaxConns = 1024
	DefaultRLSHTTPMaxConns   = 1024
)

// Options are the whole process's settings, as plain values: serve's flags
// parsed (docs/configuration.md names each flag that sets a field).
// [Options.Validate] checks them together; [New] refuses what it cannot
// build.
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

// Validate checks the options together and resolves the ones that follow
// from others: Redis.Timeout (the most one call is given, within
// CheckDeadline, never less than RedisTimeout) and a CheckDeadline raised
// to fit RedisTimeout when the user left it. changed reports
// whether the user set serve's flag of that name (nil: none). Its errors
// name serve's flags.
func (o *Options) Validate(changed func(flag string) bool) error {
	if changed == nil {
		changed = func(string) bool { return false }
	}
	if err := o.validateBackend(changed); err != nil {
		return err
	}
	var err error
	if o.HTTPAuthzPathPrefix, err = httpauthz.NormalizePrefix(o.HTTPAuthzPathPrefix); err != nil {
		return fmt.Errorf("--http-authz-path-prefix %q: %w", o.HTTPAuthzPathPrefix, err)
	}
	if err := firstFailure([]check{
		{o.LocalCacheSize < guard.MinGuardBudget, fmt.Sprintf("--local-cache-size %s: must be at least 64KiB (the local cache cannot be turned off; default 32MiB)", ByteSize(o.LocalCacheSize))},
		{o.MemoryMaxKeys < 0, fmt.Sprintf("--memory-max-keys %d: must not be negative", o.MemoryMaxKeys)},
		{o.BreakerFailures == 0, "--breaker-failures 0: want a positive count, or negative to disable the breaker"},
		{o.BreakerRate <= 0 || o.BreakerRate > 1, fmt.Sprintf("--breaker-failure-rate %g: want a share in (0, 1]", o.BreakerRate)},
		{o.BreakerMinCalls < 1, fmt.Sprintf("--breaker-min-calls %d: must be at least 1", o.BreakerMinCalls)},
		{o.BreakerCooldown <= 0, fmt.Sprintf("--breaker-cooldown %s: must be positive", o.BreakerCooldown)},
		{o.FleetSize < 0, fmt.Sprintf("--fleet-size %d: must not be negative (0: discover)", o.FleetSize)},
		{o.FleetTTL < 30*time.Millisecond, fmt.Sprintf("--fleet-ttl %s: must be at least 30ms", o.FleetTTL)},
		{o.WarmupTimeout < 0, fmt.Sprintf("--warmup-timeout %s: must not be negative (0: wait for Redis however long)", o.WarmupTimeout)},
		{o.HTTPMaxConns < 1, fmt.Sprintf("--http-max-conns %d: must be at least 1", o.HTTPMaxConns)},
		{o.GRPCMaxConns < 1, fmt.Sprintf("--grpc-max-conns %d: must be at least 1", o.GRPCMaxConns)},
		{o.GRPCMaxPending < 1, fmt.Sprintf("--grpc-max-pending %d: must be at least 1", o.GRPCMaxPending)},
		{o.RLSHTTPMaxConns < 1, fmt.Sprintf("--rls-http-max-conns %d: must be at least 1", o.RLSHTTPMaxConns)},
		{o.HTTPAuthzMaxConns < 1, fmt.Sprintf("--http-authz-max-conns %d: must be at least 1", o.HTTPAuthzMaxConns)},
		{o.HTTPAuthzAddr == "" && (changed("http-authz-path-prefix") || changed("http-authz-max-conns")),
			"--http-authz-path-prefix and --http-authz-max-conns need --http-authz-addr"},
		{o.DrainTimeout <= 0, fmt.Sprintf("--drain-timeout %s: must be positive", o.DrainTimeout)},
		{o.Pprof && o.HTTPAddr == "", "--pprof needs --http-addr"},
	}); err != nil {
		return err
	}
	if err := CheckBan(o.Ban); err != nil {
		return err
	}
	if err := o.XDS.validate(o.RLSConfig, changed); err != nil {
		return err
	}
	servesRLS := o.RLSConfig != "" || o.XDS.Server != ""
	return firstFailure([]check{
		{o.RLSResponseHeaders && !servesRLS, "--rls-response-headers needs --rls-config or --rls-xds-server"},
		{changed("rls-extras") && !servesRLS, "--rls-extras needs --rls-config or --rls-xds-server"},
		{o.RLSHTTPAddr != "" && !servesRLS, "--rls-http-addr needs --rls-config or --rls-xds-server"},
		{o.RLSHTTPAddr == "" && changed("rls-http-max-conns"), "--rls-http-max-conns needs --rls-http-addr"},
		{o.HTTPAuthzAddr != "" && o.RLSOnly(), "--http-authz-addr needs --config when the RLS is served (--rls-config, --rls-xds-server): without it serve is an RLS only, with no ext_authz rules"},
		{o.GRPCAddr == "", "--grpc-addr is empty"},
		{(o.GRPCTLS.Cert == "") != (o.GRPCTLS.Key == ""), "--grpc-tls-cert and --grpc-tls-key go together: give both or neither"},
		{o.GRPCTLS.CA != "" && o.GRPCTLS.Cert == "", "--grpc-tls-client-ca needs --grpc-tls-cert and --grpc-tls-key"},
	})
}

// check is one of Validate's conditions: bad says fail.
type check struct {
	bad  bool
	fail string
}

// firstFailure returns the first failing check's error, in order.
func firstFailure(cs []check) error {
	for _, c := range cs {
		if c.bad {
			return errors.New(c.fail)
		}
	}
	return nil
}

// redisFlags are serve's flags that only the Redis backend takes.
var redisFlags = []string{"redis-addr", "redis-mode", "redis-master-name", "redis-username", "redis-password",
	"redis-db", "redis-tls", "redis-timeout", "redis-pool-size", "redis-autopipeline", "redis-batch-window", "clock",
	"check-deadline", "fleet-size", "fleet-ttl", "warmup-timeout"}

// validateBackend checks the backend's options and resolves the check
// deadline and the most one Redis call is given.
func (o *Options) validateBackend(changed func(string) bool) error {
	switch o.Backend {
	case BackendMemory:
		for _, name := range redisFlags {
			if changed(name) {
				return fmt.Errorf("--%s is only for --backend redis (the backend is memory)", name)
			}
		}
	case BackendRedis:
		switch w := o.RedisBatchWindow; {
		case len(o.Redis.Addrs) == 0:
			return errors.New("--backend redis needs --redis-addr")
		case o.RedisTimeout <= 0:
			return fmt.Errorf("--redis-timeout %s: must be positive", o.RedisTimeout)
		case w < 0 || w > redisstore.MaxBatchWindow || w > o.RedisTimeout/2:
			return fmt.Errorf("--redis-batch-window %s: want 0 to %s and at most half of --redis-timeout (%s)",
				w, redisstore.MaxBatchWindow, o.RedisTimeout)
		case w > 0 && !o.RedisAutoPipeline:
			return fmt.Errorf("--redis-batch-window %s needs --redis-autopipeline", w)
		}
	default:
		return fmt.Errorf("--backend %q: want memory or redis", o.Backend)
	}
	if o.CheckDeadline <= 0 {
		return fmt.Errorf("--check-deadline %s: must be positive", o.CheckDeadline)
	}
	if o.Backend == BackendRedis && o.RedisTimeout > o.CheckDeadline*9/10 {
		if changed("check-deadline") {
			return fmt.Errorf("--redis-timeout %s is above 90%% of --check-deadline %s: the budget would not fit the deadline", o.RedisTimeout, o.CheckDeadline)
		}
		// The deadline follows a raised --redis-timeout; New logs it.
		o.CheckDeadline = (o.RedisTimeout*10 + 8) / 9
		o.DeadlineRaised = true
	}
	o.Redis.Timeout = max(o.CheckDeadline*9/10, o.RedisTimeout)
	return nil
}

// validate checks the xDS options together with the ratelimit config
// directory rlsConfig.
func (o *XDSOptions) validate(rlsConfig string, changed func(string) bool) error {
	if o.Server == "" {
		for _, name := range []string{"rls-xds-node-id", "rls-xds-node-metadata", "rls-xds-retry-interval", "rls-xds-tls",
			"rls-xds-tls-cert", "rls-xds-tls-key", "rls-xds-tls-ca", "rls-xds-tls-server-name", "rls-xds-force-start"} {
			if changed(name) {
				return fmt.Errorf("--%s needs --rls-xds-server", name)
			}
		}
		return nil
	}
	if !o.TLS {
		for _, name := range []string{"rls-xds-tls-cert", "rls-xds-tls-key", "rls-xds-tls-ca", "rls-xds-tls-server-name"} {
			if changed(name) {
				return fmt.Errorf("--%s needs --rls-xds-tls", name)
			}
		}
	}
	_, _, addrErr := net.SplitHostPort(o.Server)
	return firstFailure([]check{
		{rlsConfig != "", "--rls-config and --rls-xds-server exclude each other: the ratelimit config comes from a directory or from xDS"},
		{addrErr != nil, fmt.Sprintf("--rls-xds-server %q: want HOST:PORT", o.Server)},
		{o.NodeID == "", "--rls-xds-node-id is empty"},
		{o.RetryInterval <= 0, fmt.Sprintf("--rls-xds-retry-interval %s: must be positive", o.RetryInterval)},
		{(o.Files.Cert == "") != (o.Files.Key == ""), "--rls-xds-tls-cert and --rls-xds-tls-key go together"},
	})
}

// CheckBan refuses a penalty box that serve's --ban-* flags cannot set:
// no field negative, a duration up to window.MaxBanDuration that needs a
// threshold and a window.
func CheckBan(b window.Ban) error {
	return firstFailure([]check{
		{b.Threshold < 0 || b.Window < 0 || b.Duration < 0, "--ban-threshold, --ban-window and --ban-duration must not be negative"},
		{b.Duration > window.MaxBanDuration, fmt.Sprintf("--ban-duration %s is longer than the maximum of %s (one year)", b.Duration, window.MaxBanDuration)},
		{b.Duration > 0 && (b.Threshold == 0 || b.Window == 0), fmt.Sprintf("--ban-duration %s needs a positive --ban-threshold and --ban-window (or --ban-duration 0 to turn off the penalty box of the rules that set no duration)", b.Duration)},
	})
}
