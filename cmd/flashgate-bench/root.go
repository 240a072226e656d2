package main

import (
	"context"
	"fmt"
	"io"

	"github.com/spf13/cobra"
)

// env is where the commands write: tests pass their own buffers.
type env struct {
	stdout, stderr io.Writer
}

// run executes the flashgate-bench command line args (without the program
// name). It returns the error that should end the process with exit code
// 1; the caller prints it. ctx is cancelled on SIGINT/SIGTERM.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	root := newRootCmd(env{stdout: stdout, stderr: stderr})
	root.SetArgs(args)
	return root.ExecuteContext(ctx)
}

// newRootCmd returns the load generator's command, with the reference
// servers it measures against (gRPC and HTTP) as subcommands.
func newRootCmd(e env) *cobra.Command {
	root := newBenchCmd(e)
	root.SilenceUsage = true
	root.SilenceErrors = true
	root.SetOut(e.stdout)
	root.SetErr(e.stderr)
	root.SetFlagErrorFunc(func(cmd *cobra.Command, err error) error {
		return fmt.Errorf("%w (see '%s --help')", err, cmd.CommandPath())
	})
	root.CompletionOptions.DisableDefaultCmd = true
	root.AddCommand(newNoopServerCmd(e), newNoopHTTPServerCmd(e), newStepCmd(e))
	return root
}
