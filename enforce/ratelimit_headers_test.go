package enforce_test

import (
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/flashgate/flashgate/enforce"
	"github.com/flashgate/flashgate/enforce/enforcetest"
	"github.com/flashgate/flashgate/window"
)

func TestParseFamilies(t *testing.T) {
	for _, s := range []string{"both", "ietf", "x", "none"} {
		f, err := enforce.ParseFamilies(s)
		if err != nil || f.String() != s {
			t.Errorf("ParseFamilies(%q) = %v, %v", s, f, err)
		}
	}
	for _, s := range []string{"", "BOTH", "draft", "x,ietf"} {
		if _, err := enforce.ParseFamilies(s); err == nil {
			t.Errorf("ParseFamilies(%q) accepted", s)
		}
	}
	if enforce.Families(0) != enforce.FamiliesBoth {
		t.Error("the zero Families is not both")
	}
}

func TestPolicyName(t *testing.T) {
	for in, want := range map[string]string{
		"coupon_per_uid":       "coupon_per_uid",
		"path_api_coupon.uid":  "path_api_coupon.uid",
		`a "quoted" \ name`:    `a "quoted" \ name`,
		"café":                 "caf%C3%A9",
		"tab\there":            "tab%09here",
		"100%":                 "100%25",
		"key_/api/*.sub\x7f\n": "key_/api/*.sub%7F%0A",
	} {
		if got := enforce.PolicyName(in); got != want {
			t.Errorf("PolicyName(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestPolicyItems(t *testing.T) {
	tests := map[string]struct {
		rule  string
		limit window.Limit
		item  string
	}{
		"per second": {"coupon_per_uid", window.Limit{Requests: 5, Window: time.Second}, `"coupon_per_uid";q=5;w=1`},
		"sub-second": {"burst", window.Limit{Requests: 3, Window: 100 * time.Millisecond}, `"burst";q=3;w=1`},
		"rounded up": {"odd", window.Limit{Requests: 3, Window: 1500 * time.Millisecond}, `"odd";q=3;w=2`},
		"day":        {"daily", window.Limit{Requests: 1000, Window: 24 * time.Hour}, `"daily";q=1000;w=86400`},
		"escaped":    {`say "hi"`, window.Limit{Requests: 1, Window: time.Minute}, `"say \"hi\"";q=1;w=60`},
		"blocking":   {"blocked", window.Limit{Requests: 0, Window: time.Second}, `"blocked";q=0;w=1`},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			p := enforce.NewPolicy(tc.rule, tc.limit)
			if p.Item() != tc.item {
				t.Errorf("Item() = %s, want %s", p.Item(), tc.item)
			}
			items, err := enforcetest.ParseList(p.Item() + ", " + string(p.AppendState(nil, 2, 1)))
			if err != nil {
				t.Fatal(err)
			}
			if items[0].Value.Str != enforce.PolicyName(tc.rule) || items[1].Value.Str != items[0].Value.Str {
				t.Errorf("names %q, %q; want %q", items[0].Value.Str, items[1].Value.Str, enforce.PolicyName(tc.rule))
			}
		})
	}
}

func TestAdmitT(t *testing.T) {
	min := enforce.NewPolicy("m", window.Limit{Requests: 5, Window: time.Minute})
	sub := enforce.NewPolicy("s", window.Limit{Requests: 5, Window: 250 * time.Millisecond})
	for _, tc := range []struct {
		p     *enforce.Policy
		reset time.Duration
		want  int64
	}{
		{min, 0, 60},                       // unknown: the whole window
		{min, time.Minute, 60},             // a key the request started
		{min, 59*time.Second + 1, 60},      // rounded up
		{min, 30 * time.Second, 30},        // exact
		{min, time.Nanosecond, 1},          // at least 1
		{min, 2 * time.Minute, 60},         // never beyond the window
		{sub, 0, 1},                        // a sub-second window is w=1
		{sub, 100 * time.Millisecond, 1},   // rounded up
		{sub, 250 * time.Millisecond, 1},   // the whole window
		{min, -time.Second, 60},            // nonsense: unknown
		{sub, 10 * time.Second, 1},         // never beyond the window
		{min, 59*time.Second + 999999, 60}, // rounded up
	} {
		if got := tc.p.AdmitT(tc.reset); got != tc.want {
			t.Errorf("%s.AdmitT(%s) = %d, want %d", tc.p.Name(), tc.reset, got, tc.want)
		}
	}
	for d, want := range map[time.Duration]int64{0: 1, time.Millisecond: 1, time.Second: 1, time.Second + 1: 2, 5 * time.Minute: 300} {
		if got := enforce.RetrySeconds(d); got != want {
			t.Errorf("RetrySeconds(%s) = %d, want %d", d, got, want)
		}
	}
}

func headersOf(a *enforce.Answer, f enforce.Families) http.Header {
	h := http.Header{}
	a.Headers(f, func(k, v string) {
		if k != strings.ToLower(k) {
			panic("upper-case header name " + k)
		}
		h.Add(k, v)
	})
	return h
}

func TestAnswerHeaders(t *testing.T) {
	uid := enforce.NewPolicy("coupon_per_uid", window.Limit{Requests: 5, Window: time.Second})
	ip := enforce.NewPolicy("per_ip", window.Limit{Requests: 100, Window: time.Minute})
	pUID := enforcetest.Policy{Name: "coupon_per_uid", Quota: 5, Window: 1}
	pIP := enforcetest.Policy{Name: "per_ip", Quota: 100, Window: 60}
	tests := map[string]struct {
		a    enforce.Answer
		want enforcetest.Want
	}{
		"allowed": {
			a: enforce.Answer{Policies: []*enforce.Policy{uid, ip}, Binding: 0,
				States: []enforce.State{{Policy: uid, Remaining: 4, T: 1}, {Policy: ip, Remaining: 99, T: 60}}},
			want: enforcetest.Want{Policies: []enforcetest.Policy{pUID, pIP}, Binding: "coupon_per_uid",
				States: []enforcetest.State{{Name: "coupon_per_uid", Remaining: 4, T: 1}, {Name: "per_ip", Remaining: 99, T: 60}}},
		},
		"denied": {
			a: enforce.Answer{Policies: []*enforce.Policy{uid, ip}, Binding: 0, Denied: true, RetryAfter: 700 * time.Millisecond,
				States: []enforce.State{{Policy: uid, Remaining: 0, T: 1}, {Policy: ip, Remaining: 95, T: 42}}},
			want: enforcetest.Want{Policies: []enforcetest.Policy{pUID, pIP}, Binding: "coupon_per_uid", Denied: true, RetryAfter: 1,
				States: []enforcetest.State{{Name: "coupon_per_uid", Remaining: 0, T: 1}, {Name: "per_ip", Remaining: 95, T: 42}}},
		},
		"shadow": {
			a: enforce.Answer{Policies: []*enforce.Policy{uid}, Binding: 0, Shadow: true,
				States: []enforce.State{{Policy: uid, Remaining: 0, T: 1}}},
			want: enforcetest.Want{Policies: []enforcetest.Policy{pUID}, Binding: "coupon_per_uid", Shadow: true,
				States: []enforcetest.State{{Name: "coupon_per_uid", Remaining: 0, T: 1}}},
		},
		"failure mode allow: policies only": {
			a:    enforce.Answer{Policies: []*enforce.Policy{uid, ip}, Binding: -1},
			want: enforcetest.Want{Policies: []enforcetest.Policy{pUID, pIP}},
		},
		"one policy twice is listed once": {
			a: enforce.Answer{Policies: []*enforce.Policy{ip, enforce.NewPolicy("per_ip", window.Limit{Requests: 100, Window: time.Minute})}, Binding: 1,
				States: []enforce.State{{Policy: ip, Remaining: 9, T: 60}, {Policy: ip, Remaining: 3, T: 60}}},
			want: enforcetest.Want{Policies: []enforcetest.Policy{pIP}, Binding: "per_ip",
				States: []enforcetest.State{{Name: "per_ip", Remaining: 9, T: 60}, {Name: "per_ip", Remaining: 3, T: 60}}},
		},
		"nothing matched": {a: enforce.Answer{Binding: -1}},
	}
	for name, tc := range tests {
		for _, f := range []enforce.Families{enforce.FamiliesBoth, enforce.FamiliesIETF, enforce.FamiliesX, enforce.FamiliesNone} {
			t.Run(name+"/"+f.String(), func(t *testing.T) {
				want := tc.want
				want.Families = f
				got := enforcetest.CheckHeaders(t, headersOf(&tc.a, f), want)
				if tc.a.Denied {
					h := headersOf(&tc.a, f)
					p := enforcetest.CheckProblem(t, h, tc.a.Problem(), 429, "coupon_per_uid")
					if p.RetryAfterMS != 700 || got.RetryAfter != 1 {
						t.Errorf("retry_after_ms %d, retry-after %d; want 700, 1", p.RetryAfterMS, got.RetryAfter)
					}
				}
			})
		}
	}
}

func TestRetryAfterNeverBeforeT(t *testing.T) {
	p := enforce.NewPolicy("r", window.Limit{Requests: 1, Window: time.Minute})
	a := enforce.Answer{Policies: []*enforce.Policy{p}, Binding: 0, Denied: true, RetryAfter: 1500 * time.Millisecond,
		States: []enforce.State{{Policy: p, T: 5}}}
	if got := a.RetryAfterSeconds(); got != 5 {
		t.Errorf("retry-after %d, want the denying policy's t 5", got)
	}
}

func TestProblem(t *testing.T) {
	p := enforce.NewPolicy(`odd "rule"`, window.Limit{Requests: 1, Window: time.Second})
	body := string(p.AppendProblem(nil, 1234567*time.Microsecond))
	if len(body) > p.ProblemLen() {
		t.Errorf("body of %d bytes, ProblemLen %d", len(body), p.ProblemLen())
	}
	h := http.Header{"Content-Type": {enforce.ProblemContentType}, "Retry-After": {"2"}}
	if got := enforcetest.CheckProblem(t, h, body, 429, `odd "rule"`); got.RetryAfterMS != 1235 {
		t.Errorf("retry_after_ms %d, want 1235", got.RetryAfterMS)
	}
	for _, status := range []int{401, 403} {
		as := string(p.AppendProblemAs(nil, 1234567*time.Microsecond, status, http.StatusText(status)))
		enforcetest.CheckProblem(t, h, as, status, `odd "rule"`)
		want := strings.Replace(body, `"title":"Too Many Requests","status":429`,
			`"title":"`+http.StatusText(status)+`","status":`+strconv.Itoa(status), 1)
		if as != want {
			t.Errorf("answered %d: %s, want the 429 body with its status and title %s", status, as, want)
		}
	}
	var nilPolicy *enforce.Policy
	if b := string(nilPolicy.AppendProblem(nil, 0)); !strings.Contains(b, `"violated-policies":[]`) || !strings.HasSuffix(b, `"retry_after_ms":1}`) {
		t.Errorf("body without a policy: %s", b)
	}
}

// TestAppendValue: every field's appended value is its Value, after what
// the buffer held.
func TestAppendValue(t *testing.T) {
	p := enforce.NewPolicy("r", window.Limit{Requests: 7, Window: time.Minute})
	q := enforce.NewPolicy("q", window.Limit{Requests: 2, Window: time.Second})
	for name, a := range map[string]enforce.Answer{
		"denied": {Policies: []*enforce.Policy{p, q}, Binding: 1, Denied: true, RetryAfter: 1500 * time.Millisecond,
			States: []enforce.State{{Policy: p, Remaining: 3, T: 40}, {Policy: q, T: 2}}},
		"no binding": {Policies: []*enforce.Policy{p}, Binding: -1, Shadow: true},
	} {
		for k := enforce.Field(0); int(k) < enforce.MaxFields; k++ {
			if got, want := string(a.AppendValue([]byte("pre:"), k)), "pre:"+a.Value(k); got != want {
				t.Errorf("%s: field %s: %q, want %q", name, k.Name(), got, want)
			}
		}
	}
}

func TestStates(t *testing.T) {
	p := enforce.NewPolicy("p", window.Limit{Requests: 5, Window: time.Minute})
	for name, tc := range map[string]struct {
		got, want enforce.State
	}{
		"reported room":          {p.Reported(window.HitReport{Known: true, Remaining: 3, Reset: 20 * time.Second}), enforce.State{Policy: p, Remaining: 3, T: 20}},
		"reported unknown reset": {p.Reported(window.HitReport{Known: true, Remaining: 3}), enforce.State{Policy: p, Remaining: 3, T: 60}},
		"reported over":          {p.Reported(window.HitReport{Known: true, Over: true, RetryAfter: 1500 * time.Millisecond}), enforce.State{Policy: p, T: 2}},
		"reported a fallback's share above the quota": {p.Reported(window.HitReport{Known: true, Remaining: 9}), enforce.State{Policy: p, Remaining: 5, T: 60}},
		"decided admission":                           {p.Decided(&window.Decision{Allowed: true, Remaining: 4, Reset: time.Minute}), enforce.State{Policy: p, Remaining: 4, T: 60}},
		"decided denial":                              {p.Decided(&window.Decision{Remaining: 0, RetryAfter: 5 * time.Minute}), enforce.State{Policy: p, T: 300}},
	} {
		if tc.got != tc.want {
			t.Errorf("%s: %+v, want %+v", name, tc.got, tc.want)
		}
	}
}
