// Package enforce is flashgate's enforcement core: the rate-limit policy
// every front-end applies to a request's hits, written once.
//
// A front-end is a codec: it turns a request into a [Request], asks its
// [Front] to [Front.Decide] it and writes the [Verdict] in its protocol.
// Decide refuses by a [Refusal] without asking; else it asks the limiter
// once, all or nothing. When the limiter fails, each hit's [FailureMode]
// (its rule's, or the core's default) decides:
//
//  1. deny if an enforcing (non-shadow) hit's mode is deny;
//  2. else the hits of mode local by the in-process [Fallback], which never
//     waits and decides even after the caller gave up;
//  3. else allow.
//
// A denial that names no hit (a limiter that broke its contract) admits.
// Shadow hits and refusals make would-be denials: admitted, counted, marked.
//
// The core counts the policy's metrics (backend errors, failure-mode
// decisions, local denials, backend latency) under the names a front-end
// registers with [Core.Front]; it names no front-end. A [Reloader] keeps a
// front-end's config in step with its file; the Check functions validate
// the rule fields both config formats share, once.
//
// Every answer's rate-limit headers (IETF RateLimit and RateLimit-Policy,
// the x-ratelimit-* family) and a denial's RFC 9457 problem body are made
// from an [Answer] in ratelimit_headers.go; docs/configuration.md
// ("Responses") specifies them field by field. t of an admitted window is
// when its oldest counted admission leaves it (the whole window when the
// limiter does not know); t of a window over its limit is its retry-after.
// A refusal without a decision names the refusing policy alone, r=0, t=1;
// failure mode allow carries RateLimit-Policy only, no state being known.
package enforce
