package extauthz

import (
	"context"
	"slices"
	"testing"

	"github.com/flashgate/flashgate/enforce"
)

// TestDecideAnswersAsCheck: a request decided through Decide gets the
// answer Check gives the same request on a server of its own, in every
// family (headers in order, the body of a denial), and an answer Decide
// wrote stays as it was while later checks reuse the server's storage.
func TestDecideAnswersAsCheck(t *testing.T) {
	for _, f := range allFamilies {
		t.Run(f.String(), func(t *testing.T) {
			mod := func(o *enforce.Options) { o.Headers = f }
			viaCheck, viaDecide := newEnv(t, parse(t, headersYAML), mod), newEnv(t, parse(t, headersYAML), mod)
			if viaDecide.srv.Headers() != f {
				t.Fatalf("Headers() = %v, want %v", viaDecide.srv.Headers(), f)
			}
			type kept struct {
				a    *enforce.Answer
				list []string
			}
			var answers []kept
			for i := range 5 {
				r := req{path: "/", headers: uid("u")}
				want := viaCheck.check(r)
				var ca checkAttrs
				ca.set(r.proto())
				a := &enforce.Answer{}
				if err := viaDecide.srv.Decide(context.Background(), &ca, a); err != nil {
					t.Fatal(err)
				}
				var got []string
				a.Headers(f, func(k, v string) { got = append(got, k+": "+v) })
				if a.Denied == want.allowed || !slices.Equal(got, want.list) {
					t.Errorf("check %d: denied %v %q, want Check's allowed %v %q", i+1, a.Denied, got, want.allowed, want.list)
				}
				if a.Denied && a.Problem() != want.body {
					t.Errorf("check %d: body %s, want Check's %s", i+1, a.Problem(), want.body)
				}
				answers = append(answers, kept{a, got})
			}
			for i, k := range answers {
				var got []string
				k.a.Headers(f, func(k, v string) { got = append(got, k+": "+v) })
				if !slices.Equal(got, k.list) {
					t.Errorf("answer %d changed after later checks: %q, was %q", i+1, got, k.list)
				}
			}
		})
	}
}
