package enforcetest

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"

	"github.com/flashgate/flashgate/enforce"
	"github.com/flashgate/flashgate/window"
)

// Policy is a RateLimit-Policy item: the policy's name, q and w.
type Policy struct {
	Name   string
	Quota  int64
	Window int64
}

// PolicyOf is the RateLimit-Policy item of the rule name with limit l.
func PolicyOf(name string, l window.Limit) Policy {
	return Policy{Name: name, Quota: int64(l.Requests), Window: int64((l.Window + time.Second - 1) / time.Second)}
}

// State is a RateLimit item. In a [Want], T 0 stands for any t from 1 to
// the policy's w.
type State struct {
	Name      string
	Remaining int64
	T         int64
}

// Want is what an answer's rate-limit header fields must say.
type Want struct {
	Families enforce.Families
	// Policies and States: the fields' items, in order; none: no field.
	Policies []Policy
	States   []State
	// Binding names the state the x family reports; "": no x family.
	Binding string
	// Denied: a 429 with content-type and Retry-After (0: any valid).
	Denied     bool
	RetryAfter int64
	Shadow     bool
}

// Got is an answer's rate-limit header fields, parsed; -1 when absent.
type Got struct {
	Policies                []Policy
	States                  []State
	Limit, Remaining, Reset int64
	RetryAfter              int64
}

// GRPCHeaders returns an ext_authz answer's headers; it fails t if a name
// is not lower case or appears twice.
func GRPCHeaders(t testing.TB, hs []*corev3.HeaderValueOption) http.Header {
	t.Helper()
	kvs := make([]*corev3.HeaderValue, len(hs))
	for i, h := range hs {
		kvs[i] = h.GetHeader()
	}
	return HeaderValues(t, kvs)
}

// HeaderValues is [GRPCHeaders] for plain header values.
func HeaderValues(t testing.TB, hs []*corev3.HeaderValue) http.Header {
	t.Helper()
	h := http.Header{}
	for _, kv := range hs {
		k := kv.GetKey()
		if k != strings.ToLower(k) {
			t.Errorf("header %q is not lower case", k)
		}
		if h.Get(k) != "" {
			t.Errorf("header %q appears twice", k)
		}
		h.Add(k, kv.GetValue())
	}
	return h
}

// ReadHeaders reads the rate-limit header fields of h and checks them
// against the draft's grammar and each other: every RateLimit item names a
// listed policy with r ≤ q, the x family comes whole and repeats an item,
// and a denial's Retry-After is never earlier than the denying policy's t.
func ReadHeaders(t testing.TB, h http.Header) Got {
	t.Helper()
	got := Got{Limit: -1, Remaining: -1, Reset: -1, RetryAfter: -1}
	if v, ok := oneValue(t, h, enforce.HeaderRateLimitPolicy); ok {
		got.Policies = parsePolicies(t, v)
	}
	if v, ok := oneValue(t, h, enforce.HeaderRateLimit); ok {
		if h.Get(enforce.HeaderRateLimitPolicy) == "" {
			t.Errorf("%s %q without %s", enforce.HeaderRateLimit, v, enforce.HeaderRateLimitPolicy)
		}
		got.States = parseStates(t, v, got.Policies)
	}
	xs := 0
	for _, name := range []string{enforce.HeaderLimit, enforce.HeaderRemaining, enforce.HeaderReset} {
		if len(h.Values(name)) > 0 {
			xs++
		}
	}
	switch xs {
	case 0:
	case 3:
		got.Limit = wholeNumber(t, h, enforce.HeaderLimit)
		got.Remaining = wholeNumber(t, h, enforce.HeaderRemaining)
		got.Reset = wholeNumber(t, h, enforce.HeaderReset)
		if got.Reset < 1 {
			t.Errorf("x-ratelimit-reset %d, want at least 1", got.Reset)
		}
		if got.Remaining > got.Limit {
			t.Errorf("x-ratelimit-remaining %d above x-ratelimit-limit %d", got.Remaining, got.Limit)
		}
		if got.States != nil && !got.xRepeatsState() {
			t.Errorf("the x family (limit %d, remaining %d, reset %d) repeats no RateLimit item of %v under %v",
				got.Limit, got.Remaining, got.Reset, got.States, got.Policies)
		}
	default:
		t.Errorf("%d of the 3 x-ratelimit-* fields, want all or none", xs)
	}
	if len(h.Values(enforce.HeaderRetryAfter)) > 0 {
		got.RetryAfter = wholeNumber(t, h, enforce.HeaderRetryAfter)
		if got.RetryAfter < 1 {
			t.Errorf("retry-after %d, want at least 1", got.RetryAfter)
		}
		if got.Reset >= 0 && got.Reset != got.RetryAfter {
			t.Errorf("x-ratelimit-reset %d of a denial, want its retry-after %d", got.Reset, got.RetryAfter)
		}
	}
	return got
}

// xRepeatsState reports whether the x family is some RateLimit item's.
func (g *Got) xRepeatsState() bool {
	for _, s := range g.States {
		for _, p := range g.Policies {
			if p.Name == s.Name && p.Quota == g.Limit && s.Remaining == g.Remaining && s.T == g.Reset {
				return true
			}
		}
	}
	return false
}

// State returns the RateLimit item of the policy named name.
func (g *Got) State(name string) (State, bool) {
	for _, s := range g.States {
		if s.Name == name {
			return s, true
		}
	}
	return State{}, false
}

// CheckHeaders reads h as [ReadHeaders] does, checks it against w, and
// returns what it read.
func CheckHeaders(t testing.TB, h http.Header, w Want) Got {
	t.Helper()
	got := ReadHeaders(t, h)
	absent := func(name, why string) {
		if v, ok := oneValue(t, h, name); ok {
			t.Errorf("%s: %q, want none (%s)", name, v, why)
		}
	}
	if w.Families.IETF() {
		comparePolicies(t, got.Policies, w.Policies)
		compareStates(t, got.States, w.States, got.Policies)
	} else {
		absent(enforce.HeaderRateLimitPolicy, "families "+w.Families.String())
		absent(enforce.HeaderRateLimit, "families "+w.Families.String())
	}

	var bind *State
	var bindPolicy *Policy
	if w.Binding != "" {
		for i := range w.States {
			if w.States[i].Name == w.Binding {
				bind = &w.States[i]
			}
		}
		for i := range got.States {
			if got.States[i].Name == w.Binding {
				bind = &got.States[i]
			}
		}
		for i := range w.Policies {
			if w.Policies[i].Name == w.Binding {
				bindPolicy = &w.Policies[i]
			}
		}
		if bind == nil || bindPolicy == nil {
			t.Fatalf("want binding %q among the states and policies of %+v", w.Binding, w)
		}
	}

	if w.Families.X() && bind != nil {
		if got.Limit != bindPolicy.Quota || got.Remaining != bind.Remaining {
			t.Errorf("x-ratelimit-limit %d, -remaining %d; want %d, %d (the binding %s)", got.Limit, got.Remaining, bindPolicy.Quota, bind.Remaining, w.Binding)
		}
		if bind.T != 0 && got.Reset != bind.T || got.Reset < 1 || got.Reset > maxT(bindPolicy, w.Denied) {
			t.Errorf("x-ratelimit-reset %d; want the binding %s's t %d (1 to %d)", got.Reset, w.Binding, bind.T, bindPolicy.Window)
		}
	} else {
		why := "families " + w.Families.String()
		if w.Families.X() {
			why = "no binding rule"
		}
		absent(enforce.HeaderLimit, why)
		absent(enforce.HeaderRemaining, why)
		absent(enforce.HeaderReset, why)
	}

	if w.Denied {
		switch {
		case got.RetryAfter < 1:
			t.Errorf("retry-after %d, want at least 1", got.RetryAfter)
		case w.RetryAfter != 0 && got.RetryAfter != w.RetryAfter:
			t.Errorf("retry-after %d, want %d", got.RetryAfter, w.RetryAfter)
		case bind != nil && bind.T > got.RetryAfter:
			t.Errorf("retry-after %d is earlier than the denying %s's t %d", got.RetryAfter, w.Binding, bind.T)
		}
		if v, _ := oneValue(t, h, enforce.HeaderContentType); v != enforce.ProblemContentType {
			t.Errorf("content-type %q, want %s", v, enforce.ProblemContentType)
		}
	} else {
		absent(enforce.HeaderRetryAfter, "not denied")
		absent(enforce.HeaderContentType, "not denied")
	}

	if w.Shadow {
		if v, _ := oneValue(t, h, enforce.HeaderShadow); v != "1" {
			t.Errorf("x-ratelimit-shadow %q, want 1", v)
		}
	} else {
		absent(enforce.HeaderShadow, "not a shadow admission")
	}
	return got
}

// oneValue returns name's value in h, failing t on several field lines.
func oneValue(t testing.TB, h http.Header, name string) (string, bool) {
	t.Helper()
	vs := h.Values(name)
	if len(vs) > 1 {
		t.Errorf("%s: %d field lines, want one", name, len(vs))
	}
	if len(vs) == 0 {
		return "", false
	}
	return vs[0], true
}

// maxT is the largest t a state of p may have: its window, or for a denial
// unbounded (a penalty box outlasts the window).
func maxT(p *Policy, denied bool) int64 {
	if denied {
		return 1 << 40
	}
	return max(p.Window, 1)
}

// wholeNumber reads name's value as whole seconds or a count: digits only.
func wholeNumber(t testing.TB, h http.Header, name string) int64 {
	t.Helper()
	vs := h.Values(name)
	if len(vs) != 1 {
		t.Errorf("%s: %d field lines, want one", name, len(vs))
		return -1
	}
	v := vs[0]
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || v == "" || strings.TrimLeft(v, "0123456789") != "" {
		t.Errorf("%s: %q is not a whole number", name, v)
		return -1
	}
	return n
}

// namedItem is a policy's name and its two Integer parameters.
type namedItem struct {
	name string
	a, b int64
}

// parseNamed reads a non-empty List of sf-strings, each with exactly the
// Integer parameters ka ≥ leastA and kb ≥ leastB.
func parseNamed(t testing.TB, field, v, ka string, leastA int64, kb string, leastB int64) []namedItem {
	t.Helper()
	var out []namedItem
	for _, it := range mustList(t, field, v) {
		name, ok := itemName(t, field, v, it)
		if !ok {
			continue
		}
		a, b := intParam(t, field, it, ka, leastA), intParam(t, field, it, kb, leastB)
		onlyParams(t, field, it, ka, kb)
		out = append(out, namedItem{name, a, b})
	}
	return out
}

// parsePolicies reads a RateLimit-Policy value, names unique.
func parsePolicies(t testing.TB, v string) []Policy {
	t.Helper()
	var out []Policy
	for _, it := range parseNamed(t, enforce.HeaderRateLimitPolicy, v, "q", 0, "w", 1) {
		for _, p := range out {
			if p.Name == it.name {
				t.Errorf("%s %q: policy %q listed twice", enforce.HeaderRateLimitPolicy, v, it.name)
			}
		}
		out = append(out, Policy{Name: it.name, Quota: it.a, Window: it.b})
	}
	return out
}

// parseStates reads a RateLimit value against policies.
func parseStates(t testing.TB, v string, policies []Policy) []State {
	t.Helper()
	var out []State
	for _, it := range parseNamed(t, enforce.HeaderRateLimit, v, "r", 0, "t", 1) {
		found := false
		for _, p := range policies {
			if p.Name == it.name {
				found = true
				if it.a > p.Quota {
					t.Errorf("%s %q: %q has r=%d above its policy's q=%d", enforce.HeaderRateLimit, v, it.name, it.a, p.Quota)
				}
			}
		}
		if !found && policies != nil {
			t.Errorf("%s %q: %q is not a policy of RateLimit-Policy", enforce.HeaderRateLimit, v, it.name)
		}
		out = append(out, State{Name: it.name, Remaining: it.a, T: it.b})
	}
	return out
}

func mustList(t testing.TB, field, v string) []Item {
	t.Helper()
	items, err := ParseList(v)
	if err == nil && len(items) == 0 {
		err = errEmpty
	}
	if err != nil {
		t.Errorf("%s %q: %v", field, v, err)
	}
	return items
}

func itemName(t testing.TB, field, v string, it Item) (string, bool) {
	t.Helper()
	if it.Inner || it.Value.Kind != KindString {
		t.Errorf("%s %q: a member is not an sf-string (kind %s, inner list %v)", field, v, it.Value.Kind, it.Inner)
		return "", false
	}
	if it.Value.Str == "" {
		t.Errorf("%s %q: a policy without a name", field, v)
	}
	return it.Value.Str, true
}

// intParam returns it's Integer parameter key, at least least.
func intParam(t testing.TB, field string, it Item, key string, least int64) int64 {
	t.Helper()
	p, ok := it.Param(key)
	switch {
	case !ok:
		t.Errorf("%s: %q has no %s", field, it.Value.Str, key)
	case p.Kind != KindInteger:
		t.Errorf("%s: %q has %s of kind %s, want an Integer", field, it.Value.Str, key, p.Kind)
	case p.Int < least:
		t.Errorf("%s: %q has %s=%d, want at least %d", field, it.Value.Str, key, p.Int, least)
	}
	return p.Int
}

func onlyParams(t testing.TB, field string, it Item, keys ...string) {
	t.Helper()
	for _, p := range it.Params {
		known := false
		for _, k := range keys {
			known = known || p.Key == k
		}
		if !known {
			t.Errorf("%s: %q has parameter %s, want only %v", field, it.Value.Str, p.Key, keys)
		}
	}
}

func comparePolicies(t testing.TB, got, want []Policy) {
	t.Helper()
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("%s lists %v, want %v", enforce.HeaderRateLimitPolicy, got, want)
	}
}

func compareStates(t testing.TB, got, want []State, policies []Policy) {
	t.Helper()
	if len(got) != len(want) {
		t.Errorf("%s lists %v, want %v", enforce.HeaderRateLimit, got, want)
		return
	}
	for i := range want {
		g, w := got[i], want[i]
		bad := g.Name != w.Name || g.Remaining != w.Remaining || w.T != 0 && g.T != w.T
		if w.T == 0 {
			for _, p := range policies {
				if p.Name == g.Name && (g.T < 1 || g.T > max(p.Window, 1)) {
					bad = true
				}
			}
		}
		if bad {
			t.Errorf("%s lists %v, want %v (t 0: 1 to the policy's w)", enforce.HeaderRateLimit, got, want)
			return
		}
	}
}

// Problem is a denial's body as CheckProblem read it.
type Problem struct {
	Type             string   `json:"type"`
	Title            string   `json:"title"`
	Status           int      `json:"status"`
	ViolatedPolicies []string `json:"violated-policies"`
	Error            string   `json:"error"`
	Rule             string   `json:"rule"`
	RetryAfterMS     int64    `json:"retry_after_ms"`
}

// CheckProblem checks a denial's content type and RFC 9457 body, naming
// rule as its one violated policy, and returns the body.
func CheckProblem(t testing.TB, h http.Header, body string, status int, rule string) Problem {
	t.Helper()
	if ct := h.Get(enforce.HeaderContentType); ct != enforce.ProblemContentType {
		t.Errorf("content-type %q, want %s", ct, enforce.ProblemContentType)
	}
	var members map[string]json.RawMessage
	if err := json.Unmarshal([]byte(body), &members); err != nil {
		t.Fatalf("body %q is not a JSON object: %v", body, err)
	}
	for _, k := range []string{"type", "title", "status", "violated-policies", "error", "rule", "retry_after_ms"} {
		if _, ok := members[k]; !ok {
			t.Errorf("body %s has no member %q", body, k)
		}
	}
	var p Problem
	if err := json.Unmarshal([]byte(body), &p); err != nil {
		t.Fatalf("body %q: %v", body, err)
	}
	title := enforce.ProblemTitle
	if status != http.StatusTooManyRequests {
		title = http.StatusText(status)
	}
	if p.Type != enforce.ProblemType || p.Title != title || p.Status != status || p.Error != "too_many_requests" {
		t.Errorf("body %s: want type %s, title %q, status %d, error too_many_requests", body, enforce.ProblemType, title, status)
	}
	if len(p.ViolatedPolicies) != 1 || p.ViolatedPolicies[0] != rule || p.Rule != rule {
		t.Errorf("body %s: want rule and violated-policies [%q]", body, rule)
	}
	if p.RetryAfterMS < 1 {
		t.Errorf("body %s: retry_after_ms %d, want at least 1", body, p.RetryAfterMS)
	}
	if ra, err := strconv.ParseInt(h.Get(enforce.HeaderRetryAfter), 10, 64); err == nil && p.RetryAfterMS > ra*1000 {
		t.Errorf("body %s: retry_after_ms %d is after retry-after %d s", body, p.RetryAfterMS, ra)
	}
	return p
}
