// Package window implements exact sliding-window-log rate limiting.
//
// A [Limit] allows at most Requests admissions in any span of length Window.
// A request is described by its [Hit]s: one (key, limit) pair per matching
// rule. A [Limiter] decides all hits of one request together, all or nothing:
// the request is admitted only if every enforcing hit is under its limit, and
// only an admitted request is recorded, in every window it matched.
//
// A Limit is an exact log (one entry per admission) or, with Limit.Buckets,
// a bounded-memory window of sub-window counters that never over-admits
// either and refuses at most one sub-window early (see [Limit]).
//
// Three limiters share that contract and one conformance table:
//
//   - [Memory]: an exact in-process log per key; the embedded default and the
//     reference the Redis implementation is held against.
//   - [Redis]: one Lua script on a sorted set per key, time taken from Redis
//     (TIME), one round trip per decision on standalone and Sentinel; per-slot
//     check-and-add with compensation (ZREM) on Redis Cluster.
//   - [Guard]: a local over-limit cache and penalty box in front of either,
//     which refuses known-full keys and repeat offenders without a round trip.
//
// The rest are decorators a sidecar stacks once, at wiring time, as
// Guard(fallback.Watch(Breaker(Budget(Redis)))):
//
//   - [Budget]: each call's deadline follows Redis's observed latency,
//     between a floor and a ceiling.
//   - [Breaker]: holds Redis off after connection errors, or a failure rate
//     sustained across a short window; slow replies alone do not open it.
//   - [Fallback]: failure mode "local": the fleet-aware share a sidecar
//     enforces alone, seeded (through [Fallback.Watch]) by what Redis last
//     said; [Fleet] counts the live sidecars by heartbeat.
//
// [Classify] names a failure's kind for the breaker and for metrics.
//
// Keys are built by [Keys]: a prefix, a server-generated hash tag, the rule
// name and the value, with long or unsafe values hashed, so that nothing an
// attacker sends can choose a Redis Cluster slot, grow a key without bound,
// or make two different (rule, value) pairs share a window.
package window
