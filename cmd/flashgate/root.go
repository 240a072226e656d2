package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/flashgate/flashgate/descriptors"

	"github.com/spf13/cobra"
)

// env is what the commands take from the process: output streams and the
// environment. Tests build their own.
type env struct {
	stdout, stderr io.Writer
	// lookupEnv reads an environment variable, as os.LookupEnv.
	lookupEnv func(string) (string, bool)
	// environ lists the environment as NAME=value, as os.Environ; nil: empty.
	environ func() []string
}

// run executes the flashgate command line args (without the program name).
// It returns the error that should end the process with exit code 1; the
// caller prints it. ctx is cancelled on SIGINT/SIGTERM.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return runEnv(ctx, args, env{stdout: stdout, stderr: stderr, lookupEnv: os.LookupEnv, environ: os.Environ})
}

func runEnv(ctx context.Context, args []string, e env) error {
	root := newRootCmd(e)
	root.SetArgs(args)
	return root.ExecuteContext(ctx)
}

func newRootCmd(e env) *cobra.Command {
	root := &cobra.Command{
		Use:   "flashgate",
		Short: "Exact sliding-window rate limits for Envoy ext_authz, on Redis",
		Long: `flashgate is an Envoy ext_authz (gRPC, API v3) server that enforces exact
sliding-window-log rate limits on Redis (or in memory), and the tools to
probe and validate it.`,
		SilenceUsage:  true,
		SilenceErrors: true,
		// No arguments: print help rather than succeed silently.
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	root.SetOut(e.stdout)
	root.SetErr(e.stderr)
	root.SetFlagErrorFunc(func(cmd *cobra.Command, err error) error {
		return fmt.Errorf("%w (see '%s --help')", err, cmd.CommandPath())
	})
	root.CompletionOptions.DisableDefaultCmd = true
	root.AddCommand(
		newServeCmd(e),
		newCheckCmd(e),
		newValidateCmd(e),
		newVersionCmd(e),
		newInspectCmd(e),
		newBansCmd(e),
		newLimitsCmd(e),
		newRatelimitCmd(e),
	)
	return root
}

// errorLine formats the error that ends the process, for stderr: an error
// in a descriptors file or a ratelimit config file as it is
// ("FILE:LINE:COL: message"), anything else after "flashgate: ".
func errorLine(err error) string {
	var ce *descriptors.ConfigError // rls.ConfigError is the same type
	if errors.As(err, &ce) && err == error(ce) {
		return ce.Error()
	}
	return "flashgate: " + err.Error()
}
