package main

import (
	"maps"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/spf13/pflag"

	"github.com/flashgate/flashgate/daemon/ratelimitenv"
)

func TestProgramArgs(t *testing.T) {
	tests := map[string]struct{ argv, want []string }{
		"flashgate":      {[]string{"/usr/local/bin/flashgate", "serve"}, []string{"serve"}},
		"ratelimit":      {[]string{"/bin/ratelimit"}, []string{"ratelimit"}},
		"ratelimit args": {[]string{"ratelimit", "--log-format", "json"}, []string{"ratelimit", "--log-format", "json"}},
		"empty":          {nil, nil},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if got := programArgs(tc.argv); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("programArgs(%q) = %q, want %q", tc.argv, got, tc.want)
			}
		})
	}
}

// egEnv is Envoy Gateway's default environment of its ratelimit Deployment
// (envoyproxy/gateway internal/infrastructure/kubernetes/ratelimit,
// testdata/deployments/default.yaml) without the TLS and xDS variables.
func egEnv(redisURL, runtimeRoot string) map[string]string {
	return map[string]string{
		"RUNTIME_ROOT":                       runtimeRoot,
		"RUNTIME_SUBDIRECTORY":               "ratelimit",
		"RUNTIME_IGNOREDOTFILES":             "true",
		"RUNTIME_WATCH_ROOT":                 "false",
		"LOG_LEVEL":                          "info",
		"USE_STATSD":                         "true",
		"STATSD_PORT":                        "9125",
		"FORCE_START_WITHOUT_INITIAL_CONFIG": "true",
		"REDIS_SOCKET_TYPE":                  "tcp",
		"REDIS_URL":                          redisURL,
	}
}

// serveFlags returns serve's flag set, unparsed.
func serveFlags() *pflag.FlagSet {
	var o serveOptions
	fs := pflag.NewFlagSet("serve", pflag.ContinueOnError)
	o.addFlags(fs)
	return fs
}

// changedFlags returns the flags ratelimitenv.Apply set, with their values.
func changedFlags(fs *pflag.FlagSet) map[string]string {
	got := map[string]string{}
	fs.Visit(func(f *pflag.Flag) { got[f.Name] = f.Value.String() })
	return got
}

func TestApplyRatelimitEnv(t *testing.T) {
	with := func(base map[string]string, kv ...string) map[string]string {
		m := maps.Clone(base)
		for i := 0; i < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return m
	}
	eg := egEnv("redis.redis.svc:6379", "/data")
	egFlags := map[string]string{
		"rls-http-addr": "0.0.0.0:8080", "http-addr": "0.0.0.0:6070", "grpc-addr": "0.0.0.0:8081",
		"log-level": "info", "log-format": "text", "rls-config": "/data/ratelimit",
		"backend": "redis", "redis-addr": "[redis.redis.svc:6379]", "redis-mode": "standalone",
	}
	tests := map[string]struct {
		env         map[string]string
		environ     []string
		want        map[string]string // flags set; nil: not checked
		notHonoured []string
		err         string
	}{
		"envoy gateway": {env: eg, want: egFlags, notHonoured: []string{"STATSD_PORT", "USE_STATSD"}},
		"sentinel with user": {
			env: with(eg, "REDIS_TYPE", "sentinel", "REDIS_URL", "mymaster,s1:26379,s2:26379", "REDIS_AUTH", "app:secret",
				"REDIS_POOL_SIZE", "20", "REDIS_TLS", "true", "CACHE_KEY_PREFIX", "eg", "SHADOW_MODE", "true"),
			want: with(egFlags, "redis-mode", "sentinel", "redis-addr", "[s1:26379,s2:26379]", "redis-master-name", "mymaster",
				"redis-username", "app", "redis-password", "secret", "redis-pool-size", "20", "redis-tls", "true",
				"key-prefix", "eg", "shadow", "true"),
			notHonoured: []string{"STATSD_PORT", "USE_STATSD"},
		},
		"cluster, password only": {
			env:         with(eg, "REDIS_TYPE", "CLUSTER", "REDIS_URL", "a:1,b:2", "REDIS_AUTH", "pw"),
			want:        with(egFlags, "redis-mode", "cluster", "redis-addr", "[a:1,b:2]", "redis-password", "pw"),
			notHonoured: []string{"STATSD_PORT", "USE_STATSD"},
		},
		"addresses and headers": {
			env: map[string]string{"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "r:6379", "HOST": "127.0.0.1", "PORT": "18080",
				"GRPC_UDS": "/run/rl.sock", "DEBUG_PORT": "16070", "LOG_LEVEL": "WARNING", "LOG_FORMAT": "json",
				"LIMIT_RESPONSE_HEADERS_ENABLED": "true", "LIMIT_RESET_HEADER": "X-Reset", "LOCAL_CACHE_SIZE_IN_BYTES": "1024"},
			want: map[string]string{"rls-http-addr": "127.0.0.1:18080", "http-addr": "0.0.0.0:16070", "grpc-addr": "unix:///run/rl.sock",
				"log-level": "warn", "log-format": "json", "rls-config": "/srv/runtime_data/current", "backend": "redis",
				"redis-addr": "[r:6379]", "redis-mode": "standalone", "rls-response-headers": "true",
				"rls-header-names": "RateLimit-Limit,RateLimit-Remaining,X-Reset", "local-cache-size": "64KiB"},
		},
		"not honoured values and prefixes": {
			env: with(eg, "LOCAL_CACHE_SIZE_IN_BYTES", "0", "RUNTIME_IGNOREDOTFILES", "false", "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", "false",
				"NEAR_LIMIT_RATIO", "0.9"),
			environ:     []string{"MEMCACHE_HOST_PORT=m:11211", "TRACING_ENABLED=true", "PATH=/bin"},
			notHonoured: []string{"LOCAL_CACHE_SIZE_IN_BYTES", "MEMCACHE_HOST_PORT", "NEAR_LIMIT_RATIO", "RUNTIME_IGNOREDOTFILES", "STATSD_PORT", "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", "TRACING_ENABLED", "USE_STATSD"},
		},
		"tls and xds": {
			env: with(eg, "GRPC_SERVER_USE_TLS", "true", "GRPC_SERVER_TLS_CERT", "/certs/tls.crt", "GRPC_SERVER_TLS_KEY", "/certs/tls.key",
				"GRPC_SERVER_TLS_CA_CERT", "/certs/ca.crt", "CONFIG_TYPE", "GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_SERVER_URL", "envoy-gateway:18001",
				"CONFIG_GRPC_XDS_NODE_ID", "envoy-ratelimit", "CONFIG_GRPC_XDS_SERVER_USE_TLS", "true",
				"CONFIG_GRPC_XDS_CLIENT_TLS_CERT", "/certs/tls.crt", "CONFIG_GRPC_XDS_CLIENT_TLS_KEY", "/certs/tls.key",
				"CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "/certs/ca.crt"),
			notHonoured: notInBuild([]string{"GRPC_SERVER_USE_TLS", "GRPC_SERVER_TLS_CERT", "GRPC_SERVER_TLS_KEY", "GRPC_SERVER_TLS_CA_CERT",
				"CONFIG_TYPE", "CONFIG_GRPC_XDS_SERVER_URL", "CONFIG_GRPC_XDS_NODE_ID", "CONFIG_GRPC_XDS_SERVER_USE_TLS",
				"CONFIG_GRPC_XDS_CLIENT_TLS_CERT", "CONFIG_GRPC_XDS_CLIENT_TLS_KEY", "CONFIG_GRPC_XDS_SERVER_TLS_CACERT",
				"FORCE_START_WITHOUT_INITIAL_CONFIG"}, "STATSD_PORT", "USE_STATSD"),
		},
		"envoy gateway's xds default": {
			env: with(egDefaultEnv("/certs", "envoy-gateway:18001", "redis.redis.svc:6379"),
				"CONFIG_GRPC_XDS_NODE_METADATA", "zone=a", "CONFIG_GRPC_XDS_SERVER_TLS_SAN", "envoy-gateway.envoy-gateway-system"),
			want: map[string]string{
				"rls-http-addr": "0.0.0.0:8080", "http-addr": "0.0.0.0:6070", "grpc-addr": "0.0.0.0:8081",
				"log-level": "info", "log-format": "text", "backend": "redis", "redis-addr": "[redis.redis.svc:6379]", "redis-mode": "standalone",
				"grpc-tls-cert": "/certs/tls.crt", "grpc-tls-key": "/certs/tls.key", "grpc-tls-client-ca": "/certs/ca.crt",
				"rls-xds-server": "envoy-gateway:18001", "rls-xds-node-id": "envoy-ratelimit", "rls-xds-retry-interval": "3s",
				"rls-xds-tls": "true", "rls-xds-tls-cert": "/certs/tls.crt", "rls-xds-tls-key": "/certs/tls.key",
				"rls-xds-tls-ca": "/certs/ca.crt", "rls-xds-force-start": "true", "rls-xds-node-metadata": "zone=a",
				"rls-xds-tls-server-name": "envoy-gateway.envoy-gateway-system",
			},
			environ:     []string{"PROMETHEUS_ADDR=:19001", "PROMETHEUS_MAPPER_YAML=/etc/statsd-exporter/conf.yaml"},
			notHonoured: []string{"PROMETHEUS_ADDR", "PROMETHEUS_MAPPER_YAML", "USE_PROMETHEUS", "USE_STATSD"},
		},
		"cache key prefix with its separator": {
			env:         with(eg, "CACHE_KEY_PREFIX", "prefix:"),
			want:        with(egFlags, "key-prefix", "prefix"),
			notHonoured: []string{"STATSD_PORT", "USE_STATSD"},
		},
		"pipeline window": {
			env:         with(eg, "REDIS_PIPELINE_WINDOW", "150us", "REDIS_PIPELINE_LIMIT", "8"),
			want:        with(egFlags, "redis-batch-window", "150µs"),
			notHonoured: []string{"REDIS_PIPELINE_LIMIT", "STATSD_PORT", "USE_STATSD"},
		},
		"pipeline window off": {env: with(eg, "REDIS_PIPELINE_WINDOW", "0"), want: egFlags, notHonoured: []string{"STATSD_PORT", "USE_STATSD"}},
		"pipeline window too long": {
			env:         with(eg, "REDIS_PIPELINE_WINDOW", "20ms"),
			want:        egFlags,
			notHonoured: []string{"REDIS_PIPELINE_WINDOW", "STATSD_PORT", "USE_STATSD"},
		},
		"bad pipeline window":      {env: with(eg, "REDIS_PIPELINE_WINDOW", "soon"), err: "REDIS_PIPELINE_WINDOW"},
		"bad cache key prefix":     {env: with(eg, "CACHE_KEY_PREFIX", "a b:"), err: "CACHE_KEY_PREFIX"},
		"unix socket":              {env: with(eg, "REDIS_SOCKET_TYPE", "unix"), err: "REDIS_SOCKET_TYPE"},
		"ratelimit default socket": {env: map[string]string{}, err: "REDIS_SOCKET_TYPE"},
		"memcache":                 {env: with(eg, "BACKEND_TYPE", "memcache"), err: "BACKEND_TYPE"},
		"bad port":                 {env: with(eg, "GRPC_PORT", "http"), err: "GRPC_PORT"},
		"bad level":                {env: with(eg, "LOG_LEVEL", "loud"), err: "LOG_LEVEL"},
		"bad pool":                 {env: with(eg, "REDIS_POOL_SIZE", "many"), err: "REDIS_POOL_SIZE"},
		"bad redis type":           {env: with(eg, "REDIS_TYPE", "ring"), err: "REDIS_TYPE"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			fs := serveFlags()
			lookup := func(k string) (string, bool) { v, ok := tc.env[k]; return v, ok }
			res, err := ratelimitenv.Apply(fs, lookup, tc.environ)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err = %v, want one naming %s", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := changedFlags(fs); tc.want != nil && !reflect.DeepEqual(got, tc.want) {
				t.Errorf("flags:\n got %v\nwant %v", got, tc.want)
			}
			got := make([]string, 0, len(res))
			for n := range res {
				got = append(got, n)
			}
			want := append([]string(nil), tc.notHonoured...)
			slices.Sort(got)
			slices.Sort(want)
			if (len(got) > 0 || len(want) > 0) && !reflect.DeepEqual(got, want) {
				t.Errorf("not honoured:\n got %q\nwant %q", got, want)
			}
		})
	}
}

// notInBuild returns the names whose row's flag this build lacks, plus more.
func notInBuild(names []string, more ...string) []string {
	fs := serveFlags()
	var out []string
	for _, n := range names {
		for _, r := range ratelimitenv.Vars() {
			if r.Name == n && r.Flag != "" && fs.Lookup(r.Flag) == nil {
				out = append(out, n)
				break
			}
		}
	}
	return append(out, more...)
}

// TestRatelimitVarsRows checks the table: every variable with a flag names
// one of serve's or one of the flags the TLS and xDS settings need
// (ratelimitenv's tests check the rest of each row).
func TestRatelimitVarsRows(t *testing.T) {
	pending := map[string]bool{"grpc-tls-cert": true, "grpc-tls-key": true, "grpc-tls-client-ca": true,
		"rls-xds-server": true, "rls-xds-node-id": true, "rls-xds-tls": true, "rls-xds-tls-cert": true,
		"rls-xds-tls-key": true, "rls-xds-tls-ca": true, "rls-xds-retry-interval": true, "rls-xds-force-start": true}
	fs := serveFlags()
	for _, r := range ratelimitenv.Vars() {
		if r.Flag != "" && fs.Lookup(r.Flag) == nil && !pending[r.Flag] {
			t.Errorf("%s: serve has no --%s", r.Name, r.Flag)
		}
	}
}

// TestRatelimitCommand runs the ratelimit command in-process on
// environments that must not start: each error names what to change, after
// the settings not honoured are logged.
func TestRatelimitCommand(t *testing.T) {
	eg := egEnv("127.0.0.1:1", t.TempDir())
	tests := map[string]struct {
		env     map[string]string
		environ []string
		err     string
		logged  []string
	}{
		"unix socket": {env: map[string]string{"REDIS_URL": "/run/redis.sock"}, err: "REDIS_SOCKET_TYPE"},
		"xds without its flags": {
			env:    map[string]string{"CONFIG_TYPE": "GRPC_XDS_SOTW", "REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "127.0.0.1:1", "USE_STATSD": "true"},
			err:    "no ratelimit config",
			logged: []string{"USE_STATSD", "CONFIG_TYPE"},
		},
		"bad runtime directory": {
			env:     eg,
			environ: []string{"TRACING_ENABLED=true"},
			err:     "ratelimit config directory",
			logged:  []string{"USE_STATSD", "STATSD_PORT", "TRACING_ENABLED"},
		},
	}
	if serveFlagsHave("rls-xds-server") {
		delete(tests, "xds without its flags") // the xDS client's tests start it
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			var stdout, stderr strings.Builder
			err := runEnv(t.Context(), []string{"ratelimit"}, env{stdout: &stdout, stderr: &stderr,
				lookupEnv: func(k string) (string, bool) { v, ok := tc.env[k]; return v, ok },
				environ:   func() []string { return tc.environ }})
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Fatalf("err = %v, want %q", err, tc.err)
			}
			if lines := strings.Split(err.Error(), "\n"); len(lines) != len(slices.Compact(slices.Sorted(slices.Values(lines)))) {
				t.Errorf("err = %v: a line twice", err)
			}
			if n := strings.Count(stderr.String(), "ratelimit settings not honoured"); n != min(len(tc.logged), 1) {
				t.Errorf("logged %d times:\n%s", n, stderr.String())
			}
			for _, v := range tc.logged {
				if !strings.Contains(stderr.String(), " "+v+"=") {
					t.Errorf("%s not logged as not honoured:\n%s", v, stderr.String())
				}
			}
		})
	}
}

func serveFlagsHave(name string) bool { return serveFlags().Lookup(name) != nil }

// TestRatelimitHelp: the ratelimit command's help shows the defaults it
// runs with (ratelimit's, through its variables, and its answers'), not
// serve's, each flag a variable sets naming it.
func TestRatelimitHelp(t *testing.T) {
	var stdout, stderr strings.Builder
	if err := runEnv(t.Context(), []string{"ratelimit", "--help"}, env{stdout: &stdout, stderr: &stderr,
		lookupEnv: func(string) (string, bool) { return "", false }}); err != nil {
		t.Fatal(err)
	}
	flags := map[string]string{}
	for _, l := range strings.Split(stdout.String(), "\n") {
		if f := strings.Fields(l); len(f) > 0 && strings.HasPrefix(f[0], "--") {
			flags[f[0]] = l
		}
	}
	for flag, want := range map[string][]string{
		"--grpc-addr":         {`(default "0.0.0.0:8081")`, "[ratelimit: $GRPC_HOST, $GRPC_PORT, $GRPC_UDS]"},
		"--http-addr":         {`(default "0.0.0.0:6070")`, "$DEBUG_PORT"},
		"--rls-http-addr":     {`(default "0.0.0.0:8080")`, "$PORT"},
		"--backend":           {`(default "redis")`, "$BACKEND_TYPE"},
		"--log-level":         {`(default "warn")`},
		"--log-format":        {`(default "text")`},
		"--rls-config":        {`(default "/srv/runtime_data/current")`, "$RUNTIME_ROOT"},
		"--ratelimit-headers": {`(default "none")`},
		"--redis-addr":        {"$REDIS_URL"},
	} {
		for _, w := range want {
			if !strings.Contains(flags[flag], w) {
				t.Errorf("%s: %q, want %s", flag, flags[flag], w)
			}
		}
	}
	if l := flags["--rls-extras"]; l == "" || strings.Contains(l, "(default") {
		t.Errorf("--rls-extras: %q, want it listed, default false", l)
	}
}
