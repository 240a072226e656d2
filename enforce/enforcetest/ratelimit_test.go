package enforcetest

import (
	"fmt"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/flashgate/flashgate/enforce"
)

// recorder is a testing.TB that keeps the failures of a check.
type recorder struct {
	testing.TB
	mu   sync.Mutex
	errs []string
}

func (r *recorder) Helper() {}

func (r *recorder) Errorf(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.errs = append(r.errs, fmt.Sprintf(format, args...))
}

func (r *recorder) Fatalf(format string, args ...any) {
	r.Errorf(format, args...)
	runtime.Goexit()
}

// failures runs check with a recorder and returns what it reported.
func failures(t *testing.T, check func(testing.TB)) []string {
	r := &recorder{TB: t}
	done := make(chan struct{})
	go func() { defer close(done); check(r) }()
	<-done
	return r.errs
}

func header(kv ...string) http.Header {
	h := http.Header{}
	for i := 0; i < len(kv); i += 2 {
		h.Add(kv[i], kv[i+1])
	}
	return h
}

// TestReadHeadersRefuses: what ReadHeaders must not let through.
func TestReadHeadersRefuses(t *testing.T) {
	const pol, st = `"a";q=5;w=1`, `"a";r=4;t=1`
	for name, tc := range map[string]struct {
		h    http.Header
		want string
	}{
		"token name":         {header("ratelimit-policy", `a;q=5;w=1`), "not an sf-string"},
		"no q":               {header("ratelimit-policy", `"a";w=1`), "has no q"},
		"decimal q":          {header("ratelimit-policy", `"a";q=5.0;w=1`), "want an Integer"},
		"w zero":             {header("ratelimit-policy", `"a";q=5;w=0`), "w=0"},
		"unknown parameter":  {header("ratelimit-policy", `"a";q=5;w=1;pk=:YQ==:`), "parameter pk"},
		"policy twice":       {header("ratelimit-policy", pol+", "+pol), "listed twice"},
		"empty policy":       {header("ratelimit-policy", ""), "empty list"},
		"bad list":           {header("ratelimit-policy", pol+","), "trailing comma"},
		"inner list":         {header("ratelimit-policy", `("a");q=1;w=1`), "inner list true"},
		"no t":               {header("ratelimit-policy", pol, "ratelimit", `"a";r=4`), "has no t"},
		"t zero":             {header("ratelimit-policy", pol, "ratelimit", `"a";r=4;t=0`), "t=0"},
		"negative r":         {header("ratelimit-policy", pol, "ratelimit", `"a";r=-1;t=1`), "r=-1"},
		"r above q":          {header("ratelimit-policy", pol, "ratelimit", `"a";r=6;t=1`), "above its policy's q=5"},
		"unlisted policy":    {header("ratelimit-policy", pol, "ratelimit", `"b";r=1;t=1`), "not a policy"},
		"state alone":        {header("ratelimit", st), "without ratelimit-policy"},
		"two lines":          {header("ratelimit-policy", pol, "ratelimit-policy", pol), "2 field lines"},
		"partial x family":   {header("x-ratelimit-limit", "5"), "1 of the 3"},
		"x not a number":     {header("x-ratelimit-limit", "5", "x-ratelimit-remaining", "4", "x-ratelimit-reset", "1.0"), "not a whole number"},
		"x signed":           {header("x-ratelimit-limit", "5", "x-ratelimit-remaining", "+4", "x-ratelimit-reset", "1"), "not a whole number"},
		"x repeats no state": {header("ratelimit-policy", pol, "ratelimit", st, "x-ratelimit-limit", "5", "x-ratelimit-remaining", "3", "x-ratelimit-reset", "1"), "repeats no RateLimit item"},
		"retry-after date":   {header("retry-after", "Wed, 21 Oct 2015 07:28:00 GMT"), "not a whole number"},
		"retry-after zero":   {header("retry-after", "0"), "at least 1"},
		"reset not retry":    {header("retry-after", "2", "x-ratelimit-limit", "5", "x-ratelimit-remaining", "0", "x-ratelimit-reset", "1"), "want its retry-after 2"},
	} {
		t.Run(name, func(t *testing.T) {
			errs := failures(t, func(tb testing.TB) { ReadHeaders(tb, tc.h) })
			if !strings.Contains(strings.Join(errs, "\n"), tc.want) {
				t.Errorf("failures %q, want one saying %q", errs, tc.want)
			}
		})
	}
	// A good answer passes.
	good := header("retry-after", "1", "ratelimit-policy", pol+`, "b";q=10;w=60`, "ratelimit", `"a";r=0;t=1, "b";r=9;t=60`,
		"x-ratelimit-limit", "5", "x-ratelimit-remaining", "0", "x-ratelimit-reset", "1")
	if errs := failures(t, func(tb testing.TB) { ReadHeaders(tb, good) }); len(errs) > 0 {
		t.Errorf("a good answer: %q", errs)
	}
}

// TestCheckHeadersRefuses: what CheckHeaders must tell from the answer w
// describes.
func TestCheckHeadersRefuses(t *testing.T) {
	pols := []Policy{{Name: "a", Quota: 5, Window: 60}}
	ok := Want{Families: enforce.FamiliesBoth, Policies: pols, Binding: "a", States: []State{{Name: "a", Remaining: 4}}}
	good := header("ratelimit-policy", `"a";q=5;w=60`, "ratelimit", `"a";r=4;t=60`,
		"x-ratelimit-limit", "5", "x-ratelimit-remaining", "4", "x-ratelimit-reset", "60")
	if errs := failures(t, func(tb testing.TB) { CheckHeaders(tb, good, ok) }); len(errs) > 0 {
		t.Fatalf("a good answer: %q", errs)
	}
	with := func(mod func(h http.Header)) http.Header {
		h := good.Clone()
		mod(h)
		return h
	}
	for name, tc := range map[string]struct {
		h    http.Header
		w    Want
		want string
	}{
		"other remaining": {with(func(h http.Header) {
			h.Set("ratelimit", `"a";r=3;t=60`)
			h.Set("x-ratelimit-remaining", "3")
		}), ok, "want [{a 4 0}]"},
		"t beyond the window": {with(func(h http.Header) {
			h.Set("ratelimit", `"a";r=4;t=61`)
			h.Set("x-ratelimit-reset", "61")
		}), ok, "1 to the policy's w"},
		"x family under ietf":    {good, Want{Families: enforce.FamiliesIETF, Policies: pols, Binding: "a", States: ok.States}, "families ietf"},
		"ietf under x":           {good, Want{Families: enforce.FamiliesX, Policies: pols, Binding: "a", States: ok.States}, "families x"},
		"shadow mark missing":    {good, Want{Families: enforce.FamiliesBoth, Policies: pols, Binding: "a", States: ok.States, Shadow: true}, "x-ratelimit-shadow"},
		"retry-after on an OK":   {with(func(h http.Header) { h.Set("retry-after", "60") }), ok, "not denied"},
		"denial without problem": {with(func(h http.Header) { h.Set("retry-after", "60") }), Want{Families: enforce.FamiliesBoth, Policies: pols, Binding: "a", Denied: true, States: ok.States}, "content-type"},
	} {
		t.Run(name, func(t *testing.T) {
			errs := failures(t, func(tb testing.TB) { CheckHeaders(tb, tc.h, tc.w) })
			if !strings.Contains(strings.Join(errs, "\n"), tc.want) {
				t.Errorf("failures %q, want one saying %q", errs, tc.want)
			}
		})
	}
}

func TestCheckProblemRefuses(t *testing.T) {
	h := header("content-type", enforce.ProblemContentType, "retry-after", "1")
	const good = `{"type":"` + enforce.ProblemType + `","title":"Too Many Requests","status":429,"violated-policies":["a"],"error":"too_many_requests","rule":"a","retry_after_ms":700}`
	if errs := failures(t, func(tb testing.TB) { CheckProblem(tb, h, good, 429, "a") }); len(errs) > 0 {
		t.Fatalf("a good body: %q", errs)
	}
	for name, tc := range map[string]struct {
		h          http.Header
		body, want string
	}{
		"json content type": {header("content-type", "application/json"), good, "content-type"},
		"old body":          {h, `{"error":"too_many_requests","rule":"a","retry_after_ms":700}`, `no member "type"`},
		"other rule":        {h, strings.ReplaceAll(good, `"a"`, `"b"`), `violated-policies ["a"]`},
		"after retry-after": {h, strings.Replace(good, "700", "1700", 1), "after retry-after"},
		"not json":          {h, "Too Many Requests", "not a JSON object"},
	} {
		t.Run(name, func(t *testing.T) {
			errs := failures(t, func(tb testing.TB) { CheckProblem(tb, tc.h, tc.body, 429, "a") })
			if !strings.Contains(strings.Join(errs, "\n"), tc.want) {
				t.Errorf("failures %q, want one saying %q", errs, tc.want)
			}
		})
	}
}
