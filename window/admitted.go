package window

import "time"

// Admitted is what a process admitted on one key on its own (failure mode
// local) while the shared store could not decide, to be written back into
// the key's shared window.
type Admitted struct {
	// Key is the hits' key; Limit the limit of the hit that last admitted
	// on it locally (its window, and whether the key is bucketed).
	Key   string
	Limit Limit
	// Entries are the admissions, oldest first.
	Entries []AdmittedEntry
}

// AdmittedEntry is one local admission.
type AdmittedEntry struct {
	// Age is how long before the write-back call the request was admitted;
	// negative for an entry scored after it (a lease's slot, at the lease's
	// end), at most a window.
	Age time.Duration
	// Cost is the entries the request counts as; below 1 means 1.
	Cost int
	// ID is the admission's member id: unique among every limiter sharing
	// the store, the same on every attempt to write the admission back, not
	// empty and not beginning with a NUL byte, which marks a bucketed key's
	// counters. Ids beginning with 0x01 are reserved for written-back
	// admissions: request ids never do.
	ID string
}
