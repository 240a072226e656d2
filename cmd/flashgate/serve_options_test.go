package main

import (
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
)

// parseServe parses serve's flags from args and env, as serve does.
func parseServe(t *testing.T, args []string, environ map[string]string) (*serveOptions, *pflag.FlagSet, error) {
	t.Helper()
	var o serveOptions
	fs := pflag.NewFlagSet("serve", pflag.ContinueOnError)
	o.addFlags(fs)
	if err := fs.Parse(args); err != nil {
		return nil, nil, err
	}
	err := bindEnv(fs, func(k string) (string, bool) { v, ok := environ[k]; return v, ok })
	return &o, fs, err
}

func TestServeEnvBinding(t *testing.T) {
	o, _, err := parseServe(t,
		[]string{"--backend", "redis", "--redis-timeout", "40ms"},
		map[string]string{
			"FLASHGATE_BACKEND":            "memory", // the flag wins
			"FLASHGATE_REDIS_TIMEOUT":      "1s",     // the flag wins
			"FLASHGATE_REDIS_ADDR":         "a:1,b:2",
			"FLASHGATE_REDIS_TLS":          "true",
			"FLASHGATE_BAN_DURATION":       "0",
			"FLASHGATE_LOCAL_CACHE_SIZE":   "64MiB",
			"FLASHGATE_GRPC_ADDR":          "0.0.0.0:9000",
			"FLASHGATE_SHADOW":             "1",
			"FLASHGATE_REDIS_AUTOPIPELINE": "false", // the default is true
			"FLASHGATE_UNRELATED":          "x",
		})
	if err != nil {
		t.Fatal(err)
	}
	if o.Backend != "redis" || o.redisTimeout != 40*time.Millisecond {
		t.Errorf("flags did not win: backend %q, timeout %s", o.Backend, o.redisTimeout)
	}
	if strings.Join(o.redisAddrs, ",") != "a:1,b:2" || !o.redisTLS || o.banDuration != 0 ||
		o.LocalCacheSize != 64<<20 || o.GRPCAddr != "0.0.0.0:9000" || !o.Shadow || o.RedisAutoPipeline {
		t.Errorf("environment not applied: %+v", o)
	}
	if o.HTTPAddr != "127.0.0.1:9192" || o.failureMode != "local" || o.keyPrefix != "fg" || o.banThreshold != 5 {
		t.Errorf("defaults lost: %+v", o)
	}
}

func TestServeEnvBindingErrors(t *testing.T) {
	_, _, err := parseServe(t, nil, map[string]string{"FLASHGATE_REDIS_DB": "zero", "FLASHGATE_BAN_WINDOW": "long"})
	if err == nil || !strings.Contains(err.Error(), `FLASHGATE_REDIS_DB="zero"`) || !strings.Contains(err.Error(), "FLASHGATE_BAN_WINDOW") {
		t.Fatalf("err = %v, want both variables named", err)
	}
}

func TestServeEveryFlagHasItsVariable(t *testing.T) {
	// serve's documented flags (docs/configuration.md's table); each must exist and be bound.
	design := []string{"config", "grpc-addr", "http-addr", "backend", "redis-addr", "redis-mode", "redis-master-name",
		"redis-username", "redis-password", "redis-db", "redis-tls", "redis-timeout", "redis-pool-size", "redis-batch-window", "key-prefix",
		"clock", "failure-mode", "ban-threshold", "ban-window", "ban-duration", "local-cache-size", "shadow",
		"log-level", "log-format", "warmup-timeout", "http-max-conns", "grpc-max-conns",
		"http-authz-addr", "http-authz-path-prefix", "http-authz-max-conns",
		"grpc-tls-cert", "grpc-tls-key", "grpc-tls-client-ca"}
	cmd := newServeCmd(env{lookupEnv: func(string) (string, bool) { return "", false }})
	for _, name := range design {
		f := cmd.Flags().Lookup(name)
		if f == nil {
			t.Errorf("serve has no --%s", name)
			continue
		}
		if !strings.Contains(f.Usage, "$"+envName(name)) {
			t.Errorf("--%s usage does not name %s", name, envName(name))
		}
	}
}

func TestServeFlagCombinations(t *testing.T) {
	tests := map[string]struct {
		args []string
		want string // "" for valid
	}{
		"defaults":                  {nil, ""},
		"redis":                     {[]string{"--backend", "redis", "--redis-addr", "127.0.0.1:6379"}, ""},
		"redis without address":     {[]string{"--backend", "redis"}, "needs --redis-addr"},
		"rls http without config":   {[]string{"--rls-http-addr", "127.0.0.1:0"}, "--rls-http-addr needs --rls-config"},
		"http authz on an rls only": {[]string{"--rls-config", "d", "--http-authz-addr", "127.0.0.1:0"}, "--http-authz-addr needs --config when the RLS is served"},
		"http authz beside the rls": {[]string{"--rls-config", "d", "--config", "f", "--http-authz-addr", "127.0.0.1:0"}, ""},
		"redis address on memory":   {[]string{"--redis-addr", "127.0.0.1:6379"}, "--redis-addr is only for --backend redis"},
		"clock on memory":           {[]string{"--clock", "local"}, "--clock is only for --backend redis"},
		"autopipeline on memory":    {[]string{"--redis-autopipeline"}, "--redis-autopipeline is only for --backend redis"},
		"redis autopipeline":        {[]string{"--backend", "redis", "--redis-addr", "x:1", "--redis-autopipeline=false"}, ""},
		"unknown backend":           {[]string{"--backend", "etcd"}, `--backend "etcd"`},
		"unknown clock":             {[]string{"--backend", "redis", "--redis-addr", "x:1", "--clock", "ntp"}, `--clock "ntp"`},
		"unknown failure mode":      {[]string{"--failure-mode", "panic"}, "--failure-mode"},
		"negative ban":              {[]string{"--ban-threshold", "-1"}, "must not be negative"},
		"ban without threshold":     {[]string{"--ban-threshold", "0"}, "needs a positive --ban-threshold"},
		"ban disabled":              {[]string{"--ban-threshold", "0", "--ban-duration", "0"}, ""},
		"bad key prefix":            {[]string{"--key-prefix", "a{b}"}, "--key-prefix"},
		"zero redis timeout":        {[]string{"--backend", "redis", "--redis-addr", "x:1", "--redis-timeout", "0"}, "--redis-timeout"},
		"negative memory max keys":  {[]string{"--memory-max-keys", "-1"}, "--memory-max-keys"},
		"empty grpc address":        {[]string{"--grpc-addr", ""}, "--grpc-addr is empty"},
		"zero drain timeout":        {[]string{"--drain-timeout", "0s"}, "--drain-timeout"},
		"budget over the deadline":  {[]string{"--backend", "redis", "--redis-addr", "x:1", "--redis-timeout", "38ms", "--check-deadline", "40ms"}, "above 90% of --check-deadline"},
		"check deadline on memory":  {[]string{"--check-deadline", "1s"}, "--check-deadline is only for --backend redis"},
		"batch window":              {[]string{"--backend", "redis", "--redis-addr", "x:1", "--redis-batch-window", "1ms"}, ""},
		"negative batch window":     {[]string{"--backend", "redis", "--redis-addr", "x:1", "--redis-batch-window", "-1ms"}, "--redis-batch-window"},
		"batch window over 5ms":     {[]string{"--backend", "redis", "--redis-addr", "x:1", "--redis-batch-window", "6ms"}, "want 0 to 5ms"},
		"batch window over timeout": {[]string{"--backend", "redis", "--redis-addr", "x:1", "--redis-timeout", "4ms", "--redis-batch-window", "3ms"}, "half of --redis-timeout"},
		"batch window unpipelined":  {[]string{"--backend", "redis", "--redis-addr", "x:1", "--redis-autopipeline=false", "--redis-batch-window", "1ms"}, "needs --redis-autopipeline"},
		"batch window on memory":    {[]string{"--redis-batch-window", "1ms"}, "--redis-batch-window is only for --backend redis"},
		"zero breaker rate":         {[]string{"--breaker-failure-rate", "0"}, "--breaker-failure-rate"},
		"negative fleet size":       {[]string{"--fleet-size", "-1"}, "--fleet-size"},
		"tiny fleet ttl":            {[]string{"--fleet-ttl", "10ms"}, "--fleet-ttl"},
		"local cache size zero":     {[]string{"--local-cache-size", "0"}, "--local-cache-size 0: must be at least 64KiB"},
		"local cache size tiny":     {[]string{"--local-cache-size", "1KiB"}, "--local-cache-size 1KiB"},
		"warmup timeout on memory":  {[]string{"--warmup-timeout", "1s"}, "--warmup-timeout is only for --backend redis"},
		"negative warmup timeout":   {[]string{"--backend", "redis", "--redis-addr", "x:1", "--warmup-timeout", "-1s"}, "--warmup-timeout"},
		"unbounded warmup":          {[]string{"--backend", "redis", "--redis-addr", "x:1", "--warmup-timeout", "0"}, ""},
		"no http connections":       {[]string{"--http-max-conns", "0"}, "--http-max-conns"},
		"no grpc connections":       {[]string{"--grpc-max-conns", "0"}, "--grpc-max-conns"},
		"http front-end":            {[]string{"--http-authz-addr", "127.0.0.1:0", "--http-authz-path-prefix", "/authz/", "--http-authz-max-conns", "10"}, ""},
		"prefix without front-end":  {[]string{"--http-authz-path-prefix", "/authz"}, "need --http-authz-addr"},
		"prefix not a path":         {[]string{"--http-authz-addr", "x:1", "--http-authz-path-prefix", "authz"}, "--http-authz-path-prefix"},
		"no front-end connections":  {[]string{"--http-authz-addr", "x:1", "--http-authz-max-conns", "0"}, "--http-authz-max-conns"},
		"rls header names":          {[]string{"--rls-config", "d", "--rls-response-headers", "--rls-header-names", "X-L,X-R,X-T"}, ""},
		"rls names without headers": {[]string{"--rls-config", "d", "--rls-header-names", "X-L,X-R,X-T"}, "needs --rls-response-headers"},
		"rls two names":             {[]string{"--rls-config", "d", "--rls-response-headers", "--rls-header-names", "X-L,X-R"}, "want three"},
		"rls bad name":              {[]string{"--rls-config", "d", "--rls-response-headers", "--rls-header-names", "X L,X-R,X-T"}, "not a valid HTTP header name"},
		"rls same names":            {[]string{"--rls-config", "d", "--rls-response-headers", "--rls-header-names", "X-L,X-L,X-T"}, "must differ"},
		"rls same names but case":   {[]string{"--rls-config", "d", "--rls-response-headers", "--rls-header-names", "X-L,x-l,X-T"}, "must differ"},
		"rls xds":                   {[]string{"--rls-xds-server", "cp:18001", "--rls-xds-node-id", "n", "--rls-xds-tls", "--rls-xds-tls-cert", "c", "--rls-xds-tls-key", "k", "--rls-xds-tls-ca", "ca", "--rls-xds-force-start"}, ""},
		"rls xds headers":           {[]string{"--rls-xds-server", "cp:18001", "--rls-response-headers"}, ""},
		"rls xds and config":        {[]string{"--rls-xds-server", "cp:18001", "--rls-config", "d"}, "exclude each other"},
		"rls xds flag without it":   {[]string{"--rls-xds-node-id", "n"}, "--rls-xds-node-id needs --rls-xds-server"},
		"rls xds no port":           {[]string{"--rls-xds-server", "cp"}, "want HOST:PORT"},
		"rls xds zero retry":        {[]string{"--rls-xds-server", "cp:1", "--rls-xds-retry-interval", "0s"}, "must be positive"},
		"rls xds cert without tls":  {[]string{"--rls-xds-server", "cp:1", "--rls-xds-tls-ca", "ca"}, "needs --rls-xds-tls"},
		"rls xds cert without key":  {[]string{"--rls-xds-server", "cp:1", "--rls-xds-tls", "--rls-xds-tls-cert", "c"}, "go together"},
		"ietf headers only":         {[]string{"--ratelimit-headers", "ietf"}, ""},
		"no rate-limit headers":     {[]string{"--ratelimit-headers", "none"}, ""},
		"unknown header families":   {[]string{"--ratelimit-headers", "draft-03"}, `--ratelimit-headers "draft-03": want both, ietf, x or none`},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			o, fs, err := parseServe(t, tc.args, nil)
			if err != nil {
				t.Fatal(err)
			}
			_, err = o.parse(func(n string) bool { return fs.Changed(n) })
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("unexpected error: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("err = %v, want %q", err, tc.want)
			}
		})
	}
}

// TestServeDeadline: the Redis budget lies within 90% of --check-deadline;
// a --redis-timeout above that raises the default deadline (and says so).
func TestServeDeadline(t *testing.T) {
	tests := map[string]struct {
		args             []string
		budget, deadline time.Duration
		raised           bool
	}{
		"defaults":               {nil, 36 * time.Millisecond, 40 * time.Millisecond, false},
		"longer deadline":        {[]string{"--check-deadline", "100ms"}, 90 * time.Millisecond, 100 * time.Millisecond, false},
		"redis timeout above it": {[]string{"--redis-timeout", "90ms"}, 90 * time.Millisecond, 100 * time.Millisecond, true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			o, fs, err := parseServe(t, append([]string{"--backend", "redis", "--redis-addr", "x:1"}, tc.args...), nil)
			if err != nil {
				t.Fatal(err)
			}
			c, err := o.parse(func(n string) bool { return fs.Changed(n) })
			if err != nil {
				t.Fatal(err)
			}
			if c.Redis.Timeout != tc.budget || c.CheckDeadline != tc.deadline || c.DeadlineRaised != tc.raised {
				t.Errorf("budget %s, deadline %s, raised %v; want %s, %s, %v", c.Redis.Timeout, c.CheckDeadline, c.DeadlineRaised, tc.budget, tc.deadline, tc.raised)
			}
		})
	}
}
