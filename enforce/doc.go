// Package enforce is flashgate's enforcement core: the rate-limit policy
// that every front-end (ext_authz, the ratelimit service) applies to the
// hits it makes of a request, written once.
//
// A front-end translates a request into window.Hits, asks its [Front] to
// [Front.Decide] them, and translates the [Outcome] into its protocol's
// answer. Decide asks the limiter once, all or nothing; when the limiter
// fails it applies the failure modes, each hit's rule's own or the core's
// default (see [FailureMode]):
//
//  1. deny if an enforcing (non-shadow) hit's mode is deny;
//  2. else the hits of mode local by the in-process [Fallback], told the
//     cause (it never waits, and decides even after the caller gave up);
//  3. else allow.
//
// It counts what it decided in the metrics that belong to the policy, not
// to a protocol: backend errors by kind, failure-mode decisions, local
// denials and the backend's latency. Every metric of a front-end is named
// in one table here, registered once by the core: each front-end has a set
// of its own, under the names it has always exported (a user contract),
// see [FrontEnd]. The front-ends count their requests by rule and
// decision, their latency and their reloads themselves, in
// [FrontMetrics]: which rule a request counts under is the protocol's
// business.
//
// A [Reloader] keeps a front-end's config in step with its file or
// directory (one poll interval, one last-good rule, one count of reloads);
// the front-end only reads, parses and installs.
//
// The rule fields both config formats share are checked here too, once:
// a rate_limit's requests, algorithm and buckets, failure_mode,
// local_share and ban (the Check functions, each refusing with a
// [FieldError] that the front-end's parser places at FILE:LINE:COL), and
// [ValidHeaderName] and [ReservedRulePrefix].
package enforce
