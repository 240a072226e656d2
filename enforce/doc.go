// Package enforce is flashgate's enforcement core: the rate-limit policy
// that every front-end (ext_authz, the ratelimit service) applies to the
// hits it makes of a request, written once.
//
// A front-end is a codec: it translates a request into a [Request] (its
// window.Hits, each tagged with its rule's policy, failure mode and
// counters; a rule that refuses without a hit: on_missing: deny, a limit
// that can never admit), asks its [Front] to [Front.Decide] it, and writes
// the [Verdict] in its protocol's answer. Decide refuses by a Refusal
// without asking; else it asks the limiter once, all or nothing; when the
// limiter fails it applies the failure modes, each hit's rule's own or the
// core's default (see [FailureMode]):
//
//  1. deny if an enforcing (non-shadow) hit's mode is deny;
//  2. else the hits of mode local by the in-process [Fallback], told the
//     cause (it never waits, and decides even after the caller gave up);
//  3. else allow.
//
// A denial that names no hit (a limiter that broke its contract) admits.
// The verdict's [Answer] is what every front-end's answer says (below);
// its [Label] is the decision Decide counted, under the rule that bound
// it, in the front-end's requests counter (the [Series] of the rules in
// force, whose series a reload drops).
//
// It counts what it decided in the metrics that belong to the policy, not
// to a protocol: backend errors by kind, failure-mode decisions, local
// denials and the backend's latency, under the names the front-end gave
// when it registered ([Core.Front], [FrontEnd]): the core names no
// front-end, and a new one brings its own family and key namespace. The
// front-ends count their latency themselves, in [FrontMetrics].
//
// A [Reloader] keeps a front-end's config in step with its file or
// directory (file-system notifications and a poll, one last-good rule,
// one count of reloads);
// the front-end only reads, parses and installs.
//
// The rule fields both config formats share are checked here too, once:
// a rate_limit's requests, algorithm and buckets, failure_mode,
// local_share and ban (the Check functions, each refusing with a
// [FieldError] that the front-end's parser places at FILE:LINE:COL), and
// [ValidHeaderName].
//
// # Rate-limit headers
//
// Every front-end's answers carry the same rate-limit header fields, made
// here (ratelimit_headers.go) from an [Answer]; [Families] chooses which
// (serve's --ratelimit-headers: both, ietf, x, none; default both):
//
//   - IETF (draft-ietf-httpapi-ratelimit-headers-10): RateLimit-Policy
//     lists, in rule order, a [Policy] item `"<rule>";q=<requests>;w=<window
//     seconds>` for every rule that applies to the request (an identical
//     item once); RateLimit lists `"<rule>";r=<remaining>;t=<seconds>` for
//     every rule whose window the decision counted (window.HitReport), the
//     binding rule's from the Decision. A policy's name is its rule's name,
//     never a request value; a byte an sf-string cannot hold (outside
//     printable ASCII) and '%' are percent-encoded ([PolicyName]). A
//     sub-second window is w=1: w is rounded up to whole seconds, as t is.
//   - x: x-ratelimit-limit, -remaining and -reset of the binding rule (the
//     refusing one of a denial, else the one with the fewest requests
//     remaining).
//
// t of an admitted window is how long until its oldest counted admission
// leaves it (window.Decision.Reset, HitReport.Reset), whole seconds rounded
// up, 1 to w; when the limiter does not know it (Reset 0), the whole
// window: a client that waits that long finds room. t of a window over its
// limit is its retry-after, rounded up, at least 1 (a penalty box's makes
// it longer than the window). A denial adds Retry-After, the same seconds,
// never earlier than the refusing policy's t, content-type
// application/problem+json, and the RFC 9457 body of [Policy.AppendProblem]
// (type [ProblemType], violated-policies, and the members error, rule and
// retry_after_ms that the body had before it was a problem).
//
// What answers that did not come from one decision carry:
//   - shadow (a would-be denial admitted): the would-be values, an over
//     limit window with r=0 and its retry-after as t, and
//     x-ratelimit-shadow: 1, which marks the answer whatever the families;
//   - a refusal without a decision (failure mode deny, on_missing: deny):
//     the refusing rule's policy alone, r=0, t and Retry-After 1 s;
//   - failure mode allow (admitted without a decision): RateLimit-Policy of
//     the request's rules and nothing else, no state being known;
//   - failure mode local: the fallback's decision, as above, for the rules
//     it decided; the others' policies without a state.
package enforce
