// Command flashgate is an Envoy ext_authz (gRPC v3) server enforcing exact
// sliding-window-log rate limits, and the operator tools around it: check,
// validate, bench and version. See DESIGN.md for the command-line contract.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, errorLine(err))
		os.Exit(1)
	}
}
