package main

import (
	"errors"
	"fmt"
	"io"

	"github.com/flashgate/flashgate/daemon"
	"github.com/flashgate/flashgate/descriptors"
	"github.com/flashgate/flashgate/rls"
	"github.com/spf13/cobra"
)

func newValidateCmd(e env) *cobra.Command {
	var file, rlsDir string
	cmd := &cobra.Command{
		Use:   "validate [--config FILE] [--rls-config DIR]",
		Short: "Check a descriptors file and print its rules",
		Long: `validate loads a descriptors file the way serve does (strictly: unknown keys
are errors) and prints its rules as a table. Without --config (or
FLASHGATE_CONFIG) it shows the built-in example.

An invalid file is reported as FILE:LINE:COL: message, every error on a
line of its own in file order (the first 20, then "and N more"), with exit
status 1.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var rlsErr error
			if rlsDir != "" {
				if rlsErr = validateRLS(e.stdout, rlsDir); file == "" {
					return listErrors(e.stderr, rlsErr)
				}
			}
			cfg, err := daemon.LoadRules(file)
			if err != nil || rlsErr != nil {
				return listErrors(e.stderr, rlsErr, err)
			}
			if err := cfg.WriteTable(e.stdout); err != nil {
				return fmt.Errorf("write: %w", err)
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&file, "config", "", "descriptors file (default: the built-in example)")
	cmd.Flags().StringVar(&rlsDir, "rls-config", "", "an envoyproxy/ratelimit config directory to check instead (with --config: both)")
	withEnv(cmd, e)
	return cmd
}

// listErrors writes the errors of each failed load of errs (nil for one
// that passed) to w, one FILE:LINE:COL: message a line (then "and N more"
// past descriptors.MaxErrors), and returns a summary in their place; one load
// that failed with one error that is not a list is returned as it is, and
// nil when none failed.
func listErrors(w io.Writer, errs ...error) error {
	var failed []error
	for _, err := range errs {
		if err != nil {
			failed = append(failed, err)
		}
	}
	var list descriptors.ConfigErrors // rls.ConfigErrors is the same type
	switch {
	case len(failed) == 0:
		return nil
	case len(failed) == 1 && !errors.As(failed[0], &list):
		return failed[0]
	}
	n := 0
	for _, err := range failed {
		if errors.As(err, &list) {
			n += list.Len()
		} else {
			n++
		}
		if _, werr := fmt.Fprintln(w, err); werr != nil {
			return fmt.Errorf("write: %w", werr)
		}
	}
	return fmt.Errorf("%d errors", n)
}

// validateRLS loads a ratelimit config directory and prints it. Errors in
// the files are *rls.ConfigError, unwrapped.
func validateRLS(w io.Writer, dir string) error {
	cfg, err := rls.LoadDir(dir)
	if err != nil {
		return err
	}
	if err := cfg.WriteTable(w); err != nil {
		return fmt.Errorf("write: %w", err)
	}
	return nil
}
