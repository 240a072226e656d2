package enforce

import "fmt"

// FailureMode says what to do with a hit when the backend cannot decide.
type FailureMode uint8

const (
	// FailureDefault: use the core's default (Options.FailureMode).
	FailureDefault FailureMode = iota
	// FailureLocal: decide the hit with the in-process fallback.
	FailureLocal
	// FailureAllow: admit as far as this hit is concerned.
	FailureAllow
	// FailureDeny: refuse the request.
	FailureDeny
)

// String returns "local", "allow", "deny" or "default".
func (m FailureMode) String() string {
	switch m {
	case FailureLocal:
		return "local"
	case FailureAllow:
		return "allow"
	case FailureDeny:
		return "deny"
	default:
		return "default"
	}
}

// ParseFailureMode parses "local", "allow" or "deny".
func ParseFailureMode(s string) (FailureMode, error) {
	switch s {
	case "local":
		return FailureLocal, nil
	case "allow":
		return FailureAllow, nil
	case "deny":
		return FailureDeny, nil
	}
	return FailureDefault, fmt.Errorf("failure mode %q is not one of local, allow, deny", s)
}
