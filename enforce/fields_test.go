package enforce

import (
	"errors"
	"testing"
	"time"

	"github.com/flashgate/flashgate/window"
)

// wantField checks that err is a *FieldError about field saying msg, or
// nil when msg is "".
func wantField(t *testing.T, err error, field, msg string) {
	t.Helper()
	if msg == "" {
		if err != nil {
			t.Fatalf("error %v, want none", err)
		}
		return
	}
	var fe *FieldError
	if !errors.As(err, &fe) {
		t.Fatalf("error %v (%T), want a *FieldError", err, err)
	}
	if fe.Field != field || fe.Msg != msg {
		t.Errorf("got  %q: %s\nwant %q: %s", fe.Field, fe.Msg, field, msg)
	}
}

func TestCheckFailureMode(t *testing.T) {
	tests := map[string]struct {
		in   string
		want FailureMode
		msg  string
	}{
		"local":   {in: "local", want: FailureLocal},
		"allow":   {in: "allow", want: FailureAllow},
		"deny":    {in: "deny", want: FailureDeny},
		"unknown": {in: "open", msg: `failure_mode "open" must be local, allow or deny`},
		"empty":   {in: "", msg: `failure_mode "" must be local, allow or deny`},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := CheckFailureMode(tc.in)
			wantField(t, err, "failure_mode", tc.msg)
			if got != tc.want {
				t.Errorf("mode %s, want %s", got, tc.want)
			}
		})
	}
}

func TestCheckLocalShare(t *testing.T) {
	const omit = " (omit it to share the limit evenly among the live sidecars)"
	tests := map[string]struct {
		in  int64
		msg string
	}{
		"one":      {in: 1},
		"the most": {in: 1_000_000},
		"zero":     {in: 0, msg: "local_share must be between 1 and 1000000, not 0" + omit},
		"negative": {in: -2, msg: "local_share must be between 1 and 1000000, not -2" + omit},
		"too many": {in: 1_000_001, msg: "local_share must be between 1 and 1000000, not 1000001" + omit},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			wantField(t, CheckLocalShare(tc.in), "local_share", tc.msg)
		})
	}
}

func TestCheckShareFits(t *testing.T) {
	tests := map[string]struct {
		share, requests int
		msg             string
	}{
		"none":      {share: 0, requests: 5},
		"the limit": {share: 5, requests: 5},
		"over":      {share: 6, requests: 5, msg: `local_share 6 is more than the 5 requests per window of rule "r"`},
		"a block":   {share: 1, requests: 0, msg: `local_share 1 is more than the 0 requests per window of rule "r"`},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			wantField(t, CheckShareFits(tc.share, tc.requests, "r"), "local_share", tc.msg)
		})
	}
}

func TestCheckBan(t *testing.T) {
	i := func(v int64) *int64 { return &v }
	d := func(s string) *time.Duration {
		v, err := time.ParseDuration(s)
		if err != nil {
			t.Fatal(err)
		}
		return &v
	}
	tests := map[string]struct {
		in         BanFields
		want       *window.Ban
		field, msg string
	}{
		"a box":             {in: BanFields{i(5), d("10s"), d("5m")}, want: &window.Ban{Threshold: 5, Window: 10 * time.Second, Duration: 5 * time.Minute}},
		"the server's box":  {in: BanFields{}, want: &window.Ban{}},
		"only a threshold":  {in: BanFields{Threshold: i(3)}, want: &window.Ban{Threshold: 3}},
		"only a duration":   {in: BanFields{Duration: d("1h")}, want: &window.Ban{Duration: time.Hour}},
		"off":               {in: BanFields{Duration: d("0s")}, want: nil},
		"off, all set":      {in: BanFields{i(0), d("-1s"), d("0s")}, want: nil},
		"negative duration": {in: BanFields{i(5), d("10s"), d("-5m")}, field: "duration", msg: "ban duration -5m0s must not be negative"},
		"a year":            {in: BanFields{Duration: d("8760h")}, want: &window.Ban{Duration: window.MaxBanDuration}},
		"over a year":       {in: BanFields{Duration: d("8761h")}, field: "duration", msg: "ban duration 8761h0m0s is longer than the maximum of 8760h0m0s (one year)"},
		"zero threshold":    {in: BanFields{i(0), d("10s"), d("5m")}, field: "threshold", msg: "ban threshold must be at least 1, not 0"},
		"huge threshold":    {in: BanFields{i(1 << 31), d("10s"), d("5m")}, field: "threshold", msg: "ban threshold must be at most 2147483647, not 2147483648"},
		"zero window":       {in: BanFields{i(5), d("0s"), d("5m")}, field: "window", msg: "ban window must be positive, not 0s"},
		"negative window":   {in: BanFields{i(5), d("-1s"), d("5m")}, field: "window", msg: "ban window must be positive, not -1s"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := CheckBan(tc.in)
			wantField(t, err, tc.field, tc.msg)
			if (got == nil) != (tc.want == nil) || got != nil && *got != *tc.want {
				t.Errorf("ban %v, want %v", got, tc.want)
			}
		})
	}
}

func TestCheckRequests(t *testing.T) {
	tests := map[string]struct {
		field string
		n     int64
		msg   string
	}{
		"one":                {field: "requests", n: 1},
		"the most":           {field: "requests", n: 1_000_000},
		"zero":               {field: "requests", n: 0, msg: "requests must be at least 1, not 0"},
		"negative":           {field: "requests", n: -3, msg: "requests must be at least 1, not -3"},
		"too many":           {field: "requests", n: 2_000_000, msg: "requests must be at most 1000000 per window, not 2000000"},
		"per unit, too many": {field: "requests_per_unit", n: 1_000_001, msg: "requests_per_unit must be at most 1000000 per window, not 1000001"},
		"per unit, zero":     {field: "requests_per_unit", n: 0, msg: "requests_per_unit must be at least 1, not 0"},
		"per unit, the most": {field: "requests_per_unit", n: 1_000_000},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			wantField(t, CheckRequests(tc.field, tc.n), tc.field, tc.msg)
		})
	}
}

func TestCheckAlgorithm(t *testing.T) {
	s := func(v string) *string { return &v }
	i := func(v int64) *int64 { return &v }
	small := window.Limit{Requests: 5, Window: time.Second}
	big := window.Limit{Requests: 100_000, Window: time.Minute}
	block := window.Limit{Requests: 0, Window: time.Second} // requests_per_unit: 0
	tests := map[string]struct {
		l          window.Limit
		alg        *string
		buckets    *int64
		want       int // Buckets
		auto       bool
		field, msg string
	}{
		"auto, small":        {l: small, want: 0},
		"auto, big":          {l: big, want: window.DefaultBuckets, auto: true},
		"auto written, big":  {l: big, alg: s("auto"), want: window.DefaultBuckets, auto: true},
		"auto with buckets":  {l: big, alg: s("auto"), buckets: i(10), want: 10},
		"buckets alone":      {l: small, buckets: i(10), want: 10},
		"buckets, no count":  {l: small, alg: s("buckets"), want: window.DefaultBuckets},
		"buckets with count": {l: small, alg: s("buckets"), buckets: i(1000), want: 1000},
		"exact, big":         {l: big, alg: s("exact"), want: 0},
		"a block, auto":      {l: block, want: 0},
		"a block, buckets":   {l: block, buckets: i(10), want: 10},
		"unknown":            {l: small, alg: s("fixed"), field: "algorithm", msg: `algorithm "fixed" must be auto, exact or buckets`},
		"empty":              {l: small, alg: s(""), field: "algorithm", msg: `algorithm "" must be auto, exact or buckets`},
		"exact with buckets": {l: small, alg: s("exact"), buckets: i(10), field: "buckets", msg: "buckets is set with algorithm: exact; omit one of them"},
		"zero buckets":       {l: small, buckets: i(0), field: "buckets", msg: "buckets must be between 1 and 1000, not 0 (algorithm: exact keeps an exact log)"},
		"too many buckets":   {l: small, buckets: i(1001), field: "buckets", msg: "buckets must be between 1 and 1000, not 1001 (algorithm: exact keeps an exact log)"},
		"finer than a µs":    {l: window.Limit{Requests: 5, Window: time.Millisecond}, buckets: i(1000), want: 1000},
		"a window too long":  {l: window.Limit{Requests: 5, Window: 8 * 24 * time.Hour}, buckets: i(10), field: "buckets", msg: "window 192h0m0s: must be at most 168h0m0s"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, auto, err := CheckAlgorithm(tc.l, tc.alg, tc.buckets)
			wantField(t, err, tc.field, tc.msg)
			if err != nil {
				return
			}
			if got.Buckets != tc.want || auto != tc.auto || got.Requests != tc.l.Requests || got.Window != tc.l.Window {
				t.Errorf("limit %v auto %v, want %d buckets, auto %v", got, auto, tc.want, tc.auto)
			}
		})
	}
}
