// Package proxytest starts real nginx and Caddy processes for tests, with
// flashgate's shipped configurations (proxy/nginx/flashgate.conf,
// proxy/caddy/Caddyfile) rendered for free loopback ports, plus the two
// parties a proxy talks to: an Upstream that counts what reaches the app,
// and an Authorizer, a small stand-in for flashgate's HTTP front-end for the
// tests of the configurations themselves (the end-to-end tests run the real
// flashgate serve instead).
//
// Rendering replaces only addresses: each default address of a shipped file
// (its listener, flashgate's 127.0.0.1:9193, the app's 127.0.0.1:8081,
// Caddy's admin endpoint and default bind) must occur exactly once, or the
// test fails saying which, so that the file under test is the file shipped.
//
// Nothing depends on a system service: each process gets its own
// configuration, pid, log, temporary and data directories under
// t.TempDir(), and is stopped in t.Cleanup. nginx runs as one process
// (master_process off, the same request handling as under a master) so that
// neither a kill nor the test process's death (Pdeathsig on Linux) leaves a
// worker behind. When nginx or caddy is missing, the test fails with a
// one-line hint, after installing Debian's package when it runs as root with
// apt-get at hand (as make installs redis-server); it never skips.
package proxytest
