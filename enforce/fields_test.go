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
		"disabled":          {in: BanFields{Duration: d("0s")}, want: &window.Ban{}},
		"disabled, all set": {in: BanFields{i(0), d("-1s"), d("0s")}, want: &window.Ban{}},
		"no duration":       {in: BanFields{Threshold: i(5), Window: d("10s")}, msg: "ban needs duration (0 disables the penalty box)"},
		"negative duration": {in: BanFields{i(5), d("10s"), d("-5m")}, field: "duration", msg: "ban duration -5m0s must not be negative"},
		"no threshold":      {in: BanFields{Window: d("10s"), Duration: d("5m")}, msg: "ban needs threshold, window and duration"},
		"no window":         {in: BanFields{Threshold: i(5), Duration: d("5m")}, msg: "ban needs threshold, window and duration"},
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
