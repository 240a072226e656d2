// Package guard holds the decorators of a window.Limiter, each in front of
// any limiter, whatever its type: the [Guard] (local refusals), the
// [Breaker] (when to stop calling the store) and the [Budget] (how long to
// wait for it). serve stacks them once, at wiring time, as
// Guard(fallback.Watch(Breaker(Budget(store)))), or Guard(memory store).
//
// The Guard is the outermost layer: requests it can refuse from memory
// never reach the layers behind it, so no deadline is armed, the breaker is
// not consulted, and a known-full key is refused even while the breaker
// holds Redis off. It knows two things. "Full until": when the store denies
// a key with retry-after R, the key is refused locally until send time + R,
// which is exact, not a guess (a full window reopens only when its oldest
// entry ages out, and the store measured R from a clock no earlier than the
// send time); a changed limit (a reload) invalidates it. The penalty box, a
// policy a rule asks for: a key denied more than Ban.Threshold times within
// Ban.Window (local refusals included) is refused for Ban.Duration, Ban
// being the one the hit's rule asks for (read from Hit.Tag through
// [RuleBan]), its unset fields taken from GuardOptions.Ban; a rule that
// does not ask is never banned. When to ban, renew and lift is the policy
// of window/bans, which the fleet's bans follow too. Only enforcing hits
// are refused locally, and a refusal learnt holds for the checks that start
// after the Decide that learnt it returns. The cache is a hint, never the
// source of truth: it lives in a fixed budget (ristretto, which may drop or
// reject entries), and a key it forgot is decided by the store again.
//
// The Breaker is driven by the failure rate over a short window and by
// connection errors, not by a run of consecutive failures: a reply that
// arrives late from a healthy Redis fails that one call but does not switch
// every check of the sidecar to its failure mode. It opens when, within
// Window, at least MinCalls calls were made and FailureRate of them failed,
// sustained across the window (of its tenths that saw calls, at least 8,
// FailureRate must have failed mostly, so that one late pipelined batch,
// which fails together, does not open it), or when ConnFailures connection
// errors came in a row. Open, it answers window.ErrBreakerOpen for Cooldown,
// then lets one probe through: success closes it, failure opens it again.
// An invalid hit and a caller that gave up are neither successes nor
// failures.
//
// The Budget gives each call a deadline that follows the store's observed
// latency as TCP's retransmission timeout follows the round trip (RFC 6298):
// smoothed latency plus four times its smoothed deviation, within [Min,
// Max]. When Redis slows down, checks wait longer for it instead of taking
// their failure mode; when it is fast again the budget shrinks back. A call
// that runs out of budget counts as having taken the whole budget; before
// the first sample a call gets Max, so a cold start's first burst is not cut
// short.
package guard
