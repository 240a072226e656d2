// Package redisstore is the Redis store of window: a [Redis] limiter on one
// sorted set per key, one entry per admitted request scored by its admission
// time in microseconds, decided by one Lua script (redis.lua, its KEYS/ARGV
// contract at its top), plus the client factory ([NewClient]) and the
// write-back of a fallback's local admissions ([Redis.Restore]), the
// fleet's ban list ([FleetBans], with its [Reporter] and [Subscriber]) and
// a read-only view of one key's window ([Inspect]).
//
// # Guarantees
//
// On a standalone Redis or Sentinel every decision is one script over all
// keys: one round trip, exact and all or nothing. On a Cluster or a Ring
// (per-slot mode) each key is checked and added by the same script on its
// own node, all keys pipelined; when some enforcing key denies, the
// request's member is removed (ZREM) from the keys that admitted it.
// Between the add and the removal other requests may see those entries, so
// a key may deny up to one request too many per request in flight that was
// denied elsewhere, and a failed removal leaves an entry that ages out with
// its window. Admissions are never over the limit.
//
// Each request gets a fresh member id (a random per-store prefix whose first
// byte is at least 0x80, then a counter); a script retried by the client
// (after a timeout, say) finds its member already present and does not count
// it twice. Keys expire one window after the last admission (PEXPIRE).
//
// A bucketed limit (Limit.Buckets > 0) keeps its key bounded: the same
// sorted set holds one counter per live sub-window (at most Buckets+1), the
// sub-window width, and the member ids of the requests it admitted in the
// last IdempotencyHorizon (or window, if shorter), so a retry within it is
// counted once and a denied retry takes back its first attempt's count. A
// reload that makes an exact rule bucketed converts its keys' entries into
// counters; one that changes the window or bucket count moves each counter
// to the new sub-window that holds its old one's last instant (never
// earlier, so never an over-admission); an exact hit on a bucketed key turns
// each counter back into entries at its sub-window's end, the newest
// Requests of them. A key hit twice in one request is loaded once, by its
// first hit, whose kind, width and window then hold for the request.
//
// # The auto-pipeline
//
// With Options.AutoPipeline, concurrent decisions share script calls, in the
// manner of rueidis. One call is in flight, and a second only while the
// newest call in flight has stalled (out for twice the smoothed round trip,
// 250 µs to 5 ms): a late reply opens the next slot instead of holding every
// queued check. A decision that finds a slot open and nothing queued goes
// out at once from its caller's goroutine, so a lone decision pays nothing;
// the others queue, and a dispatcher, when a slot opens, sends everything
// queued (up to 128 requests) as one script call, which decides the requests
// in order, each all or nothing over its own keys with its own member id.
// Exactness, all-or-nothing and idempotency are those of unbatched calls: a
// script call is atomic. What a batch saves is the per-command work on both
// sides, once per batch instead of once per decision.
//
// After a batch of n ≥ 4 requests returns, the next call waits until n
// calls are queued, or 200 µs: the callers that batch freed come back
// together a moment later, and without the hold the first of them would go
// out alone and the rest a round trip behind it. A check waits for the hold
// only behind a batch; BENCHMARKS.md has what it saves.
//
// A caller's deadline is kept without a context or timer per call: the
// calls whose deadline falls in the same 0.5 ms tick are expired together
// by one timer, and a queued call whose caller gave up is completed unsent
// when its batch goes out, so a request the failure mode already answered is
// never recorded. A call cut by its deadline in flight may still be
// recorded, as any timed-out call may.
//
// # Fleet-wide bans
//
// A Guard's penalty box is per process; [FleetBans] makes it the fleet's,
// off the check path. Beside each limit key K, in K's slot, K!bc counts the
// fleet's denials of K within the rule's ban window and K!ban holds a ban's
// end (it expires then); the index "<prefix>:bans" (a sorted set by end)
// lists the bans in force, and the channel of the same name carries "ban"
// and "lift" messages (bans.go has the layout). Each sidecar's [Reporter]
// hears its Guard's denials (guard.BanReporter), adds them up in memory and
// every 100 ms sends one pipeline of a short script per key; the script
// that takes a counter above the rule's threshold sets the ban, and the
// Reporter then indexes and publishes it. A banned key's reports wait a
// second between flushes, so a hammered ban costs Redis one script call per
// second per sidecar and is renewed at most once a second. Each sidecar's
// [Subscriber] applies every message to its Guard (guard.Guard.Ban, Lift),
// and syncs with the index after each (re)subscription and every 30 s, so
// a sidecar that starts or reconnects learns the bans in force; the index's
// epoch member tells a sync whether Redis lost the bans (then it writes
// back those it holds) or a ban missing from it was lifted (then it lifts
// it). Checks never wait for any of it: a banned key is refused from the
// Guard's memory, and while Redis is down every sidecar keeps the bans it
// knows and bans by its own count.
package redisstore
