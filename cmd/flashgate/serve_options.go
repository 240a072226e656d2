package main

import (
	"fmt"
	"time"

	"github.com/flashgate/flashgate/daemon"
	"github.com/flashgate/flashgate/enforce"
	"github.com/flashgate/flashgate/rls"
	"github.com/flashgate/flashgate/rls/xds"
	"github.com/flashgate/flashgate/window"
	"github.com/flashgate/flashgate/window/fallback"
	"github.com/flashgate/flashgate/window/guard"
	"github.com/flashgate/flashgate/window/redisstore"
	"github.com/spf13/pflag"
)

// serveOptions are the flags of serve (docs/configuration.md's table), each
// also settable as FLASHGATE_<FLAG>: the daemon's options, and the flags
// whose text parse resolves into them.
type serveOptions struct {
	daemon.Options
	redisOptions
	banOptions
	redisPoolSize int
	clock         string
	failureMode   string
	headers       string
	rlsNames      string
	rlsExtras     bool
	logLevel      string
	logFormat     string
}

func (o *serveOptions) addFlags(f *pflag.FlagSet) {
	f.StringVar(&o.Config, "config", "", "descriptors file (default: the built-in example, logged as such; but with --rls-config or --rls-xds-server and no --config, serve is an RLS only and ext_authz is not served: Check answers UNIMPLEMENTED); reloaded on change and on SIGHUP")
	f.StringVar(&o.GRPCAddr, "grpc-addr", "127.0.0.1:9191", "listen address of ext_authz, grpc.health.v1 and reflection")
	f.StringVar(&o.HTTPAddr, "http-addr", "127.0.0.1:9192", "listen address of /metrics, /healthz and /readyz (empty: none)")
	f.StringVar(&o.Backend, "backend", "memory", "where the windows live: memory (embedded, single process) or redis")
	o.redisOptions.addFlags(f, redisstore.DefaultRedisTimeout)
	f.IntVar(&o.redisPoolSize, "redis-pool-size", 0, "Redis connections per node (0: 10 per CPU)")
	f.BoolVar(&o.RedisAutoPipeline, "redis-autopipeline", true, "checks arriving while a script call is in flight are decided together by the next one, one script call for the batch (a second call goes out when the one in flight stalls, or at once while the last call carried one check; after a batch of n ≥ 4 the next call waits for n checks or about 200 µs); on cluster one pipeline per master, a check's keys on one master in one call (Redis ≥ 7.0); --redis-autopipeline=false sends each check on its own round trip (on cluster one script per key)")
	f.DurationVar(&o.RedisBatchWindow, "redis-batch-window", 0, "with --redis-autopipeline, a check that finds its pipeline (on cluster: its master's) idle waits up to this long (or while a hold after a batch still runs), at most 5ms and half of --redis-timeout, for others to share its script call: latency for Redis CPU where each sidecar sends too few checks at a time to batch (0: it goes out at once)")
	f.StringVar(&o.clock, "clock", "redis", "time source of the windows: redis (TIME in the script) or local")
	f.StringVar(&o.failureMode, "failure-mode", "local", "when Redis fails: local (enforce per process in memory), allow or deny")
	o.banOptions.addFlags(f)
	o.LocalCacheSize = guard.DefaultGuardBudget
	f.Var((*daemon.ByteSize)(&o.LocalCacheSize), "local-cache-size", "memory budget of the local over-limit cache and penalty box (e.g. 32MiB)")
	f.IntVar(&o.MemoryMaxKeys, "memory-max-keys", 0, "keys the memory backend (and the local failure mode) track at most (0: the window package's default)")
	f.BoolVar(&o.Shadow, "shadow", false, "decide and count, but admit everything (x-ratelimit-shadow: 1 on would-be denials)")
	f.StringVar(&o.headers, "ratelimit-headers", enforce.FamiliesBoth.String(), "rate-limit headers on every answer (ext_authz, RLS): both (the IETF RateLimit and RateLimit-Policy, and x-ratelimit-limit, -remaining, -reset), ietf, x or none; an ext_authz 429 always has retry-after and its problem+json body (the RLS's: see --rls-extras)")
	f.IntVar(&o.BreakerFailures, "breaker-failures", guard.DefaultBreakerConnFailures, "connection errors in a row (Redis refused or reset: down, not slow) that open the circuit breaker at once; negative: no breaker")
	f.Float64Var(&o.BreakerRate, "breaker-failure-rate", guard.DefaultBreakerFailureRate, "share of failed Redis calls (errors and timeouts) within a second that opens the circuit breaker")
	f.IntVar(&o.BreakerMinCalls, "breaker-min-calls", guard.DefaultBreakerMinCalls, "calls within a second before --breaker-failure-rate can open the breaker")
	f.DurationVar(&o.BreakerCooldown, "breaker-cooldown", guard.DefaultBreakerCooldown, "how long an open breaker holds Redis calls off before one probe")
	f.DurationVar(&o.CheckDeadline, "check-deadline", daemon.DefaultCheckDeadline, "the most a check may wait for Redis in all, below Envoy's ext_authz timeout (the shipped envoy.yaml: 50ms); the Redis budget follows Redis's latency from --redis-timeout up to 90% of this")
	f.IntVar(&o.FleetSize, "fleet-size", 0, "sidecars sharing the Redis, for failure mode local's per-sidecar share ceil(limit/N) (0: discover them by heartbeat)")
	f.DurationVar(&o.FleetTTL, "fleet-ttl", fallback.DefaultFleetTTL, "how long a sidecar's heartbeat counts it in the fleet (beats every third of it)")
	f.StringVar(&o.RLSConfig, "rls-config", "", "envoyproxy/ratelimit config directory (DIR/config/*.yaml, else DIR/*.yaml): serve envoy.service.ratelimit.v3.RateLimitService on --grpc-addr, beside ext_authz with --config, alone without it (no built-in example rules); reloaded on change and on SIGHUP")
	f.BoolVar(&o.RLSResponseHeaders, "rls-response-headers", false, "RLS: add RateLimit-Limit, -Remaining and -Reset to ShouldRateLimit answers (ratelimit's LIMIT_RESPONSE_HEADERS_ENABLED)")
	f.BoolVar(&o.rlsExtras, "rls-extras", true, "RLS: flashgate's additions to ratelimit's answer besides --ratelimit-headers: an OVER_LIMIT's retry-after, content-type and problem+json raw_body, a shadow admission's x-ratelimit-shadow (false: ratelimit's fields only)")
	f.StringVar(&o.rlsNames, "rls-header-names", "", "RLS: the three response header names, LIMIT,REMAINING,RESET (ratelimit's LIMIT_LIMIT_HEADER, LIMIT_REMAINING_HEADER, LIMIT_RESET_HEADER); default RateLimit-Limit,RateLimit-Remaining,RateLimit-Reset")
	f.StringVar(&o.RLSHTTPAddr, "rls-http-addr", "", "listen address of ratelimit's HTTP side: GET /healthcheck (200 while serving) and POST /json (ShouldRateLimit as JSON); needs --rls-config (empty: none)")
	f.IntVar(&o.RLSHTTPMaxConns, "rls-http-max-conns", daemon.DefaultRLSHTTPMaxConns, "connections --rls-http-addr keeps open at most; at the cap a new one closes the one idle the longest")
	addXDSFlags(f, &o.XDS)
	f.StringVar(&o.HTTPAuthzAddr, "http-authz-addr", "", "listen address of the HTTP front-end, where every request is a check (Envoy ext_authz http_service, nginx auth_request, Caddy forward_auth, Traefik ForwardAuth): 200 allowed, the denial's status (429) otherwise (empty: none)")
	f.StringVar(&o.HTTPAuthzPathPrefix, "http-authz-path-prefix", "", "the HTTP front-end: Envoy http_service's path_prefix, removed from the path of a check that carries no X-Original-URI or X-Forwarded-Uri")
	f.IntVar(&o.HTTPAuthzMaxConns, "http-authz-max-conns", daemon.DefaultHTTPAuthzMaxConns, "connections --http-authz-addr keeps open at most; at the cap a new one closes the one idle the longest")
	f.DurationVar(&o.WarmupTimeout, "warmup-timeout", daemon.DefaultWarmupTimeout, "redis: how long health may stay NOT_SERVING while Redis cannot be warmed up (down, or refusing writes); then serve anyway, by the failure mode, and keep warming in the background (0: wait for Redis however long)")
	f.IntVar(&o.HTTPMaxConns, "http-max-conns", daemon.DefaultHTTPMaxConns, "connections --http-addr keeps open at most; at the cap a new one closes the one idle the longest")
	f.IntVar(&o.GRPCMaxConns, "grpc-max-conns", daemon.DefaultGRPCMaxConns, "connections --grpc-addr keeps open at most; at the cap a new one is closed at once; connections still in their handshake count against --grpc-max-pending instead")
	f.IntVar(&o.GRPCMaxPending, "grpc-max-pending", daemon.DefaultGRPCMaxPending, "connections --grpc-addr keeps open at most before their handshake (TLS, HTTP/2 preface) is done, apart from --grpc-max-conns; at the cap a new one closes the one pending the longest")
	f.StringVar(&o.GRPCTLS.Cert, "grpc-tls-cert", "", "PEM certificate chain of --grpc-addr: serve TLS only, with --grpc-tls-key (both reloaded when they change, Secret symlink swaps too)")
	f.StringVar(&o.GRPCTLS.Key, "grpc-tls-key", "", "PEM private key of --grpc-tls-cert")
	f.StringVar(&o.GRPCTLS.CA, "grpc-tls-client-ca", "", "PEM CA bundle: mTLS on --grpc-addr, every client must present a certificate signed by one of these CAs (reloaded when it changes)")
	f.DurationVar(&o.DrainTimeout, "drain-timeout", 10*time.Second, "on SIGTERM: how long in-flight checks may take before the server stops")
	f.BoolVar(&o.Pprof, "pprof", false, "serve /debug/pprof/ on --http-addr (profiling; keep --http-addr private)")
	f.StringVar(&o.logLevel, "log-level", "info", "debug, info, warn or error")
	f.StringVar(&o.logFormat, "log-format", "json", "json or text")
}

// serveConfig is serve's flags parsed and validated: the daemon's options
// and the log's.
type serveConfig struct {
	daemon.Options
	logLevel, logFormat string
}

// parse resolves the flags' text into the daemon's options and validates
// them together. changed reports whether a flag was set (on the command
// line or in the environment).
func (o *serveOptions) parse(changed func(string) bool) (*serveConfig, error) {
	d := o.Options
	d.Redis, d.RedisTimeout = o.clientConfig(0), o.redisTimeout
	d.Redis.PoolSize = o.redisPoolSize
	d.RLSOmitExtras = !o.rlsExtras
	var err error
	if d.Backend == daemon.BackendRedis {
		if d.Clock, err = parseClock(o.clock); err != nil {
			return nil, err
		}
	}
	if d.FailureMode, err = enforce.ParseFailureMode(o.failureMode); err != nil {
		return nil, fmt.Errorf("--failure-mode: %w", err)
	}
	if d.Headers, err = enforce.ParseFamilies(o.headers); err != nil {
		return nil, fmt.Errorf("--ratelimit-headers %q: want both, ietf, x or none", o.headers)
	}
	d.Ban = o.ban()
	if d.Keys, err = o.keys(); err != nil {
		return nil, err
	}
	if err := d.Validate(changed); err != nil {
		return nil, err
	}
	if o.rlsNames != "" && !d.RLSResponseHeaders {
		return nil, fmt.Errorf("--rls-header-names needs --rls-response-headers")
	}
	if d.RLSHeaderNames, err = rls.ParseHeaderNames(o.rlsNames); err != nil {
		return nil, fmt.Errorf("--rls-header-names: %w", err)
	}
	return &serveConfig{Options: d, logLevel: o.logLevel, logFormat: o.logFormat}, nil
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

// banOptions are serve's penalty box (--ban-*), which completes the one a
// rule asks for; the bans command needs it too.
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

// ban is the box of the flags.
func (o *banOptions) ban() window.Ban {
	return window.Ban{Threshold: o.banThreshold, Window: o.banWindow, Duration: o.banDuration}
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

// addXDSFlags adds serve's flags of the RLS config from an xDS management
// server (ratelimit's CONFIG_TYPE=GRPC_XDS_SOTW and CONFIG_GRPC_XDS_*) to f,
// set into o.
func addXDSFlags(f *pflag.FlagSet, o *daemon.XDSOptions) {
	f.StringVar(&o.Server, "rls-xds-server", "", "xDS management server, HOST:PORT: serve envoy.service.ratelimit.v3.RateLimitService on --grpc-addr with the ratelimit configs (RateLimitConfig resources, state of the world) it pushes (ratelimit's CONFIG_GRPC_XDS_SERVER_URL); not with --rls-config")
	f.StringVar(&o.NodeID, "rls-xds-node-id", xds.DefaultNodeID, "xDS node id (ratelimit's CONFIG_GRPC_XDS_NODE_ID)")
	f.StringVar(&o.NodeMetadata, "rls-xds-node-metadata", "", "xDS node metadata, KEY=VALUE,... (ratelimit's CONFIG_GRPC_XDS_NODE_METADATA)")
	f.DurationVar(&o.RetryInterval, "rls-xds-retry-interval", xds.DefaultRetryInterval, "pause before a new xDS stream after one failed (ratelimit's CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL)")
	f.BoolVar(&o.TLS, "rls-xds-tls", false, "connect to the xDS server over TLS (ratelimit's CONFIG_GRPC_XDS_SERVER_USE_TLS)")
	f.StringVar(&o.Files.Cert, "rls-xds-tls-cert", "", "client certificate (PEM) for an mTLS xDS server (ratelimit's CONFIG_GRPC_XDS_CLIENT_TLS_CERT)")
	f.StringVar(&o.Files.Key, "rls-xds-tls-key", "", "key (PEM) of --rls-xds-tls-cert (ratelimit's CONFIG_GRPC_XDS_CLIENT_TLS_KEY)")
	f.StringVar(&o.Files.CA, "rls-xds-tls-ca", "", "CA certificates (PEM) the xDS server's certificate is verified against (default: the system's; ratelimit's CONFIG_GRPC_XDS_SERVER_TLS_CACERT)")
	f.StringVar(&o.ServerName, "rls-xds-tls-server-name", "", "name the xDS server's certificate is verified for (default: the host of --rls-xds-server; ratelimit's CONFIG_GRPC_XDS_SERVER_TLS_SAN)")
	f.BoolVar(&o.ForceStart, "rls-xds-force-start", false, "turn ready before the xDS server pushed a first config (answering OK for every domain until then); by default readiness waits for it (ratelimit's FORCE_START_WITHOUT_INITIAL_CONFIG)")
}
