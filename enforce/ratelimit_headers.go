package enforce

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/flashgate/flashgate/window"
)

// This file makes every front-end's rate-limit header fields and a
// denial's problem body; the package doc says what each answer carries.

// Header names, lower case as gRPC requires, and the denial body's types.
const (
	// HeaderRateLimit is the IETF RateLimit field.
	HeaderRateLimit = "ratelimit"
	// HeaderRateLimitPolicy is the IETF RateLimit-Policy field.
	HeaderRateLimitPolicy = "ratelimit-policy"
	// HeaderRetryAfter is a denial's Retry-After, whole seconds, ≥ 1.
	HeaderRetryAfter = "retry-after"
	// HeaderLimit, HeaderRemaining and HeaderReset are the x family.
	HeaderLimit     = "x-ratelimit-limit"
	HeaderRemaining = "x-ratelimit-remaining"
	HeaderReset     = "x-ratelimit-reset"
	// HeaderShadow marks an admission shadow mode turned from a denial;
	// it is sent whatever the families.
	HeaderShadow      = "x-ratelimit-shadow"
	HeaderContentType = "content-type"
	// ProblemContentType is the media type of a denial's body (RFC 9457).
	ProblemContentType = "application/problem+json"
	// ProblemType is a denial body's problem type: quota-exceeded.
	ProblemType  = "https://iana.org/assignments/http-problem-types#quota-exceeded"
	ProblemTitle = "Too Many Requests"
)

// Families are the rate-limit header families the answers carry
// (--ratelimit-headers). The zero value is FamiliesBoth.
type Families uint8

const (
	FamiliesBoth Families = iota // the IETF fields and the x family
	FamiliesIETF                 // RateLimit-Policy and RateLimit only
	FamiliesX                    // x-ratelimit-limit, -remaining and -reset only
	FamiliesNone                 // neither; a denial still has Retry-After and its body
)

// ParseFamilies parses "both", "ietf", "x" or "none".
func ParseFamilies(s string) (Families, error) {
	for f := FamiliesBoth; f <= FamiliesNone; f++ {
		if s == f.String() {
			return f, nil
		}
	}
	return FamiliesBoth, fmt.Errorf("rate-limit headers %q are not one of both, ietf, x, none", s)
}

// String returns "both", "ietf", "x" or "none".
func (f Families) String() string {
	switch f {
	case FamiliesBoth:
		return "both"
	case FamiliesIETF:
		return "ietf"
	case FamiliesX:
		return "x"
	case FamiliesNone:
		return "none"
	}
	return fmt.Sprintf("Families(%d)", uint8(f))
}

// IETF reports whether f includes RateLimit-Policy and RateLimit.
func (f Families) IETF() bool { return f == FamiliesBoth || f == FamiliesIETF }

// X reports whether f includes the x-ratelimit-* family.
func (f Families) X() bool { return f == FamiliesBoth || f == FamiliesX }

// Field is one header field of an answer (its name: [Field.Name]).
type Field uint8

// The fields an answer may carry, in the order it sends them.
const (
	FieldRetryAfter Field = iota
	FieldPolicy
	FieldRateLimit
	FieldLimit
	FieldRemaining
	FieldReset
	FieldShadow
	FieldContentType
	numFields
)

// MaxFields is the most fields an answer carries.
const MaxFields = int(numFields)

// Name returns the field's header name, lower case.
func (k Field) Name() string {
	switch k {
	case FieldRetryAfter:
		return HeaderRetryAfter
	case FieldPolicy:
		return HeaderRateLimitPolicy
	case FieldRateLimit:
		return HeaderRateLimit
	case FieldLimit:
		return HeaderLimit
	case FieldRemaining:
		return HeaderRemaining
	case FieldReset:
		return HeaderReset
	case FieldShadow:
		return HeaderShadow
	case FieldContentType:
		return HeaderContentType
	}
	return ""
}

// AppendFields appends the fields an answer carries under f, in the order
// they are sent; an answer omits a field whose value is empty.
func (f Families) AppendFields(dst []Field, denied, shadow bool) []Field {
	if denied {
		dst = append(dst, FieldRetryAfter)
	}
	if f.IETF() {
		dst = append(dst, FieldPolicy, FieldRateLimit)
	}
	if f.X() {
		dst = append(dst, FieldLimit, FieldRemaining, FieldReset)
	}
	switch {
	case denied:
		dst = append(dst, FieldContentType)
	case shadow:
		dst = append(dst, FieldShadow)
	}
	return dst
}

// Policy is a rule as the headers and the problem body name it, serialized
// once when the rules load. It is immutable once shared.
type Policy struct {
	name   string
	quota  int
	window int64
	item   string // `"name";q=N;w=W`
	head   string // `"name";r=`
	limit  string // N
	// problemTail is the body after the status member's value.
	problemTail string
	// Ref is the front-end's own number for the policy's rule; the core
	// never reads it, and its own policies have Ref -1.
	Ref int
}

// NewPolicy returns the policy of rule with limit l: quota l.Requests (0
// refuses everything), window in whole seconds rounded up.
func NewPolicy(rule string, l window.Limit) *Policy {
	name := PolicyName(rule)
	quoted := strconv.Quote(name) // = the sf-string and JSON string: name is printable ASCII
	w := max(ceilSeconds(l.Window), 1)
	p := &Policy{name: name, quota: l.Requests, window: w}
	p.item = quoted + ";q=" + strconv.Itoa(l.Requests) + ";w=" + strconv.FormatInt(w, 10)
	p.head = quoted + ";r="
	p.limit = strconv.Itoa(l.Requests)
	p.problemTail = `,"violated-policies":[` + quoted + `],"error":"too_many_requests","rule":` + quoted + `,"retry_after_ms":`
	return p
}

// PolicyName is rule as a policy name: bytes an RFC 8941 sf-string cannot
// hold, and '%', are percent-encoded.
func PolicyName(rule string) string {
	i := 0
	for i < len(rule) && rule[i] >= 0x20 && rule[i] < 0x7f && rule[i] != '%' {
		i++
	}
	if i == len(rule) {
		return rule
	}
	const hex = "0123456789ABCDEF"
	var b strings.Builder
	b.Grow(len(rule) + 8)
	b.WriteString(rule[:i])
	for ; i < len(rule); i++ {
		c := rule[i]
		if c >= 0x20 && c < 0x7f && c != '%' {
			b.WriteByte(c)
			continue
		}
		b.WriteByte('%')
		b.WriteByte(hex[c>>4])
		b.WriteByte(hex[c&15])
	}
	return b.String()
}

// Name returns the policy's name.
func (p *Policy) Name() string { return p.name }

// Quota returns q, the requests per window.
func (p *Policy) Quota() int { return p.quota }

// Window returns w, the window in whole seconds, rounded up.
func (p *Policy) Window() int64 { return p.window }

// Item returns the policy's RateLimit-Policy item, `"name";q=N;w=W`.
func (p *Policy) Item() string { return p.item }

// Limit returns the quota in decimal, x-ratelimit-limit's value.
func (p *Policy) Limit() string { return p.limit }

// AppendState appends the policy's RateLimit item for remaining requests
// (negative counts as 0) and t seconds.
func (p *Policy) AppendState(b []byte, remaining int, t int64) []byte {
	b = append(b, p.head...)
	b = strconv.AppendInt(b, int64(max(remaining, 0)), 10)
	b = append(b, ";t="...)
	return strconv.AppendInt(b, t, 10)
}

// AdmitT is t of an admission whose window gains room after reset: whole
// seconds rounded up, 1 to the window; the window when reset is 0.
func (p *Policy) AdmitT(reset time.Duration) int64 {
	if reset <= 0 {
		return p.window
	}
	return max(min(ceilSeconds(reset), p.window), 1)
}

// Reported returns p's state as a hit's own report says it.
func (p *Policy) Reported(r window.HitReport) State {
	if r.Over {
		return State{Policy: p, T: RetrySeconds(r.RetryAfter)}
	}
	return State{Policy: p, Remaining: min(max(r.Remaining, 0), p.quota), T: p.AdmitT(r.Reset)}
}

// Decided returns p's state as decision d, of which p is the binding limit,
// says it.
func (p *Policy) Decided(d *window.Decision) State {
	if !d.Allowed {
		return State{Policy: p, T: RetrySeconds(d.RetryAfter)}
	}
	return State{Policy: p, Remaining: min(max(d.Remaining, 0), p.quota), T: p.AdmitT(d.Reset)}
}

// RetrySeconds is a denial's Retry-After: whole seconds rounded up, ≥ 1.
func RetrySeconds(retryAfter time.Duration) int64 { return max(ceilSeconds(retryAfter), 1) }

func ceilSeconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Second - 1) / time.Second)
}

// problemType and problemHead begin every denial's body.
const (
	problemType = `{"type":"` + ProblemType + `","title":`
	problemHead = problemType + `"` + ProblemTitle + `","status":`
)

// AppendProblem appends the RFC 9457 body of a denial by p that may retry
// after retryAfter; it keeps the members error, rule and retry_after_ms. A
// nil p names no policy.
func (p *Policy) AppendProblem(b []byte, retryAfter time.Duration) []byte {
	return p.AppendProblemAs(b, retryAfter, 429, ProblemTitle)
}

// AppendProblemAs is [Policy.AppendProblem] for a denial answered with
// status and title instead of 429 (nginx's auth_request passes only 401
// and 403).
func (p *Policy) AppendProblemAs(b []byte, retryAfter time.Duration, status int, title string) []byte {
	ms := max(int64((retryAfter+time.Millisecond-1)/time.Millisecond), 1)
	if status == 429 && title == ProblemTitle {
		b = append(b, problemHead...)
	} else {
		b = append(b, problemType...)
		b = strconv.AppendQuote(b, title)
		b = append(b, `,"status":`...)
	}
	b = strconv.AppendInt(b, int64(status), 10)
	if p == nil {
		b = append(b, `,"violated-policies":[],"error":"too_many_requests","rule":"","retry_after_ms":`...)
	} else {
		b = append(b, p.problemTail...)
	}
	b = strconv.AppendInt(b, ms, 10)
	return append(b, '}')
}

// ProblemLen bounds the length of p's problem body, to size a buffer.
func (p *Policy) ProblemLen() int {
	n := len(problemHead) + 3 + 20 + 1 + 80
	if p != nil {
		n += len(p.problemTail)
	}
	return n
}

// State is one policy's RateLimit item: requests remaining, and T, the
// seconds until it has more or admits again.
type State struct {
	Policy    *Policy
	Remaining int
	T         int64
}

// Answer is what one answer says about rate limits.
type Answer struct {
	// Policies apply to the request, in rule order.
	Policies []*Policy
	// States are the policies whose state the answer knows, in rule order.
	States []State
	// Binding is the index in States the x family reports (a denial's
	// refusing one); -1 for none.
	Binding int
	// Denied: a 429; RetryAfter is how long until it would be admitted.
	Denied     bool
	RetryAfter time.Duration
	// Shadow: an admission shadow mode turned from a denial.
	Shadow bool
}

// binding returns the binding state, or nil.
func (a *Answer) binding() *State {
	if a.Binding >= 0 && a.Binding < len(a.States) {
		return &a.States[a.Binding]
	}
	return nil
}

// RetryAfterSeconds is a denial's Retry-After, never less than the
// binding state's t.
func (a *Answer) RetryAfterSeconds() int64 {
	s := RetrySeconds(a.RetryAfter)
	if b := a.binding(); b != nil {
		s = max(s, b.T)
	}
	return s
}

// Value returns field k's value in a, "" when a omits it.
func (a *Answer) Value(k Field) string {
	switch k {
	case FieldRetryAfter:
		return strconv.FormatInt(a.RetryAfterSeconds(), 10)
	case FieldLimit:
		if s := a.binding(); s != nil {
			return s.Policy.limit
		}
		return ""
	case FieldShadow:
		return "1"
	case FieldContentType:
		return ProblemContentType
	}
	return string(a.AppendValue(nil, k))
}

// AppendValue appends [Answer.Value] of k to b.
func (a *Answer) AppendValue(b []byte, k Field) []byte {
	switch k {
	case FieldRetryAfter:
		return strconv.AppendInt(b, a.RetryAfterSeconds(), 10)
	case FieldPolicy:
		return AppendPolicies(b, a.Policies)
	case FieldRateLimit:
		return AppendStates(b, a.States)
	case FieldRemaining, FieldReset:
		s := a.binding()
		switch {
		case s == nil:
			return b
		case k == FieldRemaining:
			return strconv.AppendInt(b, int64(max(s.Remaining, 0)), 10)
		}
		return strconv.AppendInt(b, s.T, 10)
	}
	return append(b, a.Value(k)...)
}

// AppendPolicies appends the RateLimit-Policy value of ps, each item once.
func AppendPolicies(b []byte, ps []*Policy) []byte {
	start := len(b)
	for i, p := range ps {
		if !firstPolicy(ps, i) {
			continue
		}
		if len(b) > start {
			b = append(b, ", "...)
		}
		b = append(b, p.item...)
	}
	return b
}

// firstPolicy reports whether ps[i] is the first with its item.
func firstPolicy(ps []*Policy, i int) bool {
	for _, q := range ps[:i] {
		if q == ps[i] || q.item == ps[i].item {
			return false
		}
	}
	return true
}

// AppendStates appends the RateLimit value of states.
func AppendStates(b []byte, states []State) []byte {
	for i := range states {
		if i > 0 {
			b = append(b, ", "...)
		}
		s := &states[i]
		b = s.Policy.AppendState(b, s.Remaining, s.T)
	}
	return b
}

// Headers calls add with each header field a carries under f, in order.
func (a *Answer) Headers(f Families, add func(name, value string)) {
	var buf [MaxFields]Field
	for _, k := range f.AppendFields(buf[:0], a.Denied, a.Shadow) {
		if v := a.Value(k); v != "" {
			add(k.Name(), v)
		}
	}
}

// Problem returns a denial's body for the binding state's policy.
func (a *Answer) Problem() string {
	p := a.bindingPolicy()
	return string(p.AppendProblem(make([]byte, 0, p.ProblemLen()), a.RetryAfter))
}

// AppendProblem appends a denial's body answered with status and title.
func (a *Answer) AppendProblem(b []byte, status int, title string) []byte {
	return a.bindingPolicy().AppendProblemAs(b, a.RetryAfter, status, title)
}

// bindingPolicy returns the binding state's policy, or nil.
func (a *Answer) bindingPolicy() *Policy {
	if b := a.binding(); b != nil {
		return b.Policy
	}
	return nil
}
