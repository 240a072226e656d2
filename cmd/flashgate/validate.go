package main

import (
	"errors"
	"fmt"
	"io"

	"github.com/flashgate/flashgate/extauthz"
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
			if rlsDir != "" {
				if err := validateRLS(e.stdout, rlsDir); err != nil || file == "" {
					return listErrors(e.stderr, err)
				}
			}
			cfg, err := loadConfig(file)
			if err != nil {
				return listErrors(e.stderr, err)
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

// loadConfig loads the descriptors file, or the built-in example for "".
// Errors in the file are *extauthz.ConfigError, unwrapped, so that they
// print as FILE:LINE:COL: message.
func loadConfig(file string) (*extauthz.Config, error) {
	if file == "" {
		cfg, err := extauthz.ExampleConfig()
		if err != nil {
			return nil, fmt.Errorf("built-in example: %w", err)
		}
		return cfg, nil
	}
	return extauthz.LoadFile(file)
}

// listErrors writes every error of a file that has several to w, one
// FILE:LINE:COL: message a line (then "and N more" past
// extauthz.MaxErrors), and returns a summary in their place; any other
// error is returned as it is.
func listErrors(w io.Writer, err error) error {
	var errs extauthz.ConfigErrors // rls.ConfigErrors is the same type
	if !errors.As(err, &errs) {
		return err
	}
	if _, werr := fmt.Fprintln(w, errs.Error()); werr != nil {
		return fmt.Errorf("write: %w", werr)
	}
	return fmt.Errorf("%d errors", errs.Len())
}
