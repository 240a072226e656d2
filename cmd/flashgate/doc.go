// Command flashgate is an Envoy ext_authz (gRPC, API v3) server enforcing
// exact sliding-window-log rate limits on Redis or in memory, and the
// operator tools around it. The README holds the command-line contract.
//
//	flashgate serve     the server; every flag also as FLASHGATE_<FLAG>
//	flashgate check     an ext_authz client: one CheckRequest, n times, one line per answer
//	flashgate validate  load a descriptors file and print its rules (errors FILE:LINE:COL)
//	flashgate bench     a load generator against a running server
//	flashgate version   module version and VCS commit from the build info
//
// A hidden command, `flashgate noop-server --addr A`, is a benchmarking aid:
// an ext_authz server with serve's gRPC settings that admits everything, the
// ceiling `flashgate bench` compares serve against with the same flags.
//
// main only calls run(ctx, args, stdout, stderr), which returns an error;
// main prints it once and exits 1. Descriptors-file errors print as
// FILE:LINE:COL: message; everything else after "flashgate: ". Commands read
// nothing from package state: tests run them in-process through run.
package main
