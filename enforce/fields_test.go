package enforce

import (
	"errors"
	"testing"
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
