// Package fallback is window's failure mode "local": the [Fallback], what
// one sidecar enforces on its own while the shared store cannot decide, the
// write-back of what it admitted, and the [Fleet] heartbeat that counts the
// sidecars sharing the store.
//
// # The share
//
// The Fallback is fleet-aware, so that N sidecars enforcing at once stay
// near the limit rather than at N times it. Its local state is an exact log
// per key (a memory.Memory, extended by an allowance per hit):
//
//   - Share: each hit is enforced at its share, its rule's (read from
//     Hit.Tag through [RuleShare]), or ceil(Limit.Requests / N) by
//     default, with N the live fleet size.
//   - Seed: the limiter [Fallback.Watch] returns records, for the binding
//     hit of every decision the store made, the count it reported; until one
//     window after that reply, the hit may admit at most
//     min(share, ceil((limit - count) / N)) locally: the unclaimed rest of
//     the window, split N ways. A key reported full admits nothing locally
//     until the window after the reply.
//   - In flight: calls this sidecar still has in flight for a key may yet be
//     admitted by the store, so each takes one from the allowance (counted by
//     Watch's limiter in a fixed table by key hash: a collision can only make
//     the count larger).
//   - Timed out: a call that timed out may have been admitted all the same,
//     so [Fallback.DecideAfter] records its request locally even when it
//     denies it. With the in-flight count this keeps a burst whose first
//     calls all time out (a cold start on a busy machine) from admitting
//     locally what the store admits too.
//
// Bound: each sidecar admits locally at most min(share, ceil((limit -
// count) / N)) per window, count being the last count it saw. When every
// sidecar saw the count the store held as the outage began (a hot key they
// all keep hitting), no span of the window's length admits more than
// count + N × ceil((limit - count) / N) ≤ limit + N - 1 across the fleet;
// when their last counts differ, or some never saw the key, up to
// limit + N × share at the outage's start; then N × share. With a per-rule
// share S, N × S.
//
// Only the binding hit of a decision is seeded; other hits of a multi-rule
// request are enforced at their share. Seeds live in a fixed table by key
// hash (no map, no allocation per seed), each the used share of its key's
// limit in 32-bit fixed point, in buckets of four keys: a key that finds its
// bucket full of other keys' live seeds is merged into the bucket's shared
// entry (the larger share), which the bucket's keys without an entry of
// their own then read at their own limit. A collision only makes the
// fallback stricter.
//
// # The write-back
//
// Given a [Restorer] (Options.WriteBack), the Fallback remembers every
// request it admits locally, by key: its time, cost and a member id of its
// own (0x01, a random per-process prefix, then a sequence number). After an
// outage (a connection error or an open breaker), while a key has
// admissions not yet written back, Watch's limiter does not send its calls
// on (it returns [ErrRestoring]: the caller takes its failure mode).
// Admissions made because calls timed out (the store slow, not down) are
// written back too but hold no call off. One Redis Cluster master down
// among several (window.KindMasterDown) is not an outage of the store: the
// admissions made for it hold their own keys' calls off until written
// back, and no settle follows (the other keys' calls go on). Rounds write every remembered
// admission still inside its window back,
// idempotently: one starts after a local admission, the next as soon as the
// previous landed while admissions remain, and after a failed round a retry
// follows on a timer (10 ms, doubling to 100 ms) or as soon as a call
// through Watch succeeds. One round is in flight at a time; no check waits
// for one. So a key's first decision by the store after an outage counts
// what this process admitted on it locally in the window before.
//
// The rest of the fleet writes back too, each sidecar when it sees the store
// again. So that no sidecar's decisions miss what the others have not
// written back yet, nor what a store that came back empty forgot, an outage
// is held the same way every time it happens:
//
//   - Down: a sidecar that enforces failure mode local after a connection
//     error (admitting or not), or meets one while admissions wait, marks
//     the store down. Until a round answers (a write-back, or, with nothing
//     to write back, [Restorer.RunID]), retried every 10–100 ms, no call
//     goes on: a call answered by a store that may have come back empty is
//     a decision the settle exists to prevent. Each outage has a number; a
//     round that began before it cannot end it.
//   - Settle: once a round of the outage answers, every call keeps its
//     failure mode for Settle, while the fleet writes back. The rounds
//     watch the store meanwhile, every 100 ms: a failed round is a
//     new outage, and a run id other than the one seen last (the store
//     restarted, unseen by any call) begins the settle anew. With
//     Options.SharedSettle the fleet ends its settle at one moment, the
//     latest end any sidecar proposed as it found the store back (on the
//     store's clock); in the settle's last 100 ms nothing is admitted
//     locally, so that what the fleet admitted is in the store when it
//     turns to it (given write-back rounds shorter than that); and
//     Options.OnReturn closes a breaker below Watch as the settle begins.
//   - Unseen: a process none of whose calls reached the store during the
//     outage (all refused above Watch, or none made) learns of it from
//     the store's client: every connection to a restarted store is new,
//     and the Redis client compares each new connection's run id with the
//     last one, calling [Fallback.Restarted] when it changed and failing
//     that connection with a connection error. Restarted marks the store
//     down as a connection error does (so does that error, where the
//     call's failure mode is local). A call already past the gate when
//     an outage begins has its answer refused ([ErrRestoring]): it may
//     come from the store that came back empty.
//
// So every return of the store is held as the first: the outage's bound
// holds across it (provided the sidecars see the store again within
// Settle of each other), for windows no longer than Settle. What a
// store that came back empty forgot of a longer window is not restored:
// see docs/guarantees.md. A timed-out request admitted locally is written
// back too: if the store admitted it as well, it counts twice (stricter).
// Past MaxKeys keys waiting, a new key's admissions are not remembered
// (counted as WriteBackStats.Unremembered).
//
// # The fleet
//
// Each sidecar announces itself with a heartbeat, a member of one small
// sorted set per domain scored by its expiry, and counts the live ones. The
// count never shrinks for a reason other than a member's departure or its
// silence for a whole TTL. While Redis cannot be reached the last count is
// kept: sidecars that die during an outage make the estimate too large,
// which makes the fallback stricter, never looser. When Redis comes back
// without the set (restarted, flushed, failed over with data lost), the
// members this sidecar knew are kept until their announcements would have
// expired, the outage's length added, so a Redis that fails again at once
// finds the count whole; and told that Redis restarted ([Fleet.Restarted],
// by the heartbeat's client), the next beat keeps every member it knew a
// whole TTL from then, so that members whose beats fail through a crash
// loop stay counted.
package fallback
