// Command flashgate is an Envoy ext_authz (gRPC, API v3) server enforcing
// exact sliding-window-log rate limits on Redis or in memory, and the
// operator tools around it. docs/configuration.md holds the command-line contract.
//
//	flashgate serve     the server; every flag also as FLASHGATE_<FLAG>
//	flashgate check     an ext_authz client: one CheckRequest, n times, one line per answer
//	flashgate validate  load a descriptors file and print its rules (errors FILE:LINE:COL)
//	flashgate version   module version and VCS commit from the build info
//	flashgate inspect   one key's window and ban in serve's Redis (ops.go: keys derived as serve does)
//	flashgate bans      list, add and lift the fleet's bans in serve's Redis
//	flashgate ratelimit serve configured by envoyproxy/ratelimit's environment (also as a binary named ratelimit)
//
// The load generator and the do-nothing reference server are not in this
// binary: they are cmd/flashgate-bench.
//
// main only calls run(ctx, args, stdout, stderr), which returns an error;
// main prints it once and exits 1. Descriptors-file errors print as
// FILE:LINE:COL: message; everything else after "flashgate: ". Commands read
// nothing from package state: tests run them in-process through run.
package main
