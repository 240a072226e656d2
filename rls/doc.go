// Package rls serves Envoy's rate limit service API
// (envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit) on
// envoyproxy/ratelimit's config files, with flashgate's exact sliding
// windows: a drop-in for Envoy's envoy.filters.http.ratelimit filter.
// docs/ratelimit.md gives the config schema and the answer field by field.
//
//	cfg, err := rls.LoadDir(dir)
//	srv, err := rls.NewServer(cfg, rls.Options{Core: core, Keys: keys})
//	srv.Register(h)
//	go srv.Reloader(dir).Watch(ctx, 0) // or srv.Pusher(source) (package rls/xds)
//
// Matching is ratelimit's GetLimit (match.go). Each descriptor
// becomes one window.Hit, counting hits_addend as its Cost, decided by the
// enforcement core (package enforce) in one call, all or nothing: a
// request is admitted only if every enforcing descriptor has room, and a
// denied one is recorded in none (ratelimit instead increments every
// descriptor). A limit of 0, or a hits_addend above window.MaxRequests,
// refuses without asking the backend.
//
// Each status whose window the decision counted reports that window's own
// numbers. Where none was counted (a refusal by the guard, a penalty box,
// a failed backend), only the refusing descriptor carries a current_limit,
// so that Envoy's x-ratelimit headers, taken from the status with the
// fewest remaining, name the refusing limit.
//
// Under the core's shadow the overall code is OK while an over-limit
// status still says OVER_LIMIT; under its own shadow_mode a descriptor's
// status says OK. Request values reach no log line, metric label or error,
// and reach Redis keys only through window.Keys.
package rls
