// Package overrides is the policy of an operator's timed override of a
// rule, decided in one place for the command that sets it, for the Redis
// store that carries it to every sidecar and for the core that applies it
// at check time: what an override may say ([Override.Check]: a bounded
// duration, a valid limit, never a limit above the file's without
// AllowRaise), what a sidecar accepts of what it reads from the fleet,
// whoever wrote it ([Override.Verify]), how it applies to a hit of its
// rule ([Override.Apply]), and what a sidecar knows of the overrides in
// force and of the fleet's order of sets and clears ([Book]).
//
// An override names its rule by the (domain, rule) pair under which the
// front-ends count the rule's requests: a descriptors file's domain and
// rule name, or a ratelimit domain and the rule's name or descriptor
// path. It replaces the rule's limit (Requests, and Window when given),
// puts the rule in shadow or enforce mode, or runs a limit beside the rule
// in shadow (a dry run), until its end; then the file's rule is in force
// again. A rule a reload removes keeps its override dormant: it applies
// again if the rule comes back before the end.
package overrides
