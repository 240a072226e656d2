package ratelimitenv

import (
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/flashgate/flashgate/rls"
	"github.com/flashgate/flashgate/window"
	"github.com/flashgate/flashgate/window/guard"
	"github.com/flashgate/flashgate/window/redisstore"
)

// Var is one row of the mapping: ratelimit's variable Name ("X_*": every
// variable with that prefix), its Default ("" : serve's), the serve Flag
// it sets ("" : none) and a Note on how, or why it is not honoured.
type Var struct {
	Name, Default, Flag, Note string
	// value returns the flag's value from the variable's v and, through
	// get, the others' (defaults applied); set false leaves the flag. An
	// error wrapping errNotHonoured is reported, any other ends the start.
	// nil: v as it is. A row without Flag and value is never honoured.
	value func(v string, get func(string) string) (string, bool, error)
}

// errNotHonoured marks a value flashgate cannot follow: logged, not fatal.
var errNotHonoured = errors.New("not honoured")

func notHonoured(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{errNotHonoured}, args...)...)
}

// vars is the mapping of ratelimit's settings to serve's flags.
var vars = []Var{
	// Listeners.
	{Name: "HOST", Default: "0.0.0.0", Flag: "rls-http-addr", Note: "HOST:PORT: GET /healthcheck and POST /json", value: hostPort("HOST", "PORT")},
	{Name: "PORT", Default: "8080", Flag: "rls-http-addr", Note: "HOST:PORT", value: hostPort("HOST", "PORT")},
	{Name: "DEBUG_HOST", Default: "0.0.0.0", Flag: "http-addr", Note: "DEBUG_HOST:DEBUG_PORT: /metrics (Prometheus), /healthz, /readyz", value: hostPort("DEBUG_HOST", "DEBUG_PORT")},
	{Name: "DEBUG_PORT", Default: "6070", Flag: "http-addr", Note: "DEBUG_HOST:DEBUG_PORT", value: hostPort("DEBUG_HOST", "DEBUG_PORT")},
	{Name: "GRPC_HOST", Default: "0.0.0.0", Flag: "grpc-addr", Note: "GRPC_HOST:GRPC_PORT: RateLimitService, grpc.health.v1 (ext_authz with FLASHGATE_CONFIG)", value: grpcAddr},
	{Name: "GRPC_PORT", Default: "8081", Flag: "grpc-addr", Note: "GRPC_HOST:GRPC_PORT", value: grpcAddr},
	{Name: "GRPC_UDS", Flag: "grpc-addr", Note: "unix://GRPC_UDS, in place of GRPC_HOST:GRPC_PORT", value: grpcAddr},
	{Name: "PROTO", Default: "tcp", Note: "tcp only", value: only("tcp", "flashgate listens on TCP (or GRPC_UDS)")},
	{Name: "GRPC_MAX_CONNECTION_AGE", Note: "connections are kept; --grpc-max-conns caps them"},
	{Name: "GRPC_MAX_CONNECTION_AGE_GRACE", Note: "connections are kept; --grpc-max-conns caps them"},

	// gRPC server TLS.
	{Name: "GRPC_SERVER_USE_TLS", Flag: "grpc-tls-cert", Note: "true: GRPC_SERVER_TLS_CERT is served", value: whenTLS("GRPC_SERVER_TLS_CERT")},
	{Name: "GRPC_SERVER_TLS_CERT", Flag: "grpc-tls-cert", Note: "with GRPC_SERVER_USE_TLS=true; reloaded on change", value: whenTLS("GRPC_SERVER_TLS_CERT")},
	{Name: "GRPC_SERVER_TLS_KEY", Flag: "grpc-tls-key", Note: "with GRPC_SERVER_USE_TLS=true; reloaded on change", value: whenTLS("GRPC_SERVER_TLS_KEY")},
	{Name: "GRPC_CLIENT_TLS_CACERT", Flag: "grpc-tls-client-ca", Note: "with GRPC_SERVER_USE_TLS=true: clients must present a certificate of this CA; reloaded on change", value: whenTLS("GRPC_CLIENT_TLS_CACERT")},
	{Name: "GRPC_SERVER_TLS_CA_CERT", Flag: "grpc-tls-client-ca", Note: "Envoy Gateway's name for GRPC_CLIENT_TLS_CACERT", value: whenTLS("GRPC_SERVER_TLS_CA_CERT")},
	{Name: "GRPC_CLIENT_TLS_SAN", Note: "any client certificate of the CA is accepted"},

	// Logging.
	{Name: "LOG_LEVEL", Default: "warn", Flag: "log-level", Note: "trace → debug, warning → warn, fatal and panic → error", value: logLevel},
	{Name: "LOG_FORMAT", Default: "text", Flag: "log-format", Note: "text or json"},

	// Where the config comes from.
	{Name: "CONFIG_TYPE", Default: "FILE", Flag: "rls-xds-server", Note: "FILE: RUNTIME_ROOT's files; GRPC_XDS_SOTW: CONFIG_GRPC_XDS_SERVER_URL", value: xdsServer},
	{Name: "RUNTIME_ROOT", Default: "/srv/runtime_data/current", Flag: "rls-config", Note: "RUNTIME_ROOT/RUNTIME_SUBDIRECTORY[/RUNTIME_APPDIRECTORY], with CONFIG_TYPE=FILE; watched and reloaded", value: runtimeDir},
	{Name: "RUNTIME_SUBDIRECTORY", Flag: "rls-config", Note: "see RUNTIME_ROOT", value: runtimeDir},
	{Name: "RUNTIME_APPDIRECTORY", Default: "config", Flag: "rls-config", Note: "see RUNTIME_ROOT", value: runtimeDir},
	{Name: "RUNTIME_IGNOREDOTFILES", Note: "true only: files whose name starts with a dot are always skipped", value: only("true", "dot files are always skipped")},
	{Name: "RUNTIME_WATCH_ROOT", Note: "either: the directory and its symlinks are always watched", value: isBool},
	{Name: "MERGE_DOMAIN_CONFIG", Note: "false only: a domain is one file", value: only("false", "a domain in two files is an error")},
	{Name: "HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", Note: "health turns SERVING once the config is loaded and Redis is warm"},

	// xDS.
	{Name: "CONFIG_GRPC_XDS_SERVER_URL", Default: "localhost:18000", Flag: "rls-xds-server", Note: "with CONFIG_TYPE=GRPC_XDS_SOTW", value: xdsServer},
	{Name: "CONFIG_GRPC_XDS_NODE_ID", Default: "default", Flag: "rls-xds-node-id", Note: "with CONFIG_TYPE=GRPC_XDS_SOTW", value: whenXDS},
	{Name: "CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL", Default: "3s", Flag: "rls-xds-retry-interval", Note: "with CONFIG_TYPE=GRPC_XDS_SOTW", value: whenXDS},
	{Name: "CONFIG_GRPC_XDS_SERVER_USE_TLS", Flag: "rls-xds-tls", Note: "with CONFIG_TYPE=GRPC_XDS_SOTW", value: whenXDS},
	{Name: "CONFIG_GRPC_XDS_CLIENT_TLS_CERT", Flag: "rls-xds-tls-cert", Note: "with CONFIG_TYPE=GRPC_XDS_SOTW; reloaded on change", value: whenXDS},
	{Name: "CONFIG_GRPC_XDS_CLIENT_TLS_KEY", Flag: "rls-xds-tls-key", Note: "with CONFIG_TYPE=GRPC_XDS_SOTW; reloaded on change", value: whenXDS},
	{Name: "CONFIG_GRPC_XDS_SERVER_TLS_CACERT", Flag: "rls-xds-tls-ca", Note: "with CONFIG_TYPE=GRPC_XDS_SOTW; reloaded on change", value: whenXDS},
	{Name: "CONFIG_GRPC_XDS_SERVER_TLS_SAN", Flag: "rls-xds-tls-server-name", Note: "with CONFIG_TYPE=GRPC_XDS_SOTW: the name the xDS server's certificate is verified for (default: the host of CONFIG_GRPC_XDS_SERVER_URL)", value: whenXDS},
	{Name: "FORCE_START_WITHOUT_INITIAL_CONFIG", Flag: "rls-xds-force-start", Note: "with CONFIG_TYPE=GRPC_XDS_SOTW", value: whenXDS},
	{Name: "CONFIG_GRPC_XDS_NODE_METADATA", Flag: "rls-xds-node-metadata", Note: "with CONFIG_TYPE=GRPC_XDS_SOTW: k1=v1,k2=v2 as string fields", value: whenXDS},
	{Name: "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", Note: "no headers are added to the xDS stream"},
	{Name: "XDS_CLIENT_BACKOFF_*", Note: "retries wait CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL"},

	// Redis.
	{Name: "BACKEND_TYPE", Default: "redis", Flag: "backend", Note: "redis only", value: backendType},
	{Name: "REDIS_SOCKET_TYPE", Default: "unix", Flag: "redis-addr", Note: "tcp only", value: redisAddr},
	{Name: "REDIS_URL", Default: "/var/run/nutcracker/ratelimit.sock", Flag: "redis-addr", Note: "host:port; cluster: comma-separated seeds; sentinel: MASTER,host:port,...", value: redisAddr},
	{Name: "REDIS_URL", Flag: "redis-master-name", Note: "sentinel: its first element", value: redisMasterName},
	{Name: "REDIS_TYPE", Default: "single", Flag: "redis-mode", Note: "single → standalone, sentinel, cluster", value: redisMode},
	{Name: "REDIS_AUTH", Flag: "redis-password", Note: "PASSWORD or USER:PASSWORD", value: redisAuth(1)},
	{Name: "REDIS_AUTH", Flag: "redis-username", Note: "USER of USER:PASSWORD", value: redisAuth(0)},
	{Name: "REDIS_TLS", Flag: "redis-tls", Note: "the system's roots verify Redis"},
	{Name: "REDIS_POOL_SIZE", Flag: "redis-pool-size", Note: "connections per node"},
	{Name: "REDIS_TLS_CLIENT_CERT", Note: "no client certificate is sent to Redis"},
	{Name: "REDIS_TLS_CLIENT_KEY", Note: "no client certificate is sent to Redis"},
	{Name: "REDIS_TLS_CACERT", Note: "the system's roots verify Redis"},
	{Name: "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", Note: "Redis's host name is always verified"},
	{Name: "REDIS_PIPELINE_WINDOW", Flag: "redis-batch-window", Note: "a check that finds Redis idle waits up to this long (at most 5ms) for others to share its script call; checks in flight are batched by --redis-autopipeline either way", value: pipelineWindow},
	{Name: "REDIS_PIPELINE_LIMIT", Note: "a batch window ends early at 128 checks, the most one script call takes"},
	{Name: "REDIS_PERSECOND*", Note: "one Redis holds every window"},
	{Name: "REDIS_HEALTH_CHECK_ACTIVE_CONNECTION", Note: "health follows Redis's warm-up; then Redis failures take --failure-mode"},
	{Name: "MEMCACHE_*", Note: "Redis only"},

	// Limits and answers.
	{Name: "CACHE_KEY_PREFIX", Flag: "key-prefix", Note: "prefix of every Redis key, A-Z a-z 0-9 . _ - (a trailing : is dropped: flashgate adds its own separator; empty: serve's fg)", value: keyPrefix},
	{Name: "LOCAL_CACHE_SIZE_IN_BYTES", Flag: "local-cache-size", Note: "bytes of the local over-limit cache, 64KiB at least; 0 keeps the default (it cannot be turned off)", value: localCacheSize},
	{Name: "SHADOW_MODE", Flag: "shadow", Note: "decide and count, but answer OK"},
	{Name: "LIMIT_RESPONSE_HEADERS_ENABLED", Flag: "rls-response-headers", Note: "RateLimit-Limit, -Remaining and -Reset on answers"},
	{Name: "LIMIT_LIMIT_HEADER", Flag: "rls-header-names", Note: "with LIMIT_RESPONSE_HEADERS_ENABLED=true", value: headerNames},
	{Name: "LIMIT_REMAINING_HEADER", Flag: "rls-header-names", Note: "with LIMIT_RESPONSE_HEADERS_ENABLED=true", value: headerNames},
	{Name: "LIMIT_RESET_HEADER", Flag: "rls-header-names", Note: "with LIMIT_RESPONSE_HEADERS_ENABLED=true", value: headerNames},
	{Name: "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", Note: "true only: a refused request is counted in no window (all or nothing)", value: only("true", "a refused request is counted in no window (all or nothing)")},
	{Name: "NEAR_LIMIT_RATIO", Note: "no near-limit count"},
	{Name: "EXPIRATION_JITTER_MAX_SECONDS", Note: "a key expires one window after its last admission"},

	// Stats: Prometheus on DEBUG_PORT, no statsd.
	{Name: "USE_STATSD", Note: statsNote},
	{Name: "STATSD_HOST", Note: statsNote},
	{Name: "STATSD_PORT", Note: statsNote},
	{Name: "USE_DOG_STATSD*", Note: statsNote},
	{Name: "EXTRA_TAGS", Note: statsNote},
	{Name: "STATS_FLUSH_INTERVAL", Note: statsNote},
	{Name: "DISABLE_STATS", Note: statsNote},
	{Name: "USE_PROMETHEUS", Note: statsNote},
	{Name: "PROMETHEUS_*", Note: statsNote},
	{Name: "TRACING_*", Note: "no tracing"},
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
	return strconv.FormatInt(max(n, guard.MinGuardBudget), 10), true, nil
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

// Vars returns the mapping, one row per variable and flag, in the order of
// docs/ratelimit.md's table.
func Vars() []Var { return slices.Clone(vars) }

// Setting is one flag value the environment gives: variable Name's Raw
// value (ratelimit's default unless Explicit) sets Flag to Value.
type Setting struct {
	Name, Raw, Flag, Value string
	Explicit               bool
}

// Result is what the environment says.
type Result struct {
	// Settings are in the table's order; a flag's first setting wins.
	Settings []Setting
	// NotHonoured holds the variables set but not followed, with why.
	NotHonoured map[string]string
}

// matches reports whether the variable name is row r's.
func (r *Var) matches(name string) bool {
	if p, ok := strings.CutSuffix(r.Name, "*"); ok {
		return strings.HasPrefix(name, p)
	}
	return name == r.Name
}

// Translate reads ratelimit's variables through lookup (as os.LookupEnv)
// and returns the flag values they give; environ lists the variables
// (NAME=value, as os.Environ) for the rows that stand for a prefix. Its
// error names each variable whose value cannot configure serve.
func Translate(lookup func(string) (string, bool), environ []string) (*Result, error) {
	get := func(name string) string {
		if v, ok := lookup(name); ok {
			return v
		}
		for _, r := range vars {
			if r.Name == name {
				return r.Default
			}
		}
		return ""
	}
	res := &Result{NotHonoured: map[string]string{}}
	var errs []error
	seen := map[string]bool{} // messages of errs: two rows may find one fault
	for _, r := range vars {
		if strings.HasSuffix(r.Name, "*") {
			for _, kv := range environ {
				if name, _, _ := strings.Cut(kv, "="); r.matches(name) {
					res.NotHonoured[name] = r.Note
				}
			}
			continue
		}
		v, set := lookup(r.Name)
		if !set && r.Default == "" {
			continue
		}
		if !set {
			v = r.Default
		}
		if r.Flag == "" && r.value == nil {
			res.NotHonoured[r.Name] = r.Note
			continue
		}
		val, ok := v, true
		if r.value != nil {
			var err error
			val, ok, err = r.value(v, get)
			switch {
			case errors.Is(err, errNotHonoured):
				if set {
					res.NotHonoured[r.Name] = strings.TrimPrefix(err.Error(), errNotHonoured.Error()+": ")
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
		if ok && r.Flag != "" {
			res.Settings = append(res.Settings, Setting{Name: r.Name, Raw: v, Explicit: set, Flag: r.Flag, Value: val})
		}
	}
	return res, errors.Join(errs...)
}
