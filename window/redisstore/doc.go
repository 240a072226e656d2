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
// keys: one round trip, exact and all or nothing. On a Cluster a request's
// keys live in different slots, usually on different masters. With the
// auto-pipeline each master decides the request's keys it serves in one
// script call, all or nothing there; without it (and on a Ring) each key is
// checked and added by its own script call, all pipelined. When some
// enforcing key denies, or a master fails, the request's member is removed
// from the keys that admitted it (ZREM; a bucketed key's counts are taken
// back by bucketUndoLua). Between the add and the removal
// other requests may see those entries, so a key may deny up to one request
// too many per request in flight that was denied elsewhere, and a failed
// removal leaves an entry that ages out with its window. Admissions are
// never over the limit. Auto-pipelined, a request whose keys are all on one
// master (one key, always) needs no removal, unless a slot moved under it
// and it is decided again per key.
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
// queued check. While the last batch carried one call, a free slot is open
// at once: a sidecar with a check or two in flight never batches, and
// holding its second check behind the first only delayed it, by the stall
// and two goroutine hand-offs, which on a starved machine cost it the pace
// (a sidecar then behind sends back to back, each second check held again).
// A third check in flight queues again, and a batch of more than one turns
// the stall rule back on. A decision that finds a slot open and nothing
// queued goes out at once from its caller's goroutine, so a lone decision
// pays nothing; the others queue, and a dispatcher, when a slot opens,
// sends everything queued (up to 128 requests) as one script call, which
// decides the requests
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
// A batch forms only from what one store queues behind its own round trip:
// the stores of a fleet do not batch with each other, and beneath a large
// fleet, where each sidecar sends a master a few checks per round trip,
// nearly every call carries one check. Options.BatchWindow trades latency
// for those calls: a decision that finds the pipeline idle (nothing in
// flight, nothing queued) queues, and opens a window; the dispatcher sends
// the queue when the window ends, or at once when 128 requests are queued,
// but not before a hold still running is over. Decisions that queue behind
// a call in flight go out as without a window.
//
// # The Cluster's auto-pipelines
//
// On a Cluster each master has an auto-pipeline of its own on go-redis's
// connections to it, the master of a key taken from go-redis's slot map: a
// slow master holds up only the checks whose keys it serves. Its calls run
// the script with Redis 7.0's allow-cross-slot-keys flag (crossSlotLua),
// since a Cluster refuses KEYS of several slots in one call (CROSSSLOT), and
// the limit keys' hash tags spread over every slot, so a batch per slot
// would be a batch of one: a call declares its first key (the master
// answers MOVED at once if it does not serve that slot) and passes every
// key in ARGV; the script may then touch any key of a slot its master
// serves. A key whose slot the master gave away (a resharding or failover
// go-redis has not learnt of) makes the master refuse that key, as MOVED,
// or mid-script, after the batch's earlier requests were decided: every
// call of the batch is then sent again on its own, and each request that
// still fails so is decided again one script per key through the
// ClusterClient, which follows MOVED and ASK, its slot map reloaded. Member
// ids make each repeat harmless: a request already recorded is counted
// once. A master that refuses the flagged script (before Redis 7.0) turns
// the store to one script per key for good.
//
// A master sees only its share of the checks, so its batches are smaller
// than a standalone Redis's at the same load, and a call's fixed cost (a
// command, a script set-up, a reply, their system calls, on both sides)
// weighs more per check. Its hold is therefore 2 ms, not 200 µs: after a
// batch of n ≥ 4 the master's next call waits until n checks are queued for
// it, or 2 ms. As on standalone, a check waits for the hold only behind a
// batch, that is only once the load already queues checks behind a round
// trip; BENCHMARKS.md has what it saves and what it costs.
//
// A request whose keys are on several masters is sent to each master's
// pipeline at once and waits for all; what the all-or-nothing protocol
// across masters costs is the removal above, one pipelined call per
// admitting key, only when the request is denied or a master fails. Errors
// are per master: a master down fails the checks that have a key on it
// (the failure mode then answers them) and no other. Its connection errors
// are marked ErrMasterDown (window.KindMasterDown) while the store knows
// other masters (every 30 s the pipelines of addresses that left the slot
// map, by a failover or a reshard, are closed: a master replaced by its
// replica is not counted), so that the Breaker above the store counts
// them in its failure rate (which opens it once most checks fail, all
// masters down included) but not in its run of connection errors, which
// would hold every master off for one. A slow master's checks wait their
// budget and time out, as on standalone; the others' do not wait behind it.
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
// off the check path, by the policy of window/bans: this package stores the
// bans, counts the fleet's denials (reportLua, the policy's count made
// atomic on Redis) and carries the changes. Beside each limit key K, in K's slot, K!bc counts the
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
// and syncs with the index after each (re)subscription (and when a check
// of the index every 30 s finds it lost), so a sidecar that starts or
// reconnects learns the bans in force; the index's
// epoch member tells a sync whether Redis lost the bans, and the sidecar's
// bans.Book decides what follows: write back those it holds, or lift one
// missing from the index. Checks never wait for any of it: a banned key is refused from the
// Guard's memory, and while Redis is down every sidecar keeps the bans it
// knows and bans by its own count.
package redisstore
