package enforce

import (
	"fmt"
	"math"
	"time"

	"github.com/flashgate/flashgate/window"
)

// This file holds the checks of the rule fields both config formats share
// (a rate_limit's requests, algorithm and buckets; failure_mode;
// local_share; ban), written once. Each refuses with a *FieldError, a plain
// sentence naming the field, which the front-end's parser places at
// FILE:LINE:COL.

// FieldError is a rule field's value that a check of this package refuses.
// Field is the field as both config formats spell it, relative to the block
// checked ("buckets" of a rate_limit, "window" of a ban), or "" when the
// error concerns the block as a whole (a field is missing); Msg is a plain
// sentence, without position.
type FieldError struct {
	Field string
	Msg   string
}

// Error returns Msg.
func (e *FieldError) Error() string { return e.Msg }

func fieldErr(field, format string, args ...any) error {
	return &FieldError{Field: field, Msg: fmt.Sprintf(format, args...)}
}

// CheckFailureMode parses a rule's failure_mode: local, allow or deny.
func CheckFailureMode(s string) (FailureMode, error) {
	m, err := ParseFailureMode(s)
	if err != nil {
		return FailureDefault, fieldErr("failure_mode", "failure_mode %q must be local, allow or deny", s)
	}
	return m, nil
}

// CheckLocalShare checks a local_share as written: 1 to window.MaxRequests
// (a rule's share is at most its limit, see [CheckShareFits]).
func CheckLocalShare(n int64) error {
	if n < 1 || n > window.MaxRequests {
		return fieldErr("local_share", "local_share must be between 1 and %d, not %d (omit it to share the limit evenly among the live sidecars)", window.MaxRequests, n)
	}
	return nil
}

// CheckShareFits checks that share, the local_share in force for the rule
// named rule (0: none), is at most the rule's requests per window.
func CheckShareFits(share, requests int, rule string) error {
	if share > requests {
		return fieldErr("local_share", "local_share %d is more than the %d requests per window of rule %q", share, requests, rule)
	}
	return nil
}

// CheckRequests checks a limit's requests per window, written as field
// ("requests", "requests_per_unit"): 1 to window.MaxRequests.
func CheckRequests(field string, n int64) error {
	switch {
	case n < 1:
		return fieldErr(field, "%s must be at least 1, not %d", field, n)
	case n > window.MaxRequests:
		return fieldErr(field, "%s must be at most %d per window, not %d", field, window.MaxRequests, n)
	}
	return nil
}

// CheckAlgorithm applies a rate_limit's algorithm (nil or "auto", "exact",
// "buckets") and buckets (nil when absent) to l, whose requests and window
// are already checked, and reports whether the bucket count was chosen by
// l's size: by default window.Limit.Auto's choice; buckets without a count
// is window.DefaultBuckets; exact keeps an exact log and takes no buckets.
// The limit returned passes window.Limit.Validate; one of 0 requests (the
// ratelimit service's requests_per_unit: 0, which refuses every request and
// keeps no window) passes it in all but its requests.
func CheckAlgorithm(l window.Limit, alg *string, buckets *int64) (_ window.Limit, auto bool, err error) {
	a := "auto"
	if alg != nil {
		a = *alg
	}
	switch a {
	case "auto", "buckets":
	case "exact":
		if buckets != nil {
			return l, false, fieldErr("buckets", "buckets is set with algorithm: exact; omit one of them")
		}
	default:
		return l, false, fieldErr("algorithm", "algorithm %q must be auto, exact or buckets", a)
	}
	switch {
	case a == "exact":
		l.Buckets = 0
	case buckets != nil:
		if n := *buckets; n < 1 || n > window.MaxBuckets {
			return l, false, fieldErr("buckets", "buckets must be between 1 and %d, not %d (algorithm: exact keeps an exact log)", window.MaxBuckets, n)
		}
		l.Buckets = int(*buckets)
	case a == "buckets":
		l.Buckets = window.DefaultBuckets
	default:
		l = l.Auto()
		auto = l.Buckets > 0
	}
	v := l
	if v.Requests == 0 {
		v.Requests = 1
	}
	if err := v.Validate(); err != nil {
		return l, false, fieldErr("buckets", "%s", err)
	}
	return l, auto, nil
}

// BanFields is a ban block as written, each field nil when absent.
type BanFields struct {
	Threshold        *int64
	Window, Duration *time.Duration
}

// MaxBanThreshold is the largest ban threshold, the largest whole number a
// descriptors file reads.
const MaxBanThreshold = math.MaxInt32

// CheckBan checks a ban block and returns the penalty box the rule asks
// for: a field it leaves out is zero, which the server's (serve's --ban-*
// flags) fills in (window.Ban.Or), so that "ban: {}" asks for the server's
// box. Duration 0 turns the box off for the rule (nil, as for a rule that
// does not ask); a threshold is 1 to MaxBanThreshold, a window positive and
// a duration at most window.MaxBanDuration.
func CheckBan(b BanFields) (*window.Ban, error) {
	var ban window.Ban
	if b.Duration != nil {
		switch d := *b.Duration; {
		case d == 0:
			return nil, nil
		case d < 0:
			return nil, fieldErr("duration", "ban duration %s must not be negative", d)
		case d > window.MaxBanDuration:
			return nil, fieldErr("duration", "ban duration %s is longer than the maximum of %s (one year)", d, window.MaxBanDuration)
		}
		ban.Duration = *b.Duration
	}
	if b.Threshold != nil {
		switch t := *b.Threshold; {
		case t < 1:
			return nil, fieldErr("threshold", "ban threshold must be at least 1, not %d", t)
		case t > MaxBanThreshold:
			return nil, fieldErr("threshold", "ban threshold must be at most %d, not %d", MaxBanThreshold, t)
		}
		ban.Threshold = int(*b.Threshold)
	}
	if b.Window != nil {
		if *b.Window <= 0 {
			return nil, fieldErr("window", "ban window must be positive, not %s", *b.Window)
		}
		ban.Window = *b.Window
	}
	return &ban, nil
}

// Bounds of a rule's lease (lease: {for: D}).
const (
	// MinLease is the shortest lease.
	MinLease = time.Millisecond
	// MaxLease is the longest: below the fallback's settle after an outage,
	// so that every lease a Redis that came back empty forgot has ended
	// before it grants again (docs/design.md, "Leased admissions").
	MaxLease = time.Second
)

// CheckLease checks a rule's lease length d for its limit: MinLease to
// MaxLease, no longer than the window, on an exact window.
func CheckLease(d time.Duration, limit window.Limit) error {
	switch {
	case d < MinLease || d > MaxLease || d%time.Microsecond != 0:
		return fieldErr("for", "lease for %s must be between %s and %s, in whole microseconds", d, MinLease, MaxLease)
	case d > limit.Window:
		return fieldErr("for", "lease for %s is longer than the window, %s", d, limit.Window)
	case limit.Buckets > 0:
		return fieldErr("", "a lease needs an exact window: %s is bucketed (set algorithm: exact)", limit)
	}
	return nil
}
