// Package descriptors is flashgate's descriptors file and its mapping: it
// loads the file (strict YAML, errors at FILE:LINE:COL), and maps a
// request's attributes (a [Request]: path, method, authority, headers,
// peer address, context extensions), whichever front-end read them, to the
// rate-limit hits of the rules it falls under ([Mapper]).
//
//	cfg, err := descriptors.LoadFile(path)         // or ParseConfig(name, data), ExampleConfig()
//	cfg.WriteTable(os.Stdout)                      // `flashgate validate`
//	p := descriptors.NewMapper(cfg, keys)          // once per Config
//	p.Map(req, shadowAll, &m)                      // per request: m.Hits, m.Rules, m.Missing
//
// # The file
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
//	        lease: {for: 50ms}         # leased admissions (window/lease); this rule only, not inherited
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
package descriptors
