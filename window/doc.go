// Package window is the contract of exact sliding-window-log rate limiting
// that the front-ends and the stores share.
//
// A [Limit] allows at most Requests admissions in any span of length Window.
// A request is described by its [Hit]s: one (key, limit) pair per matching
// rule. A [Limiter] decides all hits of one request together, all or nothing:
// the request is admitted only if every enforcing hit is under its limit, and
// only an admitted request is recorded, in every window it matched. A Limit
// is an exact log (one entry per admission) or, with Limit.Buckets, a
// bounded-memory window of sub-window counters that never over-admits either
// and refuses at most one sub-window early (see [Limit]).
//
// The implementations live beside it, by role, each behind window's types
// only:
//
//   - window/memory: the in-process store, an exact log per key; the
//     embedded default and the reference the Redis store is held against.
//   - window/redisstore: the Redis store (one Lua script on a sorted set per
//     key, time from Redis), its auto-pipeline and its client factory.
//   - window/guard: the decorators of any Limiter: the Guard (local
//     over-limit cache and penalty box), the Breaker and the Budget.
//   - window/fallback: failure mode "local": the fleet-aware Fallback, its
//     write-back, and the Fleet heartbeat.
//   - window/windowtest: the conformance table every store passes.
//
// A store builds its [Decision] with [Resolve] from one [HitState] per hit,
// after [ValidateHits]. [Classify] names a failure's kind for the breaker
// and for metrics. Keys are built by [Keys]: a prefix, a server-generated
// hash tag, the rule name and the value, with long or unsafe values hashed,
// so that nothing an attacker sends can choose a Redis Cluster slot, grow a
// key without bound, or make two different (rule, value) pairs share a
// window. [Admitted] is what a fallback writes back to a store.
package window
