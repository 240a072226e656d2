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
//
// # Per-hit policy and results
//
// A [Hit] holds what every store needs (key, rule name, limit, cost,
// shadow) and one opaque Tag for the rest. A layer with a per-rule setting
// declares a one-method interface where it is used (guard.RuleBan for the
// penalty box, fallback.RuleShare for the local share) and asserts it on
// the hit's Tag; the front-ends tag each hit with the rule that made it,
// which implements them. A per-hit result travels the same way: a store
// reports a hit's own window to its Tag if that is a [HitReporter] (the
// ratelimit service's tags hold a report beside the rule). So the contract
// names no layer's policy, and a new layer adds an interface beside itself
// and a method on the rules, not a field here. A lookup by rule name built
// into each decorator would not do: a hit's Rule is a metrics label, not
// unique (the ratelimit service names its rules by path, per domain), and
// the lookup's table would have to follow every front-end's reloads. A
// policy or a result buffer passed beside the hits would change every
// Limiter's signature, or ride on the context (an allocation per request,
// and out of step with the hits when the core hands the fallback only some
// of them); a Decision holding every hit's result would not stay a small
// value. The Tag travels with its hit, costs no allocation (a rule is a
// pointer) and one cached type assertion where a layer reads it: the Guard
// on a denial, the Fallback when it decides or learns a count, a store once
// per hit.
package window
