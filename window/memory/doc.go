// Package memory is the in-process store of window: an exact sliding-window
// log per key. It is the embedded backend of `flashgate serve`, the log the
// failure mode's fallback extends (see [Memory.DecideWith]), and the
// reference the Redis store is held against.
//
// Every key holds the admission times still inside its window (at most
// Limit.Requests of them), so a decision is exact; or, for a bucketed limit
// (Limit.Buckets > 0), at most Buckets+1 sub-window counters, with the
// semantics of the Redis script (see window.Limit). Keys live in 64 shards,
// each under its own lock; the hits of one request are decided under the
// locks of all their shards, taken in shard order, so a request is admitted
// and recorded in all its windows, or in none.
//
// Memory is bounded. A key whose newest admission has left its window holds
// no state and is dropped by a sweep amortised over inserts. When MaxKeys
// keys are still live, a new key evicts, of eight random live keys of its
// shard, the one that would go idle soonest (counted by Evictions): that key
// forgets its history and may admit up to its limit again early, while keys
// with long windows and recent admissions survive a flood of new ones. Size
// MaxKeys above the number of keys live in your longest window (about
// 100–250 bytes each, plus 8 bytes per entry).
package memory
