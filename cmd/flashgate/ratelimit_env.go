package main

// Running as envoyproxy/ratelimit (binary called "ratelimit", or the
// ratelimit command): serve configured by ratelimit's environment through
// daemon/ratelimitenv. Precedence: command line, then FLASHGATE_<FLAG>,
// then ratelimit's variable, then ratelimit's default, then serve's.

import (
	"errors"
	"path/filepath"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/flashgate/flashgate/daemon"
	"github.com/flashgate/flashgate/daemon/ratelimitenv"
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
	var scratch serveOptions
	fs := pflag.NewFlagSet("defaults", pflag.ContinueOnError)
	scratch.addFlags(fs)
	ratelimitenv.SetDefaults(cmd.Flags(), fs)
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
		notHonoured, err := ratelimitenv.Apply(cmd.Flags(), e.lookupEnv, environ)
		if err != nil {
			return err
		}
		if len(notHonoured) > 0 {
			level, _ := cmd.Flags().GetString("log-level")
			format, _ := cmd.Flags().GetString("log-format")
			h, err := daemon.NewLogHandler(e.stderr, level, format)
			if err != nil {
				return err
			}
			ratelimitenv.LogNotHonoured(h, notHonoured)
		}
		if !cmd.Flags().Changed("rls-config") && !cmd.Flags().Changed("rls-xds-server") {
			return errors.New("no ratelimit config: CONFIG_TYPE=FILE (the default) with RUNTIME_ROOT, or CONFIG_TYPE=GRPC_XDS_SOTW in a build with --rls-xds-server")
		}
		return nil
	}
	return cmd
}
