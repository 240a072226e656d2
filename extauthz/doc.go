// Package extauthz is flashgate's Envoy ext_authz (gRPC, API v3) server: it
// loads the descriptors file, maps each CheckRequest to rate-limit hits,
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
//	cfg, err := extauthz.LoadFile(path)            // or ParseConfig(name, data), ExampleConfig()
//	cfg.WriteTable(os.Stdout)                      // `flashgate validate`
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
// envoyproxy/ratelimit's shape plus flashgate's additions; see
// flashsale.yaml, the built-in example:
//
//	domain: flashsale                  # required; [A-Za-z0-9._-]
//	client_ip: {trusted_hops: 0}       # 0: Envoy's source.address; N: Nth entry from the right of x-forwarded-for
//	path_case: sensitive               # or insensitive: paths and path patterns ASCII-folded
//	sources:                           # descriptor key → where its value comes from
//	  uid:  {request_headers: {header_name: x-uid}}
//	  ip:   {remote_address: {}}
//	  path: {request_path: {}}         # path without query, canonical (package internal/reqpath)
//	  m:    {request_method: {}}
//	  host: {authority: {}}
//	  t:    {context_extension: {key: tenant}}   # Envoy per-route context_extensions
//	descriptors:                       # nested; every node with rate_limit is a rule
//	  - key: path                      # keys remote_address, path, method, authority, host need no source
//	    value: /api/coupon/*           # exact, or prefix with a trailing *
//	    descriptors:
//	      - key: uid
//	        name: coupon_per_uid       # optional, unique, [A-Za-z0-9._-], ≤ 64; default derived ("path_api_coupon.uid")
//	        rate_limit: {requests: 5, window: 1s}   # or {unit: second|minute|hour|day, requests_per_unit: N}
//	        shadow_mode: false
//	        failure_mode: local        # local | allow | deny; default: the core's (enforce.Options.FailureMode)
//	        on_missing: skip           # skip | deny
//	        local_share: 2             # per-sidecar admissions while Redis is down; default ceil(requests / fleet size)
//	        ban: {threshold: 5, window: 10s, duration: 5m}   # asks for a penalty box; {} takes serve's --ban-* flags
//
// shadow_mode, failure_mode, on_missing, local_share and ban are inherited by nested
// descriptors unless they set their own. A rule without ban is never banned;
// ban: {} asks for the penalty box of serve's --ban-* flags, and the fields
// a ban sets override theirs; ban: {duration: 0} turns an inherited one off. A descriptor with a value puts its
// pattern, not the request's value, in the limit key; one without puts the
// request's value: the example has one bucket per x-uid across every
// /api/coupon/ path. The key is window.Keys.Key(rule, parts), parts joined
// unambiguously (one part as is; several length-prefixed). A value that is
// absent or empty never becomes a shared bucket: the rule is skipped, or the
// request refused under on_missing: deny. A value of any length counts: long
// or unsafe values are hashed (SHA-256) by window.Keys, so a padded x-uid is
// a bucket of its own, never a way around the rule; the request itself is
// capped by the gRPC message limit (host.MaxRecvMsgSize).
// Loading is strict: unknown or duplicate keys, anchors and tags are
// errors, each reported as FILE:LINE:COL: sentence: a [ConfigError], or
// [ConfigErrors] when a file has several.
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
