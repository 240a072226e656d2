package main

// Running as envoyproxy/ratelimit (binary called "ratelimit", or the
// ratelimit command): serve configured by ratelimit's environment through
// daemon/ratelimitenv. Precedence: command line, then FLASHGATE_<FLAG>,
// then ratelimit's variable, then ratelimit's default, then serve's.

import (
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"path/filepath"
	"slices"
	"strings"

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

// applyRatelimitEnv sets the flags of fs that are still unset from
// ratelimit's variables (lookup, environ) by ratelimitenv's table, and
// returns the variables set but not honoured, each with its reason.
func applyRatelimitEnv(fs *pflag.FlagSet, lookup func(string) (string, bool), environ []string) (map[string]string, error) {
	res, err := ratelimitenv.Translate(lookup, environ)
	done := map[string]bool{} // flags set here: the first row of a flag wins
	errs := []error{err}
	for _, s := range res.Settings {
		f := fs.Lookup(s.Flag)
		switch {
		case f == nil:
			if s.Explicit {
				res.NotHonoured[s.Name] = fmt.Sprintf("not honoured yet: this build has no --%s", s.Flag)
			}
			continue
		case f.Changed || done[s.Flag]:
			continue
		}
		if err := fs.Set(s.Flag, s.Value); err != nil {
			errs = append(errs, fmt.Errorf("%s=%q (--%s): %w", s.Name, s.Raw, s.Flag, err))
			continue
		}
		done[s.Flag] = true
	}
	return res.NotHonoured, errors.Join(errs...)
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
		if err := logNotHonoured(e, cmd.Flags(), res); err != nil {
			return err
		}
		if !cmd.Flags().Changed("rls-config") && !cmd.Flags().Changed("rls-xds-server") {
			return errors.New("no ratelimit config: CONFIG_TYPE=FILE (the default) with RUNTIME_ROOT, or CONFIG_TYPE=GRPC_XDS_SOTW in a build with --rls-xds-server")
		}
		return nil
	}
	return cmd
}

// ratelimitAnswerDefaults are the ratelimit command's defaults of serve's
// flags that no variable of ratelimit's sets: ratelimit's answers, and its
// wait for Redis.
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
	for _, r := range ratelimitenv.Vars() {
		if r.Flag != "" && !slices.Contains(vars[r.Flag], r.Name) {
			vars[r.Flag] = append(vars[r.Flag], r.Name)
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

// logNotHonoured writes the variables not honoured, once, in one warning of
// serve's logger format.
func logNotHonoured(e env, fs *pflag.FlagSet, notHonoured map[string]string) error {
	if len(notHonoured) == 0 {
		return nil
	}
	level, _ := fs.GetString("log-level")
	format, _ := fs.GetString("log-format")
	h, err := daemon.NewLogHandler(e.stderr, level, format)
	if err != nil {
		return err
	}
	attrs := make([]any, 0, 2*len(notHonoured))
	for _, n := range slices.Sorted(maps.Keys(notHonoured)) {
		attrs = append(attrs, n, notHonoured[n])
	}
	slog.New(h).Warn("ratelimit settings not honoured", attrs...)
	return nil
}
