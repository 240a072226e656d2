package main

import (
	"errors"
	"fmt"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// envPrefix starts the environment variable of every serve flag.
const envPrefix = "FLASHGATE_"

// envName returns the environment variable of flag name:
// "redis-addr" → "FLASHGATE_REDIS_ADDR".
func envName(flag string) string {
	return envPrefix + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
}

// withEnv lets every flag of cmd be set from its FLASHGATE_<FLAG>
// environment variable (flags win) and says so in the help.
func withEnv(cmd *cobra.Command, e env) { withEnvOf(cmd, cmd.Flags(), e) }

// withEnvOf is withEnv for the flags of fs only, which are cmd's too
// (added with AddFlagSet).
func withEnvOf(cmd *cobra.Command, fs *pflag.FlagSet, e env) {
	fs.VisitAll(func(f *pflag.Flag) {
		f.Usage += fmt.Sprintf(" [$%s]", envName(f.Name))
	})
	next := cmd.PreRunE
	cmd.PreRunE = func(cmd *cobra.Command, args []string) error {
		if err := bindEnv(fs, e.lookupEnv); err != nil {
			return err
		}
		if next != nil {
			return next(cmd, args)
		}
		return nil
	}
}

// bindEnv sets every flag of fs that was not given on the command line from
// its environment variable, when that is set. It must run after the command
// line is parsed. The errors name the variable.
func bindEnv(fs *pflag.FlagSet, lookup func(string) (string, bool)) error {
	var errs []error
	fs.VisitAll(func(f *pflag.Flag) {
		if f.Changed || f.Name == "help" {
			return
		}
		name := envName(f.Name)
		v, ok := lookup(name)
		if !ok {
			return
		}
		if err := fs.Set(f.Name, v); err != nil {
			errs = append(errs, fmt.Errorf("%s=%q: %w", name, v, err))
		}
	})
	return errors.Join(errs...)
}
