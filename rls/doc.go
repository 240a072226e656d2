// Package rls serves Envoy's rate limit service API
// (envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit) on
// envoyproxy/ratelimit's config files, with flashgate's exact sliding
// windows: a drop-in for Envoy's envoy.filters.http.ratelimit filter.
//
// # API
//
//	cfg, err := rls.LoadDir(dir)                 // ratelimit's config directory; errors are *ConfigError or ConfigErrors
//	core, err := enforce.New(enforce.Options{...}) // the one ext_authz uses too: limiter stack, failure modes
//	srv, err := rls.NewServer(cfg, rls.Options{Core: core, Keys: keys, ResponseHeaders: true})
//	srv.Register(h)                              // on the process's gRPC server (package host)
//	r := srv.Reloader(dir)                       // enforce.Reloader of the directory
//	go r.Watch(ctx, 0)                           // reload on change; a bad directory keeps the old config
//	r.Reload()                                   // on SIGHUP
//	p := srv.Pusher("xds://cp:18001")            // or: configs pushed from elsewhere (package rls/xds)
//	err = p.Push(files)                          // the whole config, checked as a directory's; a bad one keeps the old
//
// # Config directory
//
// LoadDir reads dir/config/*.yaml when dir holds a config subdirectory
// (ratelimit's RUNTIME_ROOT/RUNTIME_SUBDIRECTORY layout), else dir/*.yaml
// and dir/*.yml; dot files are skipped. One domain per file, in
// ratelimit's schema: domain, descriptors (nested), key, value (exact, or a
// wildcard: each * matches any run of characters, as in foo*bar or a
// trailing prefix*), rate_limit {unit, requests_per_unit, unit_multiplier,
// name, unlimited, replaces: [{name}]}, shadow_mode, share_threshold,
// detailed_metric, value_to_metric, quota_mode (enforced as an ordinary
// limit, logged when loaded), metadata (any YAML, ignored: flashgate sends
// no dynamic metadata). Units: second, minute,
// hour, day, week (month and year are refused: flashgate's windows are at
// most window.MaxWindow). Loading refuses what ratelimit refuses (empty or
// duplicate domain, empty key, duplicate key and value at one level, bad
// unit, unlimited with a unit, empty or self replaces, unknown keys) and a
// few things more, each a *ConfigError at FILE:LINE:COL; ConfigErrors holds
// them when there are several.
//
// # Matching
//
// As ratelimit's GetLimit: for each entry of a request descriptor, the
// config entry with its key and value, else the first wildcard of its key
// (in file order) that the value matches, else the entry of the key
// without a value;
// the limit is the last entry's node's. A descriptor's own limit override
// replaces the config's (when its unit is one flashgate enforces). A rule
// named in another matched rule's replaces is dropped. unlimited matches and
// never counts. requests_per_unit 0 always refuses.
//
// # Decisions
//
// A request's descriptors become one window.Hit each (key
// Keys.Key("rls."+domain, window and entries), a share_threshold
// wildcard's pattern standing for the value), decided by one
// Limiter.Decide, each counting hits_addend requests (the descriptor's
// own, else the request's; 0 counts as 1, a descriptor's own 0 too, which
// ratelimit takes as "check without counting") as window.Hit.Cost; a
// descriptor whose limit is 0 or whose hits_addend exceeds
// window.MaxRequests refuses without asking the backend. All or nothing: a request is admitted only if every
// enforcing descriptor has room, and then recorded in each; a denied request
// is recorded in none. ratelimit instead increments every descriptor and
// answers OVER_LIMIT if any is over. shadow_mode descriptors never deny.
//
// Statuses: each descriptor whose window the decision counted reports that
// window's own numbers (window.HitReporter): limit_remaining exact, and
// duration_until_reset, over its limit, the time until it admits again,
// else the time until its window's oldest counted admission leaves it
// (window.HitReport.Reset: one more request fits then), which ticks down
// as ratelimit's fixed window's does; the window's length when unknown.
// duration_until_reset is whole seconds, rounded up, at least 1: Envoy's
// x-ratelimit-reset reads its seconds alone. Where no window was counted
// (the guard of window/guard refused on another descriptor's full window,
// a penalty box, or the backend failed), only the refusing descriptor's
// numbers are exact: on a refusal the others carry no current_limit, so
// that Envoy's x-ratelimit headers, taken from the status with a
// current_limit and the fewest remaining (the first among equals), name
// the refusing limit (unless an over-limit shadow_mode descriptor, which
// keeps its limit as in ratelimit, comes first); on an admission they report 0 remaining or the
// binding hit's.
//
// Under the core's shadow (enforce.Options.Shadow: --shadow, ratelimit's
// global SHADOW_MODE) the overall code is OK while an over-limit
// descriptor's status still says OVER_LIMIT; under its own shadow_mode a
// descriptor's status says OK.
//
// A request may carry at most MaxDescriptors descriptors of at most
// MaxEntries entries (else InvalidArgument). Request values reach no log
// line, metric label or error message, and reach Redis keys only through
// window.Keys (bounded, hashed when long or outside a safe alphabet).
//
// The hits go to the enforcement core (package enforce), which asks the
// limiter once; when it fails, each rule's failure mode (its failure_mode,
// else the core's) decides: OVER_LIMIT if an enforcing rule's mode is
// deny; else the rules of mode local by the in-process fallback; else OK.
//
// Every answer's response_headers_to_add carries the rate-limit headers
// of the core's families (enforce.Options.Headers, see package enforce):
// RateLimit-Policy of every descriptor with a limit (a policy named by
// its rule's Label, "override" for a request's own limit), RateLimit of
// each whose window the decision counted, x-ratelimit-limit, -remaining
// and -reset of the binding descriptor (the refusing one, else the one
// with the fewest remaining), and on OVER_LIMIT retry-after and
// content-type application/problem+json with the problem in raw_body,
// which Envoy's ratelimit filter sends as the 429's body (its status
// member says 429, Envoy's default rate_limited_status). A limit that can
// never fit (requests_per_unit: 0) refuses with t and retry-after of its
// window. Envoy adds these headers to the client's response on OK as on
// OVER_LIMIT. With Options.OmitExtras an answer has no retry-after,
// content-type, raw_body or x-ratelimit-shadow: with the families none it
// is ratelimit's answer, field for field.
//
// ratelimit's own response headers (Options.ResponseHeaders) are added
// after them, named as ratelimit's defaults, RateLimit-Limit,
// RateLimit-Remaining and RateLimit-Reset, unless Options.HeaderNames says
// otherwise; a name of ours they take is sent once, as theirs.
//
// Metrics (labels from the config only):
// flashgate_rls_request_duration_seconds,
// flashgate_rls_config_reloads_total{result}; the core counts
// flashgate_rls_requests_total{domain,rule,decision} (under the rule that
// bound the call), flashgate_rls_backend_errors_total{kind},
// flashgate_rls_failure_mode_decisions_total{mode} and
// flashgate_rls_local_denials_total{reason}, under the names the RLS
// registers with it (frontEnd in metrics.go).
package rls
