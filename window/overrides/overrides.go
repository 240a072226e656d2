package overrides

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/flashgate/flashgate/window"
)

// Bounds of an override.
const (
	// MaxDuration is the longest an override may last: a day. An override
	// is an emergency measure; a lasting change belongs in the file.
	MaxDuration = 24 * time.Hour
	// MaxReason bounds Reason, and MaxBy bounds By, in bytes.
	MaxReason = 256
	MaxBy     = 64
	// MaxName bounds a Target's Domain and Rule, in bytes.
	MaxName = 256
	// MaxHistory is how many sets and clears the audit history keeps, the
	// newest.
	MaxHistory = 1000
	// MaxInForce bounds the overrides in force at once.
	MaxInForce = 1000
	// ClockSlack is how far Redis's clock may step back (a failover to a
	// node whose clock is behind) without a sidecar refusing an override's
	// end as too far in the future.
	ClockSlack = time.Minute
)

// Reasons a sidecar skips an entry of the fleet's overrides instead of
// applying it ([Override.Verify], [Book]); they label a metric, so the set
// is closed.
const (
	// SkipMalformed: not an override: unreadable, a bad name, a By or
	// Reason too long, a hash field that does not name its target.
	SkipMalformed = "malformed"
	// SkipMode: a mode unknown to this sidecar.
	SkipMode = "mode"
	// SkipDuration: a duration outside (0, MaxDuration].
	SkipDuration = "duration"
	// SkipEnd: an end (or a clear) further in the future than an override
	// set now could have.
	SkipEnd = "end"
	// SkipLimit: requests or a window out of a limit's range.
	SkipLimit = "limit"
	// SkipRaise: a raise of the rule's limit (or shadow mode) without
	// AllowRaise.
	SkipRaise = "raise"
	// SkipBound: beyond MaxInForce overrides in force.
	SkipBound = "bound"
	// SkipRevision: a revision above [MaxRev], which no writer gave.
	SkipRevision = "revision"
)

// ErrRaise is wrapped by [Override.Check]'s error for an override that
// would make a rule's limit larger than the file's without AllowRaise.
var ErrRaise = errors.New("the override would raise the rule's limit above the file's (give --allow-raise to mean it)")

// ErrMode is wrapped by ParseMode's error: a mode unknown to this sidecar.
var ErrMode = errors.New("not one of limit, shadow, enforce, dry-run")

// Target names an overridden rule: Domain is the descriptors file's
// domain or the ratelimit domain, Rule the rule's name (a ratelimit rule
// without a name: its descriptor path).
type Target struct {
	Domain string `json:"domain"`
	Rule   string `json:"rule"`
}

// String returns "domain/rule".
func (t Target) String() string { return t.Domain + "/" + t.Rule }

// Mode is what an override does to its rule.
type Mode uint8

const (
	// ModeLimit replaces the rule's limit by Override.Limit.
	ModeLimit Mode = iota + 1
	// ModeShadow puts the rule in shadow mode: decided and counted, never
	// denying.
	ModeShadow
	// ModeEnforce puts a shadow rule in enforce mode.
	ModeEnforce
	// ModeDryRun runs Override.Limit beside the rule, in shadow: its
	// would-be denials are counted, nothing is denied by it.
	ModeDryRun
)

var modeNames = [...]string{ModeLimit: "limit", ModeShadow: "shadow", ModeEnforce: "enforce", ModeDryRun: "dry-run"}

// String returns "limit", "shadow", "enforce" or "dry-run".
func (m Mode) String() string {
	if int(m) < len(modeNames) && modeNames[m] != "" {
		return modeNames[m]
	}
	return fmt.Sprintf("mode(%d)", uint8(m))
}

// ParseMode is the inverse of Mode.String.
func ParseMode(s string) (Mode, error) {
	for m, n := range modeNames {
		if n != "" && n == s {
			return Mode(m), nil
		}
	}
	return 0, fmt.Errorf("override mode %q: %w", truncate(s), ErrMode)
}

// MarshalText implements encoding.TextMarshaler; the zero Mode (the
// target alone, in a clear's history entry) is "".
func (m Mode) MarshalText() ([]byte, error) {
	if m == 0 {
		return nil, nil
	}
	return []byte(m.String()), nil
}

// UnmarshalText implements encoding.TextUnmarshaler.
func (m *Mode) UnmarshalText(b []byte) error {
	if len(b) == 0 {
		*m = 0
		return nil
	}
	v, err := ParseMode(string(b))
	*m = v
	return err
}

// Override is one operator's override of one rule, in force from Set
// until Until. It is a plain value; [Book] hands out pointers to copies
// that nobody changes.
type Override struct {
	// Rev orders the sets and clears of the fleet (see Book): a later one
	// has a higher Rev. Redis assigns it; 0 is the lowest.
	Rev int64 `json:"rev,omitempty"`
	Target
	// Cleared marks a clear's tombstone: the rule has no override since
	// Set (the clear's time); Mode, the limit and Until are zero.
	Cleared bool `json:"cleared,omitempty"`
	Mode    Mode `json:"mode,omitempty"`
	// Requests and Window are the limit of ModeLimit and ModeDryRun;
	// Window 0 keeps the rule's window.
	Requests int           `json:"requests,omitempty"`
	Window   time.Duration `json:"window_ns,omitempty"`
	// AllowRaise lets the override make the rule's limit larger than the
	// file's (and put an enforcing rule in shadow).
	AllowRaise bool      `json:"allow_raise,omitempty"`
	Set        time.Time `json:"set"`
	Until      time.Time `json:"until"`
	// By is who set it (the OS user or --by), Reason why.
	By     string `json:"by,omitempty"`
	Reason string `json:"reason,omitempty"`

	// memo holds values derived from the override on the check path.
	memo sync.Map
}

// Rule is what Check compares an override with: the rule as the file
// (descriptors file or ratelimit config) has it now.
type Rule struct {
	Limit  window.Limit
	Shadow bool
}

// Check reports why o may not be set on a rule that is r, at now: a
// duration outside (0, MaxDuration], a limit that is invalid, a mode that
// does not fit the rule, a By or Reason too long, or a limit above the
// file's without AllowRaise (wrapping ErrRaise; putting an enforcing rule
// in shadow is a raise too). A dry run may test any valid limit.
func (o *Override) Check(r Rule, now time.Time) error {
	if err := checkName("domain", o.Domain, true); err != nil {
		return err
	}
	if err := checkName("rule", o.Rule, false); err != nil {
		return err
	}
	switch d := o.Until.Sub(now); {
	case d <= 0:
		return errors.New("the override's duration must be positive")
	case d > MaxDuration:
		return fmt.Errorf("the override lasts %s: longer than the maximum of %s", d.Round(time.Second), MaxDuration)
	}
	if len(o.By) > MaxBy || len(o.Reason) > MaxReason {
		return fmt.Errorf("--by is at most %d bytes and --reason %d", MaxBy, MaxReason)
	}
	switch o.Mode {
	case ModeLimit, ModeDryRun:
		if o.Window < 0 {
			return fmt.Errorf("window %s: must be positive", o.Window)
		}
		if err := o.limit(r.Limit).Validate(); err != nil {
			return fmt.Errorf("the override's limit: %w", err)
		}
		if o.Mode == ModeLimit && !o.AllowRaise && Raises(o.limit(r.Limit), r.Limit) {
			return fmt.Errorf("%s over %s: %w", o.limit(r.Limit), r.Limit, ErrRaise)
		}
	case ModeShadow:
		if r.Shadow {
			return errors.New("the rule is in shadow mode already")
		}
		if !o.AllowRaise {
			return fmt.Errorf("shadow mode lifts the rule's limit: %w", ErrRaise)
		}
	case ModeEnforce:
		if !r.Shadow {
			return errors.New("the rule is enforced already (it is not in shadow mode)")
		}
	default:
		return fmt.Errorf("unknown override mode %d", o.Mode)
	}
	return nil
}

// checkName refuses an empty (unless emptyOK), long or unprintable name.
func checkName(what, s string, emptyOK bool) error {
	if s == "" && !emptyOK || len(s) > MaxName || strings.ContainsFunc(s, func(r rune) bool { return r < 0x20 || r == 0x7f }) {
		return fmt.Errorf("the override's %s %q: want 1 to %d printable bytes", what, truncate(s), MaxName)
	}
	return nil
}

func truncate(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}

// limit returns the override's limit on a rule whose limit is file: its
// Requests, its Window or file's, file's Buckets.
func (o *Override) limit(file window.Limit) window.Limit {
	l := file
	l.Requests = o.Requests
	if o.Window > 0 {
		l.Window = o.Window
	}
	return l
}

// Raises reports whether l admits more per unit of time than file.
func Raises(l, file window.Limit) bool {
	// In floats: the products of nanoseconds and counts can overflow.
	return float64(l.Requests)*float64(file.Window) > float64(file.Requests)*float64(l.Window)
}

// InForce reports whether o is in force at now: set, not a clear, not
// ended.
func (o *Override) InForce(now time.Time) bool { return !o.Cleared && now.Before(o.Until) }

// MaxRev is the highest revision a writer can have given by now (Redis's
// clock): Redis's time in ms plus ClockSlack. A revision above it is none:
// Verify skips its entry, and it neither outranks nor raises a later
// revision (see redisstore).
func MaxRev(now time.Time) int64 { return now.UnixMilli() + ClockSlack.Milliseconds() }

// Horizon is until when o (an override, ended or not, or a clear) outranks
// an older entry of its rule: every override set before o has ended by
// then.
func (o *Override) Horizon() time.Time { return o.Set.Add(MaxDuration + ClockSlack) }

// Verify reports why a sidecar must not apply o, read from the fleet's
// overrides at now (the fleet's clock), whoever wrote it: the bounds that
// Check holds without the rule's file (a limit above the file's is refused
// where it applies, by Apply), and a revision no higher than MaxRev(now).
// reason is one of the Skip constants, "" when o may apply.
func (o *Override) Verify(now time.Time) (reason string, err error) {
	if err := checkName("domain", o.Domain, true); err != nil {
		return SkipMalformed, err
	}
	if err := checkName("rule", o.Rule, false); err != nil {
		return SkipMalformed, err
	}
	if len(o.By) > MaxBy || len(o.Reason) > MaxReason {
		return SkipMalformed, fmt.Errorf("by is at most %d bytes and reason %d", MaxBy, MaxReason)
	}
	if o.Rev > MaxRev(now) {
		return SkipRevision, fmt.Errorf("revision %d: above Redis's time in ms plus %s", o.Rev, ClockSlack)
	}
	if o.Set.Sub(now) > ClockSlack {
		return SkipEnd, fmt.Errorf("set at %s: in the future", o.Set.UTC().Format(time.RFC3339))
	}
	if o.Cleared {
		if o.Mode != 0 {
			return SkipMalformed, errors.New("a clear with a mode")
		}
		return "", nil
	}
	switch o.Mode {
	case ModeLimit, ModeDryRun:
		if o.Requests < 1 || o.Requests > window.MaxRequests || o.Window < 0 || o.Window > window.MaxWindow {
			return SkipLimit, fmt.Errorf("limit %d per %s: out of range", o.Requests, o.Window)
		}
	case ModeShadow:
		if !o.AllowRaise {
			return SkipRaise, fmt.Errorf("shadow mode lifts the rule's limit: %w", ErrRaise)
		}
	case ModeEnforce:
	default:
		return SkipMode, fmt.Errorf("unknown override mode %d", o.Mode)
	}
	if d := o.Until.Sub(o.Set); d <= 0 || d > MaxDuration {
		return SkipDuration, fmt.Errorf("lasts %s: want more than 0 and at most %s", d.Round(time.Second), MaxDuration)
	}
	if d := o.Until.Sub(now); d > MaxDuration+ClockSlack {
		return SkipEnd, fmt.Errorf("ends in %s: more than %s from now", d.Round(time.Second), MaxDuration)
	}
	return "", nil
}

// Refused reports whether Apply keeps the file's limit, file, against o
// because o would raise it without AllowRaise.
func (o *Override) Refused(file window.Limit) bool {
	return o.Mode == ModeLimit && !o.AllowRaise && o.limit(file).Validate() == nil && Raises(o.limit(file), file)
}

// Apply returns what a hit of o's rule becomes: its limit and shadow mode
// given the file's (limit, shadow) and whether every rule is in shadow
// (the server's --shadow, which no override lifts). A ModeLimit override
// that the file's limit has come below since it was set (a reload) keeps
// the file's limit unless AllowRaise. ModeDryRun changes nothing here: its
// limit is DryRun's. changed reports whether the limit changed.
func (o *Override) Apply(file window.Limit, shadow, shadowAll bool) (l window.Limit, sh, changed bool) {
	switch o.Mode {
	case ModeLimit:
		if nl := o.limit(file); nl.Validate() == nil && (o.AllowRaise || !Raises(nl, file)) {
			return nl, shadow, nl != file
		}
	case ModeShadow:
		return file, true, false
	case ModeEnforce:
		return file, shadowAll, false
	}
	return file, shadow, false
}

// DryRun returns the limit a dry run runs beside a rule whose limit is
// file; ok is false for another mode or an invalid limit.
func (o *Override) DryRun(file window.Limit) (l window.Limit, ok bool) {
	if o.Mode != ModeDryRun {
		return window.Limit{}, false
	}
	l = o.limit(file)
	return l, l.Validate() == nil
}

// Memo returns the value memoised under key, made by mk on the first call:
// what the check path derives from the override (a policy for the
// rate-limit headers) lives as long as it. Safe for concurrent use.
func (o *Override) Memo(key any, mk func() any) any {
	if v, ok := o.memo.Load(key); ok {
		return v
	}
	v, _ := o.memo.LoadOrStore(key, mk())
	return v
}

// Clone returns a copy of o without its memo.
func (o *Override) Clone() *Override {
	return &Override{Rev: o.Rev, Target: o.Target, Cleared: o.Cleared, Mode: o.Mode, Requests: o.Requests, Window: o.Window, AllowRaise: o.AllowRaise,
		Set: o.Set, Until: o.Until, By: o.By, Reason: o.Reason}
}

// Describe says what o does, for tables and logs: "limit 10/1m",
// "limit 10 (the rule's window)", "shadow", "enforce", "dry run of 10/1m".
func (o *Override) Describe() string {
	lim := fmt.Sprintf("%d", o.Requests)
	if o.Window > 0 {
		lim += "/" + o.Window.String()
	} else {
		lim += " per the rule's window"
	}
	switch o.Mode {
	case ModeLimit:
		return "limit " + lim
	case ModeDryRun:
		return "dry run of " + lim
	}
	return o.Mode.String()
}

// Event is one entry of the audit history: a set (Override is the one
// set) or a clear (Override holds the target, and what was in force if
// anything was).
type Event struct {
	Op       string    `json:"op"` // "set" or "clear"
	At       time.Time `json:"at"`
	By       string    `json:"by,omitempty"`
	Reason   string    `json:"reason,omitempty"`
	Override *Override `json:"override"`
}
