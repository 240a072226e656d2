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
	go func() {
		// After the first signal starts the drain, restore the default
		// handling, so that a second SIGTERM or Ctrl-C ends the process now.
		<-ctx.Done()
		stop()
	}()
	err := run(ctx, programArgs(os.Args), os.Stdout, os.Stderr)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, errorLine(err))
		os.Exit(1)
	}
}
