// Package window implements exact sliding-window-log rate limiting.
//
// A [Limit] allows at most Requests admissions in any span of length Window.
// A request is described by its [Hit]s: one (key, limit) pair per matching
// rule. A [Limiter] decides all hits of one request together, all or nothing:
// the request is admitted only if every enforcing hit is under its limit, and
// only an admitted request is recorded, in every window it matched.
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
// Keys are built by [Keys]: a prefix, a server-generated hash tag, the rule
// name and the value, with long or unsafe values hashed, so that nothing an
// attacker sends can choose a Redis Cluster slot, grow a key without bound,
// or make two different (rule, value) pairs share a window.
package window
