// Command flashgate-bench is the load generator of flashgate's benchmarks
// and the do-nothing reference servers it measures against. It is not part
// of the sidecar: the flashgate binary and its image do not contain it.
//
//	flashgate-bench --addr A --duration D --concurrency N --users N --hot F [--path P] [--json] ...
//	    ext_authz Check (or, with --api rls, ShouldRateLimit; with --api http, requests to serve's
//	    HTTP front-end) from N workers; throughput, allowed/denied/errors, latency percentiles,
//	    and with --server-pid and --redis-addr the server's and Redis's CPU per check
//	flashgate-bench step --addr A [--idle 60s] --idle-rate R [--factor 50] [--peak 10s] ...
//	    the midnight step: checks on a fixed schedule, R a second for --idle, then --factor times as many
//	    at once; rows of 100 ms after the step (answered, p50/p99/max, checks slower than Envoy's
//	    ext_authz timeout and the 403s Envoy then sends, Redis calls and new connections per check)
//	flashgate-bench noop-server --addr A
//	    an ext_authz server with serve's gRPC settings that admits everything: the ceiling of a Go
//	    ext_authz server on the machine, measured with the same flags as serve
//	flashgate-bench noop-http-server --addr A [--ratelimit-fields]
//	    an HTTP server with the settings of serve's HTTP front-end that answers 200 to everything
//	    (with the rate-limit header fields of serve's admission): the reference of --api http
//
// The request is built by internal/checkreq, as `flashgate check` builds its
// own; requests are encoded once up front (or into a reused buffer per
// worker) and sent through a codec that reads only the answer's status
// code, so that the load generator spends its CPU on the transport. The
// scripts under scripts/ (bench-cost.sh, bench-ratelimit.sh, bench-http.sh,
// bench-cluster.sh, bench-step.sh) drive it; BENCHMARKS.md holds the figures and the
// commands behind them.
//
// main only calls run(ctx, args, stdout, stderr), which returns an error;
// main prints it once, after "flashgate-bench: ", and exits 1.
package main
