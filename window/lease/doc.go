// Package lease admits a leased rule's hits from batches of admissions
// reserved in the key's shared window: a [Holder] is a window.Limiter
// decorator that, for a hit whose rule asks for a lease (RuleLease),
// reserves up to a fair share of slots in one call, admits from them
// locally until they are spent or the lease ends, and returns what is
// unused. The window records each reserved slot at the lease's end, the
// latest instant it can be used, so that no span of the window's length
// admits more than the limit across the fleet; docs/design.md ("Leased
// admissions") states the invariant and how each failure keeps it.
//
// Hits of rules without a lease go to the wrapped limiter unchanged.
package lease
