// Package e2e holds flashgate's end-to-end fault and abuse tests: Redis and
// sidecars killed, slowed and restarted, floods and bad input. It has no library code: everything is in the
// _test.go files.
//
// The tests treat flashgate as a black box, through the contracts of
// the README and docs/ only (CLI, flags, responses, metrics): TestMain builds ./cmd/flashgate once (with -race when the
// tests run with -race), every test starts its own `flashgate serve`
// processes on free loopback ports and its own redis-server processes
// (window/redistest), talks to them over ext_authz gRPC, grpc.health.v1 and
// the HTTP /metrics and /readyz endpoints, and inspects Redis directly.
// A TCP proxy in the tests sits between flashgate and Redis to add latency,
// blackhole traffic and count connections and bytes. TestHTTPFrontBehindProxies
// puts real nginx and caddy processes (internal/testing/proxytest, the shipped proxy/
// configs) between a client and flashgate's HTTP front-end.
//
// TestRatelimitSuite and TestRatelimitSuiteXDS run envoyproxy/ratelimit's
// own integration cases against `flashgate serve --rls-config` and
// `--rls-xds-server` on each Redis topology and over TLS and mTLS, and log
// how many steps pass, differ as documented, or wait for a pending fix
// (docs/ratelimit.md).
//
// Loads go to loopback only and are bounded in count and time. The
// key-cardinality flood sends 100,000 distinct users by default; set
// FLASHGATE_E2E_LONG=1 (or pass -long) for the 1,000,000-user variant, which
// belongs with the benchmarks rather than in `make test`.
//
// BenchmarkLeasedFleet and BenchmarkLeasedFleetSweep are the leased global
// limit at a flash sale's scale, twelve and up to twenty-four sidecars at
// once, too heavy for the tests on a small machine: each run holds every
// window of the callers' admissions to its bound and fails loudly if one is
// over, and reports the admissions per second and Redis's script calls and
// CPU per admitted check (BENCHMARKS.md, "Leased admissions", has the
// command).
package e2e
