package enforce

import (
	"fmt"
	"math"
	"time"

	"github.com/flashgate/flashgate/window"
)

// This file checks the rule fields both config formats share, once; each
// check refuses with a *FieldError the parser places at FILE:LINE:COL.

// FieldError is a rule field's value a check refuses: Field as both
// formats spell it, relative to the block ("" for the block as a whole),
// and Msg, a plain sentence without position.
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

// CheckLocalShare checks a local_share as written: 1 to window.MaxRequests.
func CheckLocalShare(n int64) error {
	if n < 1 || n > window.MaxRequests {
		return fieldErr("local_share", "local_share must be between 1 and %d, not %d (omit it to share the limit evenly among the live sidecars)", window.MaxRequests, n)
	}
	return nil
}

// CheckShareFits checks that share (0: none) is at most the rule's
// requests per window.
func CheckShareFits(share, requests int, rule string) error {
	if share > requests {
		return fieldErr("local_share", "local_share %d is more than the %d requests per window of rule %q", share, requests, rule)
	}
	return nil
}

// CheckRequests checks a limit's requests per window: 1 to
// window.MaxRequests.
func CheckRequests(field string, n int64) error {
	switch {
	case n < 1:
		return fieldErr(field, "%s must be at least 1, not %d", field, n)
	case n > window.MaxRequests:
		return fieldErr(field, "%s must be at most %d per window, not %d", field, window.MaxRequests, n)
	}
	return nil
}

// CheckAlgorithm applies a rate_limit's algorithm ("auto", "exact",
// "buckets" or nil) and buckets to l and reports whether the bucket count
// was chosen by l's size. The limit returned passes window.Limit.Validate,
// except that 0 requests (a limit refusing everything) stays 0.
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

// MaxBanThreshold is the largest ban threshold.
const MaxBanThreshold = math.MaxInt32

// CheckBan checks a ban block and returns the penalty box it asks for; a
// field left out is zero and filled by the server's (window.Ban.Or).
// Duration 0 turns the box off (nil).
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

// Bounds of a rule's lease.
const (
	MinLease = time.Millisecond
	// MaxLease is below the fallback's settle after an outage, so every
	// lease a Redis that came back empty forgot has ended before it grants
	// again (docs/design.md, "Leased admissions").
	MaxLease = time.Second
)

// CheckLease checks a lease length d for limit: MinLease to MaxLease, at
// most the window, on an exact window.
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
