package main

import (
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"

	"github.com/flashgate/flashgate/daemon"
	"github.com/flashgate/flashgate/enforce"
	"github.com/flashgate/flashgate/httpauthz"
	"github.com/flashgate/flashgate/rls"
	"github.com/flashgate/flashgate/window"
	"github.com/flashgate/flashgate/window/fallback"
	"github.com/flashgate/flashgate/window/guard"
	"github.com/flashgate/flashgate/window/redisstore"
	"github.com/spf13/pflag"
)

// serveOptions are the flags of serve (docs/configuration.md's table), each also settable as
// FLASHGATE_<FLAG>.
type serveOptions struct {
	config   string
	grpcAddr string
	httpAddr string
	backend  string

	redisOptions
	redisPoolSize int
	redisAutoPipe bool
	redisWindow   time.Duration
	clock         string

	failureMode string
	banOptions
	localCacheSize byteSize
	memoryMaxKeys  int
	shadow         bool
	headers        string

	breakerFailures int
	breakerRate     float64
	breakerMinCalls int
	breakerCooldown time.Duration
	checkDeadline   time.Duration
	fleetSize       int
	fleetTTL        time.Duration

	rlsConfig  string
	rlsHeaders bool
	rlsExtras  bool
	rlsNames   string
	rlsHTTP    string
	// rlsHTTPMaxConns is --rls-http-max-conns.
	rlsHTTPMaxConns int
	rlsXDSOptions

	httpAuthzAddr       string
	httpAuthzPathPrefix string
	httpAuthzMaxConns   int

	warmupTimeout time.Duration
	httpMaxConns  int
	grpcMaxConns  int
	// grpcMaxPending is --grpc-max-pending.
	grpcMaxPending int

	grpcTLSCert     string
	grpcTLSKey      string
	grpcTLSClientCA string

	drainTimeout time.Duration
	pprof        bool
	logLevel     string
	logFormat    string
}

func (o *serveOptions) addFlags(f *pflag.FlagSet) {
	f.StringVar(&o.config, "config", "", "descriptors file (default: the built-in example, logged as such; but with --rls-config or --rls-xds-server and no --config, serve is an RLS only and ext_authz is not served: Check answers UNIMPLEMENTED); reloaded on change and on SIGHUP")
	f.StringVar(&o.grpcAddr, "grpc-addr", "127.0.0.1:9191", "listen address of ext_authz, grpc.health.v1 and reflection")
	f.StringVar(&o.httpAddr, "http-addr", "127.0.0.1:9192", "listen address of /metrics, /healthz and /readyz (empty: none)")
	f.StringVar(&o.backend, "backend", "memory", "where the windows live: memory (embedded, single process) or redis")
	o.redisOptions.addFlags(f, redisstore.DefaultRedisTimeout)
	f.IntVar(&o.redisPoolSize, "redis-pool-size", 0, "Redis connections per node (0: 10 per CPU)")
	f.BoolVar(&o.redisAutoPipe, "redis-autopipeline", true, "checks arriving while a script call is in flight are decided together by the next one, one script call for the batch (a second call goes out when the one in flight stalls; after a batch of n ≥ 4 the next call waits for n checks or about 200 µs); on cluster one pipeline per master, a check's keys on one master in one call (Redis ≥ 7.0); --redis-autopipeline=false sends each check on its own round trip (on cluster one script per key)")
	f.DurationVar(&o.redisWindow, "redis-batch-window", 0, "with --redis-autopipeline, a check that finds its pipeline (on cluster: its master's) idle waits up to this long (or while a hold after a batch still runs), at most 5ms and half of --redis-timeout, for others to share its script call: latency for Redis CPU where each sidecar sends too few checks at a time to batch (0: it goes out at once)")
	f.StringVar(&o.clock, "clock", "redis", "time source of the windows: redis (TIME in the script) or local")
	f.StringVar(&o.failureMode, "failure-mode", "local", "when Redis fails: local (enforce per process in memory), allow or deny")
	o.banOptions.addFlags(f)
	o.localCacheSize = guard.DefaultGuardBudget
	f.Var(&o.localCacheSize, "local-cache-size", "memory budget of the local over-limit cache and penalty box (e.g. 32MiB)")
	f.IntVar(&o.memoryMaxKeys, "memory-max-keys", 0, "keys the memory backend (and the local failure mode) track at most (0: the window package's default)")
	f.BoolVar(&o.shadow, "shadow", false, "decide and count, but admit everything (x-ratelimit-shadow: 1 on would-be denials)")
	f.StringVar(&o.headers, "ratelimit-headers", enforce.FamiliesBoth.String(), "rate-limit headers on every answer (ext_authz, RLS): both (the IETF RateLimit and RateLimit-Policy, and x-ratelimit-limit, -remaining, -reset), ietf, x or none; an ext_authz 429 always has retry-after and its problem+json body (the RLS's: see --rls-extras)")
	f.IntVar(&o.breakerFailures, "breaker-failures", guard.DefaultBreakerConnFailures, "connection errors in a row (Redis refused or reset: down, not slow) that open the circuit breaker at once; negative: no breaker")
	f.Float64Var(&o.breakerRate, "breaker-failure-rate", guard.DefaultBreakerFailureRate, "share of failed Redis calls (errors and timeouts) within a second that opens the circuit breaker")
	f.IntVar(&o.breakerMinCalls, "breaker-min-calls", guard.DefaultBreakerMinCalls, "calls within a second before --breaker-failure-rate can open the breaker")
	f.DurationVar(&o.breakerCooldown, "breaker-cooldown", guard.DefaultBreakerCooldown, "how long an open breaker holds Redis calls off before one probe")
	f.DurationVar(&o.checkDeadline, "check-deadline", defaultCheckDeadline, "the most a check may wait for Redis in all, below Envoy's ext_authz timeout (the shipped envoy.yaml: 50ms); the Redis budget follows Redis's latency from --redis-timeout up to 90% of this")
	f.IntVar(&o.fleetSize, "fleet-size", 0, "sidecars sharing the Redis, for failure mode local's per-sidecar share ceil(limit/N) (0: discover them by heartbeat)")
	f.DurationVar(&o.fleetTTL, "fleet-ttl", fallback.DefaultFleetTTL, "how long a sidecar's heartbeat counts it in the fleet (beats every third of it)")
	f.StringVar(&o.rlsConfig, "rls-config", "", "envoyproxy/ratelimit config directory (DIR/config/*.yaml, else DIR/*.yaml): serve envoy.service.ratelimit.v3.RateLimitService on --grpc-addr, beside ext_authz with --config, alone without it (no built-in example rules); reloaded on change and on SIGHUP")
	f.BoolVar(&o.rlsHeaders, "rls-response-headers", false, "RLS: add RateLimit-Limit, -Remaining and -Reset to ShouldRateLimit answers (ratelimit's LIMIT_RESPONSE_HEADERS_ENABLED)")
	f.BoolVar(&o.rlsExtras, "rls-extras", true, "RLS: flashgate's additions to ratelimit's answer besides --ratelimit-headers: an OVER_LIMIT's retry-after, content-type and problem+json raw_body, a shadow admission's x-ratelimit-shadow (false: ratelimit's fields only)")
	f.StringVar(&o.rlsNames, "rls-header-names", "", "RLS: the three response header names, LIMIT,REMAINING,RESET (ratelimit's LIMIT_LIMIT_HEADER, LIMIT_REMAINING_HEADER, LIMIT_RESET_HEADER); default RateLimit-Limit,RateLimit-Remaining,RateLimit-Reset")
	f.StringVar(&o.rlsHTTP, "rls-http-addr", "", "listen address of ratelimit's HTTP side: GET /healthcheck (200 while serving) and POST /json (ShouldRateLimit as JSON); needs --rls-config (empty: none)")
	f.IntVar(&o.rlsHTTPMaxConns, "rls-http-max-conns", defaultRLSHTTPMaxConns, "connections --rls-http-addr keeps open at most; at the cap a new one closes the one idle the longest")
	o.rlsXDSOptions.addFlags(f)
	f.StringVar(&o.httpAuthzAddr, "http-authz-addr", "", "listen address of the HTTP front-end, where every request is a check (Envoy ext_authz http_service, nginx auth_request, Caddy forward_auth, Traefik ForwardAuth): 200 allowed, the denial's status (429) otherwise (empty: none)")
	f.StringVar(&o.httpAuthzPathPrefix, "http-authz-path-prefix", "", "the HTTP front-end: Envoy http_service's path_prefix, removed from the path of a check that carries no X-Original-URI or X-Forwarded-Uri")
	f.IntVar(&o.httpAuthzMaxConns, "http-authz-max-conns", defaultHTTPAuthzMaxConns, "connections --http-authz-addr keeps open at most; at the cap a new one closes the one idle the longest")
	f.DurationVar(&o.warmupTimeout, "warmup-timeout", defaultWarmupTimeout, "redis: how long health may stay NOT_SERVING while Redis cannot be warmed up (down, or refusing writes); then serve anyway, by the failure mode, and keep warming in the background (0: wait for Redis however long)")
	f.IntVar(&o.httpMaxConns, "http-max-conns", defaultHTTPMaxConns, "connections --http-addr keeps open at most; at the cap a new one closes the one idle the longest")
	f.IntVar(&o.grpcMaxConns, "grpc-max-conns", defaultGRPCMaxConns, "connections --grpc-addr keeps open at most; at the cap a new one is closed at once; connections still in their handshake count against --grpc-max-pending instead")
	f.IntVar(&o.grpcMaxPending, "grpc-max-pending", defaultGRPCMaxPending, "connections --grpc-addr keeps open at most before their handshake (TLS, HTTP/2 preface) is done, apart from --grpc-max-conns; at the cap a new one closes the one pending the longest")
	f.StringVar(&o.grpcTLSCert, "grpc-tls-cert", "", "PEM certificate chain of --grpc-addr: serve TLS only, with --grpc-tls-key (both reloaded when they change, Secret symlink swaps too)")
	f.StringVar(&o.grpcTLSKey, "grpc-tls-key", "", "PEM private key of --grpc-tls-cert")
	f.StringVar(&o.grpcTLSClientCA, "grpc-tls-client-ca", "", "PEM CA bundle: mTLS on --grpc-addr, every client must present a certificate signed by one of these CAs (reloaded when it changes)")
	f.DurationVar(&o.drainTimeout, "drain-timeout", 10*time.Second, "on SIGTERM: how long in-flight checks may take before the server stops")
	f.BoolVar(&o.pprof, "pprof", false, "serve /debug/pprof/ on --http-addr (profiling; keep --http-addr private)")
	f.StringVar(&o.logLevel, "log-level", "info", "debug, info, warn or error")
	f.StringVar(&o.logFormat, "log-format", "json", "json or text")
}

// Defaults of --warmup-timeout, --http-max-conns, --grpc-max-conns,
// --grpc-max-pending, --http-authz-max-conns and --rls-http-max-conns. The
// HTTP listener serves probes and scrapers, a few connections; the gRPC
// listener a few per Envoy worker thread, of which a reconnecting fleet
// has a handshake in progress for milliseconds each; the HTTP front-end a
// proxy's pool of keep-alive connections; ratelimit's HTTP side probes
// and /json clients. All together stay below a 4096 open-file limit.
const (
	defaultWarmupTimeout     = 30 * time.Second
	defaultHTTPMaxConns      = 128
	defaultGRPCMaxConns      = 1024
	defaultGRPCMaxPending    = 256
	defaultHTTPAuthzMaxConns = 1024
	defaultRLSHTTPMaxConns   = 1024
)

// defaultCheckDeadline is --check-deadline's default: below the shipped
// Envoy configs' ext_authz timeout of 50ms, with room for the answer.
const defaultCheckDeadline = 40 * time.Millisecond

// minLocalCacheSize is the smallest --local-cache-size (guard.Guard's
// minimum budget, package window/guard).
const minLocalCacheSize = 64 << 10

// serveConfig is serve's flags parsed, defaulted and validated once.
type serveConfig struct {
	serveOptions
	clock         redisstore.Clock
	failureMode   enforce.FailureMode
	headers       enforce.Families
	redisModeName string
	ban           window.Ban
	keys          window.Keys
	// budgetMax is the most one Redis call is given: 90% of
	// --check-deadline, and never less than --redis-timeout.
	budgetMax time.Duration
	// deadlineRaised: --check-deadline was left at its default and raised to
	// fit a larger --redis-timeout.
	deadlineRaised bool
	rlsHeaderNames rls.HeaderNames
}

// daemonOptions are the daemon's options of c, logging to h.
func (c *serveConfig) daemonOptions(h slog.Handler) daemon.Options {
	redis := c.clientConfig(c.budgetMax)
	redis.PoolSize = c.redisPoolSize
	return daemon.Options{
		Config: c.config, GRPCAddr: c.grpcAddr, HTTPAddr: c.httpAddr,
		GRPCMaxConns: c.grpcMaxConns, GRPCMaxPending: c.grpcMaxPending, HTTPMaxConns: c.httpMaxConns,
		GRPCTLS:      daemon.TLSFiles{Cert: c.grpcTLSCert, Key: c.grpcTLSKey, CA: c.grpcTLSClientCA},
		DrainTimeout: c.drainTimeout, Pprof: c.pprof,
		Backend: c.backend, Redis: redis, RedisTimeout: c.redisTimeout, RedisMode: c.redisModeName,
		RedisAutoPipeline: c.redisAutoPipe, RedisBatchWindow: c.redisWindow, Clock: c.clock, Keys: c.keys,
		BreakerFailures: c.breakerFailures, BreakerRate: c.breakerRate, BreakerMinCalls: c.breakerMinCalls,
		BreakerCooldown: c.breakerCooldown, FleetSize: c.fleetSize, FleetTTL: c.fleetTTL,
		WarmupTimeout: c.warmupTimeout, CheckDeadline: c.checkDeadline, DeadlineRaised: c.deadlineRaised,
		FailureMode: c.failureMode, Shadow: c.shadow, Headers: c.headers, Ban: c.ban,
		LocalCacheSize: int64(c.localCacheSize), MemoryMaxKeys: c.memoryMaxKeys,
		RLSConfig: c.rlsConfig, RLSResponseHeaders: c.rlsHeaders, RLSHeaderNames: c.rlsHeaderNames,
		RLSOmitExtras: !c.rlsExtras, RLSHTTPAddr: c.rlsHTTP, RLSHTTPMaxConns: c.rlsHTTPMaxConns,
		XDS:           c.rlsXDSOptions.options(),
		HTTPAuthzAddr: c.httpAuthzAddr, HTTPAuthzPathPrefix: c.httpAuthzPathPrefix, HTTPAuthzMaxConns: c.httpAuthzMaxConns,
		LogHandler: h,
	}
}

// rlsOnly reports whether serve is a ratelimit service only: the RLS
// without a descriptors file. ext_authz is then not served (a Check
// answers UNIMPLEMENTED), rather than enforce the built-in example.
func (o *serveOptions) rlsOnly() bool {
	return o.config == "" && (o.rlsConfig != "" || o.rlsXDSServer != "")
}

// parse validates the flags together and resolves them. changed reports
// whether a flag was set (on the command line or in the environment).
func (o *serveOptions) parse(changed func(string) bool) (*serveConfig, error) {
	c := &serveConfig{serveOptions: *o}
	switch o.backend {
	case "memory":
		for _, name := range []string{"redis-addr", "redis-mode", "redis-master-name", "redis-username", "redis-password",
			"redis-db", "redis-tls", "redis-timeout", "redis-pool-size", "redis-autopipeline", "redis-batch-window", "clock",
			"check-deadline", "fleet-size", "fleet-ttl", "warmup-timeout"} {
			if changed(name) {
				return nil, fmt.Errorf("--%s is only for --backend redis (the backend is memory)", name)
			}
		}
	case "redis":
		if len(o.redisAddrs) == 0 {
			return nil, fmt.Errorf("--backend redis needs --redis-addr")
		}
		if o.redisTimeout <= 0 {
			return nil, fmt.Errorf("--redis-timeout %s: must be positive", o.redisTimeout)
		}
		if o.redisWindow < 0 || o.redisWindow > redisstore.MaxBatchWindow || o.redisWindow > o.redisTimeout/2 {
			return nil, fmt.Errorf("--redis-batch-window %s: want 0 to %s and at most half of --redis-timeout (%s)",
				o.redisWindow, redisstore.MaxBatchWindow, o.redisTimeout)
		}
		if o.redisWindow > 0 && !o.redisAutoPipe {
			return nil, fmt.Errorf("--redis-batch-window %s needs --redis-autopipeline", o.redisWindow)
		}
		clock, err := parseClock(o.clock)
		if err != nil {
			return nil, err
		}
		c.clock = clock
		c.redisModeName = o.modeName()
	default:
		return nil, fmt.Errorf("--backend %q: want memory or redis", o.backend)
	}
	if o.checkDeadline <= 0 {
		return nil, fmt.Errorf("--check-deadline %s: must be positive", o.checkDeadline)
	}
	if o.backend == "redis" && o.redisTimeout > o.checkDeadline*9/10 {
		if changed("check-deadline") {
			return nil, fmt.Errorf("--redis-timeout %s is above 90%% of --check-deadline %s: the budget would not fit the deadline", o.redisTimeout, o.checkDeadline)
		}
		// Only --redis-timeout was raised: the deadline follows it (serve
		// logs it; Envoy's ext_authz timeout must stay above).
		c.checkDeadline = (o.redisTimeout*10 + 8) / 9
		c.deadlineRaised = true
	}
	c.budgetMax = max(c.checkDeadline*9/10, o.redisTimeout)
	fm, err := enforce.ParseFailureMode(o.failureMode)
	if err != nil {
		return nil, fmt.Errorf("--failure-mode: %w", err)
	}
	c.failureMode = fm
	if c.headers, err = enforce.ParseFamilies(o.headers); err != nil {
		return nil, fmt.Errorf("--ratelimit-headers %q: want both, ietf, x or none", o.headers)
	}
	if c.ban, err = o.banOptions.parse(); err != nil {
		return nil, err
	}
	if c.keys, err = o.redisOptions.keys(); err != nil {
		return nil, err
	}
	if o.localCacheSize < minLocalCacheSize {
		return nil, fmt.Errorf("--local-cache-size %s: must be at least 64KiB (the local cache cannot be turned off; default 32MiB)", o.localCacheSize.String())
	}
	if o.memoryMaxKeys < 0 {
		return nil, fmt.Errorf("--memory-max-keys %d: must not be negative", o.memoryMaxKeys)
	}
	if o.breakerFailures == 0 {
		return nil, fmt.Errorf("--breaker-failures 0: want a positive count, or negative to disable the breaker")
	}
	if o.breakerRate <= 0 || o.breakerRate > 1 {
		return nil, fmt.Errorf("--breaker-failure-rate %g: want a share in (0, 1]", o.breakerRate)
	}
	if o.breakerMinCalls < 1 {
		return nil, fmt.Errorf("--breaker-min-calls %d: must be at least 1", o.breakerMinCalls)
	}
	if o.breakerCooldown <= 0 {
		return nil, fmt.Errorf("--breaker-cooldown %s: must be positive", o.breakerCooldown)
	}
	if o.fleetSize < 0 {
		return nil, fmt.Errorf("--fleet-size %d: must not be negative (0: discover)", o.fleetSize)
	}
	if o.fleetTTL < 30*time.Millisecond {
		return nil, fmt.Errorf("--fleet-ttl %s: must be at least 30ms", o.fleetTTL)
	}
	if o.warmupTimeout < 0 {
		return nil, fmt.Errorf("--warmup-timeout %s: must not be negative (0: wait for Redis however long)", o.warmupTimeout)
	}
	if o.httpMaxConns < 1 {
		return nil, fmt.Errorf("--http-max-conns %d: must be at least 1", o.httpMaxConns)
	}
	if o.grpcMaxConns < 1 {
		return nil, fmt.Errorf("--grpc-max-conns %d: must be at least 1", o.grpcMaxConns)
	}
	if o.grpcMaxPending < 1 {
		return nil, fmt.Errorf("--grpc-max-pending %d: must be at least 1", o.grpcMaxPending)
	}
	if o.rlsHTTPMaxConns < 1 {
		return nil, fmt.Errorf("--rls-http-max-conns %d: must be at least 1", o.rlsHTTPMaxConns)
	}
	if o.httpAuthzMaxConns < 1 {
		return nil, fmt.Errorf("--http-authz-max-conns %d: must be at least 1", o.httpAuthzMaxConns)
	}
	if c.httpAuthzPathPrefix, err = httpauthz.NormalizePrefix(o.httpAuthzPathPrefix); err != nil {
		return nil, fmt.Errorf("--http-authz-path-prefix %q: %w", o.httpAuthzPathPrefix, err)
	}
	if o.httpAuthzAddr == "" && (changed("http-authz-path-prefix") || changed("http-authz-max-conns")) {
		return nil, fmt.Errorf("--http-authz-path-prefix and --http-authz-max-conns need --http-authz-addr")
	}
	if o.drainTimeout <= 0 {
		return nil, fmt.Errorf("--drain-timeout %s: must be positive", o.drainTimeout)
	}
	if o.pprof && o.httpAddr == "" {
		return nil, fmt.Errorf("--pprof needs --http-addr")
	}
	if err := o.rlsXDSOptions.validate(o.rlsConfig, changed); err != nil {
		return nil, err
	}
	if o.rlsHeaders && o.rlsConfig == "" && o.rlsXDSServer == "" {
		return nil, fmt.Errorf("--rls-response-headers needs --rls-config or --rls-xds-server")
	}
	if changed("rls-extras") && o.rlsConfig == "" && o.rlsXDSServer == "" {
		return nil, fmt.Errorf("--rls-extras needs --rls-config or --rls-xds-server")
	}
	if o.rlsHTTP != "" && o.rlsConfig == "" && o.rlsXDSServer == "" {
		return nil, fmt.Errorf("--rls-http-addr needs --rls-config or --rls-xds-server")
	}
	if o.rlsHTTP == "" && changed("rls-http-max-conns") {
		return nil, fmt.Errorf("--rls-http-max-conns needs --rls-http-addr")
	}
	if o.httpAuthzAddr != "" && o.rlsOnly() {
		return nil, fmt.Errorf("--http-authz-addr needs --config when the RLS is served (--rls-config, --rls-xds-server): without it serve is an RLS only, with no ext_authz rules")
	}
	if o.rlsNames != "" && !o.rlsHeaders {
		return nil, fmt.Errorf("--rls-header-names needs --rls-response-headers")
	}
	if c.rlsHeaderNames, err = rls.ParseHeaderNames(o.rlsNames); err != nil {
		return nil, fmt.Errorf("--rls-header-names: %w", err)
	}
	if o.grpcAddr == "" {
		return nil, fmt.Errorf("--grpc-addr is empty")
	}
	if (o.grpcTLSCert == "") != (o.grpcTLSKey == "") {
		return nil, fmt.Errorf("--grpc-tls-cert and --grpc-tls-key go together: give both or neither")
	}
	if o.grpcTLSClientCA != "" && o.grpcTLSCert == "" {
		return nil, fmt.Errorf("--grpc-tls-client-ca needs --grpc-tls-cert and --grpc-tls-key")
	}
	return c, nil
}

// redisOptions are the flags that reach serve's Redis and name its keys,
// shared by serve and the operator commands (inspect, bans) so that both
// find the same keys.
type redisOptions struct {
	redisAddrs      []string
	redisMode       string
	redisMasterName string
	redisUsername   string
	redisPassword   string
	redisDB         int
	redisTLS        bool
	redisTimeout    time.Duration
	keyPrefix       string
}

// addFlags adds the flags to f, --redis-timeout defaulting to timeout.
func (o *redisOptions) addFlags(f *pflag.FlagSet, timeout time.Duration) {
	f.StringSliceVar(&o.redisAddrs, "redis-addr", nil, "Redis address(es) host:port, comma-separated: the server, the sentinels, or cluster seeds")
	f.StringVar(&o.redisMode, "redis-mode", "", "standalone, sentinel or cluster (default: sentinel with --redis-master-name, standalone for one address, else cluster)")
	f.StringVar(&o.redisMasterName, "redis-master-name", "", "Sentinel master name")
	f.StringVar(&o.redisUsername, "redis-username", "", "Redis ACL user name")
	f.StringVar(&o.redisPassword, "redis-password", "", "Redis password (prefer FLASHGATE_REDIS_PASSWORD)")
	f.IntVar(&o.redisDB, "redis-db", 0, "Redis database (standalone and sentinel)")
	f.BoolVar(&o.redisTLS, "redis-tls", false, "connect to Redis with TLS")
	f.DurationVar(&o.redisTimeout, "redis-timeout", timeout, "budget for one Redis round trip")
	f.StringVar(&o.keyPrefix, "key-prefix", "fg", "prefix of every Redis key")
}

// clientConfig is the Redis client of the flags, each round trip given
// timeout.
func (o *redisOptions) clientConfig(timeout time.Duration) redisstore.ClientConfig {
	return redisstore.ClientConfig{
		Addrs: o.redisAddrs, Mode: o.redisMode, MasterName: o.redisMasterName,
		Username: o.redisUsername, Password: o.redisPassword, DB: o.redisDB, TLS: o.redisTLS,
		Timeout: timeout,
	}
}

// keys returns the key builder of --key-prefix.
func (o *redisOptions) keys() (window.Keys, error) {
	k, err := window.NewKeys(o.keyPrefix)
	if err != nil {
		return window.Keys{}, fmt.Errorf("--key-prefix: %w", err)
	}
	return k, nil
}

// modeName is the Redis mode in use: --redis-mode, else what the other
// flags imply.
func (o *redisOptions) modeName() string {
	switch {
	case o.redisMode != "":
		return o.redisMode
	case o.redisMasterName != "":
		return redisstore.ModeSentinel
	case len(o.redisAddrs) == 1:
		return redisstore.ModeStandalone
	}
	return redisstore.ModeCluster
}

// banOptions are the server's penalty box (--ban-*), shared by serve and
// the bans command, which must know whether a rule's box is on: the box of
// the rules that ask for one (ban:), each field one the rule does not set.
// A rule that does not ask is never banned.
type banOptions struct {
	banThreshold int
	banWindow    time.Duration
	banDuration  time.Duration
}

func (o *banOptions) addFlags(f *pflag.FlagSet) {
	f.IntVar(&o.banThreshold, "ban-threshold", window.DefaultBan.Threshold, "penalty box of the rules that ask for one (ban:): denials of one key within --ban-window that ban it; a rule without ban: is never banned")
	f.DurationVar(&o.banWindow, "ban-window", window.DefaultBan.Window, "penalty box of the rules that ask for one (ban:): span in which --ban-threshold denials ban a key")
	f.DurationVar(&o.banDuration, "ban-duration", window.DefaultBan.Duration, "penalty box of the rules that ask for one (ban:): how long a banned key is refused, at most 8760h (0: none for a rule that sets no duration)")
}

// parse returns the box; each field is checked, a duration up to
// window.MaxBanDuration.
func (o *banOptions) parse() (window.Ban, error) {
	if o.banThreshold < 0 || o.banWindow < 0 || o.banDuration < 0 {
		return window.Ban{}, fmt.Errorf("--ban-threshold, --ban-window and --ban-duration must not be negative")
	}
	if o.banDuration > window.MaxBanDuration {
		return window.Ban{}, fmt.Errorf("--ban-duration %s is longer than the maximum of %s (one year)", o.banDuration, window.MaxBanDuration)
	}
	if o.banDuration > 0 && (o.banThreshold == 0 || o.banWindow == 0) {
		return window.Ban{}, fmt.Errorf("--ban-duration %s needs a positive --ban-threshold and --ban-window (or --ban-duration 0 to turn off the penalty box of the rules that set no duration)", o.banDuration)
	}
	return window.Ban{Threshold: o.banThreshold, Window: o.banWindow, Duration: o.banDuration}, nil
}

func parseClock(s string) (redisstore.Clock, error) {
	switch s {
	case "redis":
		return redisstore.ClockRedis, nil
	case "local":
		return redisstore.ClockLocal, nil
	}
	return 0, fmt.Errorf("--clock %q: want redis or local", s)
}

// newLogHandler returns the slog handler of --log-level and --log-format
// (the daemon limits its warnings and errors). Durations are written as
// strings ("250ms"), in JSON too.
func newLogHandler(w io.Writer, level, format string) (slog.Handler, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level %q: want debug, info, warn or error", level)
	}
	opts := &slog.HandlerOptions{Level: lv, ReplaceAttr: durationString}
	var h slog.Handler
	switch strings.ToLower(format) {
	case "json":
		h = slog.NewJSONHandler(w, opts)
	case "text":
		h = slog.NewTextHandler(w, opts)
	default:
		return nil, fmt.Errorf("--log-format %q: want json or text", format)
	}
	return h, nil
}

// durationString writes a time.Duration attribute as its string.
func durationString(_ []string, a slog.Attr) slog.Attr {
	if a.Value.Kind() == slog.KindDuration {
		return slog.String(a.Key, a.Value.Duration().String())
	}
	return a
}
