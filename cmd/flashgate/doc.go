// Command flashgate is an Envoy ext_authz, RLS and HTTP forward-auth
// rate-limit server, and the operator tools around it: serve, check,
// validate, version, inspect, bans, limits and ratelimit (serve configured
// by envoyproxy/ratelimit's environment, also as a binary named
// ratelimit). It turns flags and environment into the options of the
// library packages (daemon, daemon/ratelimitenv, daemon/keyadmin,
// internal/checkreq), which also render the results it prints;
// docs/configuration.md holds the command-line contract. main only calls
// run(ctx, args, stdout, stderr) and exits 1 on its error.
package main
