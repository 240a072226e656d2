package lease

import (
	"slices"
	"testing"
	"time"
)

// span is one admission as a caller saw it: decided somewhere between
// From and To (its send and its reply, or the instants a test brackets it
// with).
type span struct{ From, To time.Time }

// mostInOneWindow returns the most admissions certainly decided inside one
// span of length w: those whose latest instant is less than w after the
// earliest instant of the first of them. The invariant of a leased rule is
// mostInOneWindow(admissions, window) <= limit, for every key, whatever the
// load on the machine.
func mostInOneWindow(as []span, w time.Duration) int {
	sorted := slices.Clone(as)
	slices.SortFunc(sorted, func(a, b span) int { return a.From.Compare(b.From) })
	best := 0
	for i, first := range sorted {
		end := first.From.Add(w)
		n := 0
		for _, a := range sorted[i:] {
			if !a.From.Before(end) {
				break
			}
			if a.To.Before(end) {
				n++
			}
		}
		best = max(best, n)
	}
	return best
}

// checkInvariant fails t if some span of w holds more than limit of as.
func checkInvariant(t testing.TB, what string, as []span, limit int, w time.Duration) {
	t.Helper()
	if n := mostInOneWindow(as, w); n > limit {
		t.Errorf("%s: %d admissions certainly within one window of %s: the limit is %d", what, n, w, limit)
	}
}

func TestMostInOneWindow(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(ms ...int) []span {
		var out []span
		for _, m := range ms {
			d := time.Duration(m) * time.Millisecond
			out = append(out, span{t0.Add(d), t0.Add(d)})
		}
		return out
	}
	for name, tc := range map[string]struct {
		as   []span
		want int
	}{
		"none":                    {nil, 0},
		"all in one window":       {at(0, 10, 999), 3},
		"a window apart":          {at(0, 1000, 2000), 1},
		"sliding":                 {at(0, 500, 900, 1400, 1800), 3},
		"an unsure reply is left": {[]span{{t0, t0}, {t0.Add(100 * time.Millisecond), t0.Add(1100 * time.Millisecond)}}, 1},
	} {
		t.Run(name, func(t *testing.T) {
			if got := mostInOneWindow(tc.as, time.Second); got != tc.want {
				t.Errorf("mostInOneWindow = %d, want %d", got, tc.want)
			}
		})
	}
}
