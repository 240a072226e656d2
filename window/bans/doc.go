// Package bans is the penalty box's policy, decided in one place for a
// sidecar's Guard and for the fleet: when denials raise a ban ([Tally]),
// when a ban in force is renewed ([Due]), how long one given by hand may
// last ([CheckDuration]), when a reload lifts one ([Holds]), and how the
// bans a sidecar knows follow the fleet's list, a reset of Redis included
// ([Book]). The Guard (window/guard) applies it to the keys it refuses; the
// Redis store (window/redisstore) only stores the bans, counts the fleet's
// denials and carries the changes between sidecars.
//
// A key denied more than Ban.Threshold times within Ban.Window is banned
// for Ban.Duration; a key denied on while banned has its ban moved to
// now + Duration, at most once per [RenewEvery]. A ban by hand replaces the
// one in force, shorter too. A ban raised by a count that ends before the
// one a sidecar holds means Redis lost the held one: the held end stands,
// so that a restarted Redis pardons no abuser and shortens no ban.
package bans
