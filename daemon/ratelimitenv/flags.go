package ratelimitenv

import (
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"

	"github.com/spf13/pflag"
)

// Apply sets the flags of fs, serve's, that are still unset from
// ratelimit's variables (lookup, environ: see [Translate]), and returns
// the variables set but not honoured, each with its reason. A variable
// whose flag this build lacks is not honoured.
func Apply(fs *pflag.FlagSet, lookup func(string) (string, bool), environ []string) (map[string]string, error) {
	res, err := Translate(lookup, environ)
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

// SetDefaults makes fs, serve's flags, the ratelimit command's: ratelimit's
// answers and its wait for Redis become the flags' values, and each flag a
// variable sets names it in its usage and shows, as its default, what
// ratelimit's default sets it to (Apply sets it so at start). scratch is
// a fresh set of serve's flags, which it spends.
func SetDefaults(fs, scratch *pflag.FlagSet) {
	for name, v := range map[string]string{"ratelimit-headers": "none", "rls-extras": "false", "redis-timeout": "500ms", "check-deadline": "1s"} {
		if f := fs.Lookup(name); f != nil && f.Value.Set(v) == nil {
			f.DefValue = v
		}
	}
	// What ratelimit's defaults alone set, in an empty environment.
	// (REDIS_URL's default, a unix socket, sets nothing: flashgate needs
	// REDIS_SOCKET_TYPE=tcp.)
	_, _ = Apply(scratch, func(string) (string, bool) { return "", false }, nil)
	names := map[string][]string{}
	for _, r := range vars {
		if r.Flag != "" && !slices.Contains(names[r.Flag], r.Name) {
			names[r.Flag] = append(names[r.Flag], r.Name)
		}
	}
	fs.VisitAll(func(f *pflag.Flag) {
		if n := names[f.Name]; len(n) > 0 {
			f.Usage += " [ratelimit: $" + strings.Join(n, ", $") + "]"
		}
		if d := scratch.Lookup(f.Name); d != nil && d.Changed {
			f.DefValue = d.Value.String()
		}
	})
}

// LogNotHonoured writes the variables not honoured to h, once, as one
// warning.
func LogNotHonoured(h slog.Handler, notHonoured map[string]string) {
	if len(notHonoured) == 0 {
		return
	}
	attrs := make([]any, 0, 2*len(notHonoured))
	for _, n := range slices.Sorted(maps.Keys(notHonoured)) {
		attrs = append(attrs, n, notHonoured[n])
	}
	slog.New(h).Warn("ratelimit settings not honoured", attrs...)
}
