package main

// Running as envoyproxy/ratelimit: when the binary is called "ratelimit"
// (Envoy Gateway's Deployment runs /bin/ratelimit) or with the ratelimit
// command, serve is configured by ratelimit's environment variables
// (its src/settings/settings.go). ratelimitVars is the whole mapping, one
// row per variable and serve flag: docs/ratelimit.md's table is checked against
// it. A variable that is set but not honoured (no flag for it, or a flag
// this build lacks, or a value flashgate cannot follow) is logged once at
// start, in one line that names each with its reason. Precedence: command
// line, then FLASHGATE_<FLAG>, then ratelimit's variable, then ratelimit's
// default where the table gives one, then serve's.

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/flashgate/flashgate/rls"
	"github.com/flashgate/flashgate/window"
	"github.com/flashgate/flashgate/window/redisstore"
)

// ratelimitName is the program name (argv[0]'s base) that runs the
// ratelimit command, and the command's name.
const ratelimitName = "ratelimit"

// programArgs returns the command line of the process whose argv is argv:
// argv[1:], after "ratelimit" when the program is called ratelimit.
func programArgs(argv []string) []string {
	if len(argv) == 0 {
		return nil
	}
	if filepath.Base(argv[0]) == ratelimitName {
		return append([]string{ratelimitName}, argv[1:]...)
	}
	return argv[1:]
}

// ratelimitVar is one row of the mapping: ratelimit's variable name and the
// serve flag it sets.
type ratelimitVar struct {
	// name is ratelimit's variable; a trailing "*" stands for every
	// variable with that prefix.
	name string
	// def is ratelimit's default, applied when the variable is unset and
	// serve's default differs; "" leaves serve's default.
	def string
	// flag is the serve flag the row sets; "" when none (see value).
	flag string
	// note says how the value maps to the flag, or why the variable is not
	// honoured (docs/ratelimit.md's table and the start-up log).
	note string
	// value returns the flag's value from the variable's v and, through
	// get, the others' (defaults applied); set false leaves the flag. An
	// error wrapping errNotHonoured is logged, any other ends the start.
	// nil: v as it is. A row without flag and value is never honoured.
	value func(v string, get func(string) string) (string, bool, error)
}

// errNotHonoured marks a value flashgate cannot follow: logged, not fatal.
var errNotHonoured = errors.New("not honoured")

func notHonoured(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{errNotHonoured}, args...)...)
}

// ratelimitVars is the mapping of ratelimit's settings to serve's flags.
var ratelimitVars = []ratelimitVar{
	// Listeners.
	{name: "HOST", def: "0.0.0.0", flag: "rls-http-addr", note: "HOST:PORT: GET /healthcheck and POST /json", value: hostPort("HOST", "PORT")},
	{name: "PORT", def: "8080", flag: "rls-http-addr", note: "HOST:PORT", value: hostPort("HOST", "PORT")},
	{name: "DEBUG_HOST", def: "0.0.0.0", flag: "http-addr", note: "DEBUG_HOST:DEBUG_PORT: /metrics (Prometheus), /healthz, /readyz", value: hostPort("DEBUG_HOST", "DEBUG_PORT")},
	{name: "DEBUG_PORT", def: "6070", flag: "http-addr", note: "DEBUG_HOST:DEBUG_PORT", value: hostPort("DEBUG_HOST", "DEBUG_PORT")},
	{name: "GRPC_HOST", def: "0.0.0.0", flag: "grpc-addr", note: "GRPC_HOST:GRPC_PORT: RateLimitService, grpc.health.v1 (ext_authz with FLASHGATE_CONFIG)", value: grpcAddr},
	{name: "GRPC_PORT", def: "8081", flag: "grpc-addr", note: "GRPC_HOST:GRPC_PORT", value: grpcAddr},
	{name: "GRPC_UDS", flag: "grpc-addr", note: "unix://GRPC_UDS, in place of GRPC_HOST:GRPC_PORT", value: grpcAddr},
	{name: "PROTO", def: "tcp", note: "tcp only", value: only("tcp", "flashgate listens on TCP (or GRPC_UDS)")},
	{name: "GRPC_MAX_CONNECTION_AGE", note: "connections are kept; --grpc-max-conns caps them"},
	{name: "GRPC_MAX_CONNECTION_AGE_GRACE", note: "connections are kept; --grpc-max-conns caps them"},

	// gRPC server TLS.
	{name: "GRPC_SERVER_USE_TLS", flag: "grpc-tls-cert", note: "true: GRPC_SERVER_TLS_CERT is served", value: whenTLS("GRPC_SERVER_TLS_CERT")},
	{name: "GRPC_SERVER_TLS_CERT", flag: "grpc-tls-cert", note: "with GRPC_SERVER_USE_TLS=true; reloaded on change", value: whenTLS("GRPC_SERVER_TLS_CERT")},
	{name: "GRPC_SERVER_TLS_KEY", flag: "grpc-tls-key", note: "with GRPC_SERVER_USE_TLS=true; reloaded on change", value: whenTLS("GRPC_SERVER_TLS_KEY")},
	{name: "GRPC_CLIENT_TLS_CACERT", flag: "grpc-tls-client-ca", note: "with GRPC_SERVER_USE_TLS=true: clients must present a certificate of this CA; reloaded on change", value: whenTLS("GRPC_CLIENT_TLS_CACERT")},
	{name: "GRPC_SERVER_TLS_CA_CERT", flag: "grpc-tls-client-ca", note: "Envoy Gateway's name for GRPC_CLIENT_TLS_CACERT", value: whenTLS("GRPC_SERVER_TLS_CA_CERT")},
	{name: "GRPC_CLIENT_TLS_SAN", note: "any client certificate of the CA is accepted"},

	// Logging.
	{name: "LOG_LEVEL", def: "warn", flag: "log-level", note: "trace → debug, warning → warn, fatal and panic → error", value: logLevel},
	{name: "LOG_FORMAT", def: "text", flag: "log-format", note: "text or json"},

	// Where the config comes from.
	{name: "CONFIG_TYPE", def: "FILE", flag: "rls-xds-server", note: "FILE: RUNTIME_ROOT's files; GRPC_XDS_SOTW: CONFIG_GRPC_XDS_SERVER_URL", value: xdsServer},
	{name: "RUNTIME_ROOT", def: "/srv/runtime_data/current", flag: "rls-config", note: "RUNTIME_ROOT/RUNTIME_SUBDIRECTORY[/RUNTIME_APPDIRECTORY], with CONFIG_TYPE=FILE; watched and reloaded", value: runtimeDir},
	{name: "RUNTIME_SUBDIRECTORY", flag: "rls-config", note: "see RUNTIME_ROOT", value: runtimeDir},
	{name: "RUNTIME_APPDIRECTORY", def: "config", flag: "rls-config", note: "see RUNTIME_ROOT", value: runtimeDir},
	{name: "RUNTIME_IGNOREDOTFILES", note: "true only: files whose name starts with a dot are always skipped", value: only("true", "dot files are always skipped")},
	{name: "RUNTIME_WATCH_ROOT", note: "either: the directory and its symlinks are always watched", value: isBool},
	{name: "MERGE_DOMAIN_CONFIG", note: "false only: a domain is one file", value: only("false", "a domain in two files is an error")},
	{name: "HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", note: "health turns SERVING once the config is loaded and Redis is warm"},

	// xDS.
	{name: "CONFIG_GRPC_XDS_SERVER_URL", def: "localhost:18000", flag: "rls-xds-server", note: "with CONFIG_TYPE=GRPC_XDS_SOTW", value: xdsServer},
	{name: "CONFIG_GRPC_XDS_NODE_ID", def: "default", flag: "rls-xds-node-id", note: "with CONFIG_TYPE=GRPC_XDS_SOTW", value: whenXDS},
	{name: "CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL", def: "3s", flag: "rls-xds-retry-interval", note: "with CONFIG_TYPE=GRPC_XDS_SOTW", value: whenXDS},
	{name: "CONFIG_GRPC_XDS_SERVER_USE_TLS", flag: "rls-xds-tls", note: "with CONFIG_TYPE=GRPC_XDS_SOTW", value: whenXDS},
	{name: "CONFIG_GRPC_XDS_CLIENT_TLS_CERT", flag: "rls-xds-tls-cert", note: "with CONFIG_TYPE=GRPC_XDS_SOTW; reloaded on change", value: whenXDS},
	{name: "CONFIG_GRPC_XDS_CLIENT_TLS_KEY", flag: "rls-xds-tls-key", note: "with CONFIG_TYPE=GRPC_XDS_SOTW; reloaded on change", value: whenXDS},
	{name: "CONFIG_GRPC_XDS_SERVER_TLS_CACERT", flag: "rls-xds-tls-ca", note: "with CONFIG_TYPE=GRPC_XDS_SOTW; reloaded on change", value: whenXDS},
	{name: "CONFIG_GRPC_XDS_SERVER_TLS_SAN", flag: "rls-xds-tls-server-name", note: "with CONFIG_TYPE=GRPC_XDS_SOTW: the name the xDS server's certificate is verified for (default: the host of CONFIG_GRPC_XDS_SERVER_URL)", value: whenXDS},
	{name: "FORCE_START_WITHOUT_INITIAL_CONFIG", flag: "rls-xds-force-start", note: "with CONFIG_TYPE=GRPC_XDS_SOTW", value: whenXDS},
	{name: "CONFIG_GRPC_XDS_NODE_METADATA", flag: "rls-xds-node-metadata", note: "with CONFIG_TYPE=GRPC_XDS_SOTW: k1=v1,k2=v2 as string fields", value: whenXDS},
	{name: "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", note: "no headers are added to the xDS stream"},
	{name: "XDS_CLIENT_BACKOFF_*", note: "retries wait CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL"},

	// Redis.
	{name: "BACKEND_TYPE", def: "redis", flag: "backend", note: "redis only", value: backendType},
	{name: "REDIS_SOCKET_TYPE", def: "unix", flag: "redis-addr", note: "tcp only", value: redisAddr},
	{name: "REDIS_URL", def: "/var/run/nutcracker/ratelimit.sock", flag: "redis-addr", note: "host:port; cluster: comma-separated seeds; sentinel: MASTER,host:port,...", value: redisAddr},
	{name: "REDIS_URL", flag: "redis-master-name", note: "sentinel: its first element", value: redisMasterName},
	{name: "REDIS_TYPE", def: "single", flag: "redis-mode", note: "single → standalone, sentinel, cluster", value: redisMode},
	{name: "REDIS_AUTH", flag: "redis-password", note: "PASSWORD or USER:PASSWORD", value: redisAuth(1)},
	{name: "REDIS_AUTH", flag: "redis-username", note: "USER of USER:PASSWORD", value: redisAuth(0)},
	{name: "REDIS_TLS", flag: "redis-tls", note: "the system's roots verify Redis"},
	{name: "REDIS_POOL_SIZE", flag: "redis-pool-size", note: "connections per node"},
	{name: "REDIS_TLS_CLIENT_CERT", note: "no client certificate is sent to Redis"},
	{name: "REDIS_TLS_CLIENT_KEY", note: "no client certificate is sent to Redis"},
	{name: "REDIS_TLS_CACERT", note: "the system's roots verify Redis"},
	{name: "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", note: "Redis's host name is always verified"},
	{name: "REDIS_PIPELINE_WINDOW", flag: "redis-batch-window", note: "a check that finds Redis idle waits up to this long (at most 5ms) for others to share its script call; checks in flight are batched by --redis-autopipeline either way", value: pipelineWindow},
	{name: "REDIS_PIPELINE_LIMIT", note: "a batch window ends early at 128 checks, the most one script call takes"},
	{name: "REDIS_PERSECOND*", note: "one Redis holds every window"},
	{name: "REDIS_HEALTH_CHECK_ACTIVE_CONNECTION", note: "health follows Redis's warm-up; then Redis failures take --failure-mode"},
	{name: "MEMCACHE_*", note: "Redis only"},

	// Limits and answers.
	{name: "CACHE_KEY_PREFIX", flag: "key-prefix", note: "prefix of every Redis key, A-Z a-z 0-9 . _ - (a trailing : is dropped: flashgate adds its own separator; empty: serve's fg)", value: keyPrefix},
	{name: "LOCAL_CACHE_SIZE_IN_BYTES", flag: "local-cache-size", note: "bytes of the local over-limit cache, 64KiB at least; 0 keeps the default (it cannot be turned off)", value: localCacheSize},
	{name: "SHADOW_MODE", flag: "shadow", note: "decide and count, but answer OK"},
	{name: "LIMIT_RESPONSE_HEADERS_ENABLED", flag: "rls-response-headers", note: "RateLimit-Limit, -Remaining and -Reset on answers"},
	{name: "LIMIT_LIMIT_HEADER", flag: "rls-header-names", note: "with LIMIT_RESPONSE_HEADERS_ENABLED=true", value: headerNames},
	{name: "LIMIT_REMAINING_HEADER", flag: "rls-header-names", note: "with LIMIT_RESPONSE_HEADERS_ENABLED=true", value: headerNames},
	{name: "LIMIT_RESET_HEADER", flag: "rls-header-names", note: "with LIMIT_RESPONSE_HEADERS_ENABLED=true", value: headerNames},
	{name: "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", note: "true only: a refused request is counted in no window (all or nothing)", value: only("true", "a refused request is counted in no window (all or nothing)")},
	{name: "NEAR_LIMIT_RATIO", note: "no near-limit count"},
	{name: "EXPIRATION_JITTER_MAX_SECONDS", note: "a key expires one window after its last admission"},

	// Stats: Prometheus on DEBUG_PORT, no statsd.
	{name: "USE_STATSD", note: statsNote},
	{name: "STATSD_HOST", note: statsNote},
	{name: "STATSD_PORT", note: statsNote},
	{name: "USE_DOG_STATSD*", note: statsNote},
	{name: "EXTRA_TAGS", note: statsNote},
	{name: "STATS_FLUSH_INTERVAL", note: statsNote},
	{name: "DISABLE_STATS", note: statsNote},
	{name: "USE_PROMETHEUS", note: statsNote},
	{name: "PROMETHEUS_*", note: statsNote},
	{name: "TRACING_*", note: "no tracing"},
}

// statsNote is why ratelimit's stats settings are not honoured.
const statsNote = "no statsd: Prometheus metrics on DEBUG_HOST:DEBUG_PORT /metrics (flashgate_rls_requests_total by domain, rule and decision)"

func hostPort(host, port string) func(string, func(string) string) (string, bool, error) {
	return func(_ string, get func(string) string) (string, bool, error) {
		p, err := strconv.ParseUint(get(port), 10, 16)
		if err != nil {
			return "", false, fmt.Errorf("%s=%q: not a port", port, get(port))
		}
		return net.JoinHostPort(get(host), strconv.FormatUint(p, 10)), true, nil
	}
}

func grpcAddr(_ string, get func(string) string) (string, bool, error) {
	if uds := get("GRPC_UDS"); uds != "" {
		return "unix://" + uds, true, nil
	}
	return hostPort("GRPC_HOST", "GRPC_PORT")("", get)
}

// only accepts want (any case) silently; another value is not honoured.
func only(want, why string) func(string, func(string) string) (string, bool, error) {
	return func(v string, _ func(string) string) (string, bool, error) {
		if strings.EqualFold(v, want) {
			return "", false, nil
		}
		return "", false, notHonoured("%s", why)
	}
}

func isBool(v string, _ func(string) string) (string, bool, error) {
	_, err := strconv.ParseBool(v)
	return "", false, err
}

// pipelineWindow takes ratelimit's REDIS_PIPELINE_WINDOW (a Go duration,
// 0: none) as --redis-batch-window; a window above flashgate's bound is not
// honoured, and checks then go out at once.
func pipelineWindow(v string, _ func(string) string) (string, bool, error) {
	d, err := time.ParseDuration(v)
	switch {
	case err != nil:
		return "", false, fmt.Errorf("REDIS_PIPELINE_WINDOW=%q: %w", v, err)
	case d <= 0:
		return "", false, nil
	case d > redisstore.MaxBatchWindow:
		return "", false, notHonoured("%s is above the largest batch window, %s: checks go out at once", d, redisstore.MaxBatchWindow)
	}
	return d.String(), true, nil
}

func nonEmpty(v string, _ func(string) string) (string, bool, error) { return v, v != "", nil }

// keyPrefix takes ratelimit's CACHE_KEY_PREFIX ("ratelimit:", say) as
// --key-prefix: without its trailing separator, which flashgate's keys add.
func keyPrefix(v string, _ func(string) string) (string, bool, error) {
	p := strings.TrimRight(v, ":")
	if p == "" {
		return "", false, nil
	}
	if _, err := window.NewKeys(p); err != nil {
		return "", false, fmt.Errorf("CACHE_KEY_PREFIX=%q: %w", v, err)
	}
	return p, true, nil
}

func isTrue(get func(string) string, name string) bool {
	b, _ := strconv.ParseBool(get(name))
	return b
}

// whenTLS sets the flag to name's value when GRPC_SERVER_USE_TLS is true.
func whenTLS(name string) func(string, func(string) string) (string, bool, error) {
	return func(_ string, get func(string) string) (string, bool, error) {
		if !isTrue(get, "GRPC_SERVER_USE_TLS") || get(name) == "" {
			return "", false, nil
		}
		return get(name), true, nil
	}
}

func xdsMode(get func(string) string) bool { return get("CONFIG_TYPE") == "GRPC_XDS_SOTW" }

func whenXDS(v string, get func(string) string) (string, bool, error) { return v, xdsMode(get), nil }

func xdsServer(_ string, get func(string) string) (string, bool, error) {
	switch get("CONFIG_TYPE") {
	case "FILE":
		return "", false, nil
	case "GRPC_XDS_SOTW":
		return get("CONFIG_GRPC_XDS_SERVER_URL"), true, nil
	}
	return "", false, fmt.Errorf("CONFIG_TYPE=%q: want FILE or GRPC_XDS_SOTW", get("CONFIG_TYPE"))
}

func runtimeDir(_ string, get func(string) string) (string, bool, error) {
	if xdsMode(get) {
		return "", false, nil
	}
	dir := filepath.Join(get("RUNTIME_ROOT"), get("RUNTIME_SUBDIRECTORY"))
	if app := get("RUNTIME_APPDIRECTORY"); app != "config" {
		// rls.LoadDir reads DIR/config itself; another name is named.
		dir = filepath.Join(dir, app)
	}
	return dir, true, nil
}

func logLevel(v string, _ func(string) string) (string, bool, error) {
	switch l := strings.ToLower(v); l {
	case "trace", "debug":
		return "debug", true, nil
	case "info":
		return "info", true, nil
	case "warn", "warning":
		return "warn", true, nil
	case "error", "fatal", "panic":
		return "error", true, nil
	}
	return "", false, fmt.Errorf("LOG_LEVEL=%q: want trace, debug, info, warn, error, fatal or panic", v)
}

func backendType(v string, _ func(string) string) (string, bool, error) {
	if strings.EqualFold(v, "redis") {
		return "redis", true, nil
	}
	return "", false, fmt.Errorf("BACKEND_TYPE=%q: flashgate's windows live in Redis", v)
}

// redisURLParts splits REDIS_URL; for sentinel the first element is the
// master's name.
func redisURLParts(get func(string) string) (master string, addrs []string) {
	parts := strings.Split(get("REDIS_URL"), ",")
	if strings.EqualFold(get("REDIS_TYPE"), "sentinel") && len(parts) > 1 {
		return parts[0], parts[1:]
	}
	return "", parts
}

func redisAddr(_ string, get func(string) string) (string, bool, error) {
	if !strings.EqualFold(get("REDIS_SOCKET_TYPE"), "tcp") {
		return "", false, fmt.Errorf("REDIS_SOCKET_TYPE=%q: flashgate reaches Redis over tcp (set REDIS_SOCKET_TYPE=tcp and REDIS_URL=host:port)", get("REDIS_SOCKET_TYPE"))
	}
	_, addrs := redisURLParts(get)
	return strings.Join(addrs, ","), true, nil
}

func redisMasterName(_ string, get func(string) string) (string, bool, error) {
	m, _ := redisURLParts(get)
	return m, m != "", nil
}

func redisMode(v string, _ func(string) string) (string, bool, error) {
	switch strings.ToLower(v) {
	case "single":
		return "standalone", true, nil
	case "sentinel", "cluster":
		return strings.ToLower(v), true, nil
	}
	return "", false, fmt.Errorf("REDIS_TYPE=%q: want single, sentinel or cluster", v)
}

// redisAuth sets part i of USER:PASSWORD (0 the user, 1 the password); a
// value without ':' is the password.
func redisAuth(i int) func(string, func(string) string) (string, bool, error) {
	return func(v string, _ func(string) string) (string, bool, error) {
		user, pass, ok := strings.Cut(v, ":")
		if !ok {
			return v, i == 1, nil
		}
		return []string{user, pass}[i], true, nil
	}
}

func localCacheSize(v string, _ func(string) string) (string, bool, error) {
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 0 {
		return "", false, fmt.Errorf("LOCAL_CACHE_SIZE_IN_BYTES=%q: want a number of bytes", v)
	}
	if n == 0 {
		return "", false, notHonoured("the local cache cannot be turned off; its default budget applies")
	}
	return strconv.FormatInt(max(n, minLocalCacheSize), 10), true, nil
}

func headerNames(_ string, get func(string) string) (string, bool, error) {
	if !isTrue(get, "LIMIT_RESPONSE_HEADERS_ENABLED") {
		return "", false, nil
	}
	d := rls.DefaultHeaderNames()
	pick := func(name, def string) string {
		if v := get(name); v != "" {
			return v
		}
		return def
	}
	return strings.Join([]string{pick("LIMIT_LIMIT_HEADER", d.Limit), pick("LIMIT_REMAINING_HEADER", d.Remaining),
		pick("LIMIT_RESET_HEADER", d.Reset)}, ","), true, nil
}

// ratelimitEnv is what applyRatelimitEnv did: the variables set but not
// honoured, by name, each with its reason.
type ratelimitEnv struct {
	notHonoured map[string]string
}

// matches reports whether the variable name is row's.
func (r *ratelimitVar) matches(name string) bool {
	if p, ok := strings.CutSuffix(r.name, "*"); ok {
		return strings.HasPrefix(name, p)
	}
	return name == r.name
}

// applyRatelimitEnv sets the flags of fs that are still unset from
// ratelimit's variables (lookup) by ratelimitVars; environ lists the
// process's variables (NAME=value), for the rows that stand for a prefix.
// It returns an error for a value that cannot configure serve.
func applyRatelimitEnv(fs *pflag.FlagSet, lookup func(string) (string, bool), environ []string) (*ratelimitEnv, error) {
	get := func(name string) string {
		if v, ok := lookup(name); ok {
			return v
		}
		for _, r := range ratelimitVars {
			if r.name == name {
				return r.def
			}
		}
		return ""
	}
	res := &ratelimitEnv{notHonoured: map[string]string{}}
	done := map[string]bool{} // flags this function set
	var errs []error
	seen := map[string]bool{} // messages of errs: two rows may find one fault
	for _, r := range ratelimitVars {
		if strings.HasSuffix(r.name, "*") {
			for _, kv := range environ {
				if name, _, _ := strings.Cut(kv, "="); r.matches(name) {
					res.notHonoured[name] = r.note
				}
			}
			continue
		}
		v, set := lookup(r.name)
		if !set && r.def == "" {
			continue
		}
		if !set {
			v = r.def
		}
		if r.flag == "" && r.value == nil {
			res.notHonoured[r.name] = r.note
			continue
		}
		val, ok := v, true
		if r.value != nil {
			var err error
			val, ok, err = r.value(v, get)
			switch {
			case errors.Is(err, errNotHonoured):
				if set {
					res.notHonoured[r.name] = strings.TrimPrefix(err.Error(), errNotHonoured.Error()+": ")
				}
				continue
			case err != nil:
				if !seen[err.Error()] {
					seen[err.Error()] = true
					errs = append(errs, err)
				}
				continue
			}
		}
		var f *pflag.Flag
		if r.flag != "" {
			if f = fs.Lookup(r.flag); f == nil {
				if set && ok {
					res.notHonoured[r.name] = fmt.Sprintf("not honoured yet: this build has no --%s", r.flag)
				}
				continue
			}
			if f.Changed || done[r.flag] {
				continue
			}
		}
		if !ok || f == nil {
			continue
		}
		if err := fs.Set(r.flag, val); err != nil {
			errs = append(errs, fmt.Errorf("%s=%q (--%s): %w", r.name, v, r.flag, err))
			continue
		}
		done[r.flag] = true
	}
	return res, errors.Join(errs...)
}

// newRatelimitCmd is serve configured by ratelimit's environment.
func newRatelimitCmd(e env) *cobra.Command {
	cmd := newServeCmd(e)
	cmd.Use = ratelimitName + " [flags]"
	cmd.Short = "Run as envoyproxy/ratelimit: serve, configured by ratelimit's environment variables"
	cmd.Long = `ratelimit runs serve configured by envoyproxy/ratelimit's environment
variables (REDIS_URL, GRPC_PORT, PORT, RUNTIME_ROOT, ...), so that flashgate's
image can replace ratelimit's (Envoy Gateway: command /bin/ratelimit). The
binary runs this command when it is called ratelimit. docs/ratelimit.md's table
"Envoy Gateway: swap the image" lists every variable with the serve flag it
sets; a variable set but not honoured is logged once at start.

RLS (envoy.service.ratelimit.v3) only on GRPC_HOST:GRPC_PORT
(default 0.0.0.0:8081); GET /healthcheck and POST /json on HOST:PORT
(0.0.0.0:8080); /metrics, /healthz and /readyz on DEBUG_HOST:DEBUG_PORT
(0.0.0.0:6070). Flags and FLASHGATE_<FLAG> win over ratelimit's variables;
the defaults below are those ratelimit's defaults give.

Answers are ratelimit's, field for field (duration_until_reset aside: a
sliding window's): no rate-limit headers (--ratelimit-headers none) and no
retry-after, content-type or problem body on OVER_LIMIT (--rls-extras=false),
unless FLASHGATE_RATELIMIT_HEADERS or FLASHGATE_RLS_EXTRAS ask for them;
ratelimit's own headers with LIMIT_RESPONSE_HEADERS_ENABLED=true.`
	cmd.Example = `  REDIS_SOCKET_TYPE=tcp REDIS_URL=127.0.0.1:6379 RUNTIME_ROOT=/data RUNTIME_SUBDIRECTORY=ratelimit flashgate ratelimit`
	ratelimitDefaults(cmd.Flags())
	next := cmd.PreRunE // FLASHGATE_<FLAG> first: those win
	cmd.PreRunE = func(cmd *cobra.Command, args []string) error {
		if next != nil {
			if err := next(cmd, args); err != nil {
				return err
			}
		}
		var environ []string
		if e.environ != nil {
			environ = e.environ()
		}
		res, err := applyRatelimitEnv(cmd.Flags(), e.lookupEnv, environ)
		if err != nil {
			return err
		}
		if err := res.log(e, cmd.Flags()); err != nil {
			return err
		}
		if !cmd.Flags().Changed("rls-config") && !changedIfAny(cmd.Flags(), "rls-xds-server") {
			return errors.New("no ratelimit config: CONFIG_TYPE=FILE (the default) with RUNTIME_ROOT, or CONFIG_TYPE=GRPC_XDS_SOTW in a build with --rls-xds-server")
		}
		return nil
	}
	return cmd
}

// ratelimitAnswerDefaults are the defaults of serve's flags that the
// ratelimit command changes without a variable of ratelimit's: its answers
// are ratelimit's unless FLASHGATE_<FLAG> (or the flag) asks for more, and
// like ratelimit, which has no Redis budget of its own, it waits for Redis
// (up to half a second, the caller's deadline first) before the failure
// mode answers in its place.
var ratelimitAnswerDefaults = map[string]string{
	"ratelimit-headers": "none",
	"rls-extras":        "false",
	"redis-timeout":     "500ms",
	"check-deadline":    "1s",
}

// ratelimitDefaults makes fs, serve's flags, the ratelimit command's: each
// flag a variable of ratelimit's sets names it in its usage and shows, as
// its default, what ratelimit's default sets it to (applyRatelimitEnv sets
// it so at start); ratelimitAnswerDefaults become the flags' values.
func ratelimitDefaults(fs *pflag.FlagSet) {
	for name, v := range ratelimitAnswerDefaults {
		if f := fs.Lookup(name); f != nil && f.Value.Set(v) == nil {
			f.DefValue = v
		}
	}
	// What ratelimit's defaults alone set: applied to a scratch set of
	// serve's flags, in an empty environment. (REDIS_URL's default, a
	// unix socket, sets nothing: flashgate needs REDIS_SOCKET_TYPE=tcp.)
	scratch := pflag.NewFlagSet("defaults", pflag.ContinueOnError)
	var o serveOptions
	o.addFlags(scratch)
	_, _ = applyRatelimitEnv(scratch, func(string) (string, bool) { return "", false }, nil)
	vars := map[string][]string{}
	for _, r := range ratelimitVars {
		if r.flag != "" && !slices.Contains(vars[r.flag], r.name) {
			vars[r.flag] = append(vars[r.flag], r.name)
		}
	}
	fs.VisitAll(func(f *pflag.Flag) {
		if names := vars[f.Name]; len(names) > 0 {
			f.Usage += " [ratelimit: $" + strings.Join(names, ", $") + "]"
		}
		if d := scratch.Lookup(f.Name); d != nil && d.Changed {
			f.DefValue = d.Value.String()
		}
	})
}

// changedIfAny reports whether fs has the flag name and it was set.
func changedIfAny(fs *pflag.FlagSet, name string) bool {
	f := fs.Lookup(name)
	return f != nil && f.Changed
}

// log writes the variables not honoured, once, in one warning of serve's
// logger format.
func (r *ratelimitEnv) log(e env, fs *pflag.FlagSet) error {
	if len(r.notHonoured) == 0 {
		return nil
	}
	level, _ := fs.GetString("log-level")
	format, _ := fs.GetString("log-format")
	h, err := newLogHandler(e.stderr, level, format)
	if err != nil {
		return err
	}
	names := make([]string, 0, len(r.notHonoured))
	for n := range r.notHonoured {
		names = append(names, n)
	}
	slices.Sort(names)
	attrs := make([]any, 0, 2*len(names))
	for _, n := range names {
		attrs = append(attrs, n, r.notHonoured[n])
	}
	slog.New(h).Warn("ratelimit settings not honoured", attrs...)
	return nil
}
