// Package extauthz is flashgate's Envoy ext_authz (gRPC, API v3) server: it
// maps each CheckRequest to rate-limit hits under a descriptors file,
// asks a window.Limiter, and answers OK or a 429 (with retry-after and an
// RFC 9457 application/problem+json body naming the rule), both with the
// rate-limit headers package enforce defines: RateLimit-Policy and
// RateLimit (one item per rule that decided), x-ratelimit-limit,
// -remaining and -reset of the binding rule, as the families of
// enforce.Options.Headers say. OK headers go in
// OkHttpResponse.response_headers_to_add (to the client), a denial's in
// DeniedHttpResponse.headers; header names are lower case.
//
// # API
//
//	cfg, err := descriptors.LoadFile(path)         // or ParseConfig(name, data), ExampleConfig()
//	core, err := enforce.New(enforce.Options{
//	        Limiter:  stack,                       // e.g. guard.NewGuard(fb.Watch(guard.NewBreaker(guard.NewBudget(redisstore.New(…))))), built once
//	        Fallback: fb,                          // failure mode "local": a *fallback.Fallback (window/fallback)
//	        FailureMode: mode, Shadow: shadow, Headers: enforce.FamiliesBoth, Registerer: reg, Logger: log,
//	})
//	srv, err := extauthz.NewServer(cfg, extauthz.Options{Core: core, Keys: keys})
//	h, err := host.New(host.Options{GRPC: lis, Codec: srv.Codec(), ...})   // the process's gRPC server (package host)
//	srv.Register(h)                                // Check on any grpc.ServiceRegistrar
//	r := srv.Reloader(path)                        // enforce.Reloader of the descriptors file
//	go r.Watch(ctx, 0)                             // hot reload (ConfigMap symlink swaps too)
//	r.Reload()                                     // on SIGHUP
//
// # Descriptors file
//
// The rules, and how a request maps to hits under them, are package
// descriptors'; Check reads a CheckRequest into the descriptors.Request
// they map (headers from the headers map, else header_map; the peer from
// source.address; context_extensions). [Server.Decide] decides a request
// another front-end read into one, and gives it the core's answer to write
// in its own wire form.
//
// # Decisions
//
// A check's hits go to the enforcement core (package enforce), which asks
// the limiter in one call, all or nothing. The limiter is the whole stack:
// its deadline, circuit breaker and local cache are the wiring's choice
// (package window/guard), not the server's. If it fails (an error, a timeout,
// window.ErrBreakerOpen) the core applies the failure modes: deny if any
// enforcing hit's mode is deny; else the hits in mode local go to the
// fallback, told the cause; else allow. Check writes the core's verdict
// into a response; it never returns a gRPC error.
//
// Metrics: flashgate_checks_total{domain,rule,decision} counts
// each check once, under the binding rule ("" when none matched); decision
// "error" means the backend failed and failure mode allow or deny answered
// without a decision (a local fallback decision counts as allowed/denied).
// The core counts flashgate_backend_errors_total,
// flashgate_failure_mode_decisions_total, flashgate_local_denials_total and
// flashgate_redis_duration_seconds, under the names ext_authz registers
// with it (frontEnd in metrics.go).
package extauthz
