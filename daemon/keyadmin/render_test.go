package keyadmin

import (
	"bytes"
	"testing"
	"time"

	"github.com/flashgate/flashgate/window/overrides"
)

// TestTables: each result's table, as the operator commands print it.
func TestTables(t *testing.T) {
	now := time.Date(2026, 12, 7, 6, 0, 0, 0, time.UTC)
	ov := &overrides.Override{Target: overrides.Target{Rule: "uid"}, Mode: overrides.ModeLimit, Requests: 2, Window: time.Minute,
		AllowRaise: true, Set: now, Until: now.Add(15 * time.Minute), By: "ops", Reason: "orders failing"}
	tests := map[string]struct {
		t    Table
		want string
	}{
		"no bans": {BanList{Bans: []Ban{}}, "no bans\n"},
		"bans": {BanList{Bans: []Ban{
			{KeyNames: KeyNames{Rule: "uid", Key: "fg:{abcdef}:uid:alice", Value: "alice"}, Until: now.Add(90 * time.Second), RemainingMS: 90_400},
			{KeyNames: KeyNames{Domain: "edge", Key: "fg:{012345}:rls.edge:#h"}, Until: now.Add(time.Second), RemainingMS: 1_000},
		}}, "" +
			"rule         key                      remaining  until                     value\n" +
			"uid          fg:{abcdef}:uid:alice    1m30s      2026-12-07T06:01:30.000Z  alice\n" +
			"domain edge  fg:{012345}:rls.edge:#h  1s         2026-12-07T06:00:01.000Z  -\n"},
		"lift": {Lift{KeyNames: KeyNames{Rule: "uid", Key: "k"}, WasBanned: true, WasUntil: now.Add(time.Hour), ResetWindow: true}, "" +
			"rule    uid\n" +
			"key     k\n" +
			"lifted  yes: the ban that would have ended 2026-12-07T07:00:00.000Z (in 1h0m0s) is over\n" +
			"window  emptied\n"},
		"lift of nothing": {Lift{KeyNames: KeyNames{Rule: "uid", Key: "k"}}, "" +
			"rule    uid\n" +
			"key     k\n" +
			"lifted  nothing: the key was not banned\n"},
		"no overrides": {OverrideList{Overrides: []OverrideRow{}}, "no overrides\n"},
		"override": {OverrideRow{Override: ov, RemainingMS: 900_000}, "" +
			"domain  rule  override                      remaining  until                     by   reason\n" +
			"-       uid   limit 2/1m0s (raise allowed)  15m0s      2026-12-07T06:15:00.000Z  ops  orders failing\n"},
		"cleared": {Cleared{Target: ov.Target, Was: ov}, "" +
			"domain   -\n" +
			"rule     uid\n" +
			"cleared  limit 2/1m0s (raise allowed), which would have ended 2026-12-07T06:15:00.000Z (in 15m0s)\n"},
		"history": {History{History: []overrides.Event{{Op: "set", At: now, By: "ops", Reason: "orders failing", Override: ov},
			{Op: "clear", At: now.Add(time.Minute), Override: &overrides.Override{Target: ov.Target}}}}, "" +
			"at                        op     by   domain  rule  override                      for    reason\n" +
			"2026-12-07T06:00:00.000Z  set    ops  -       uid   limit 2/1m0s (raise allowed)  15m0s  orders failing\n" +
			"2026-12-07T06:01:00.000Z  clear  -    -       uid   -                             -      -\n"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			var b bytes.Buffer
			if err := tc.t.WriteTable(&b, now); err != nil {
				t.Fatal(err)
			}
			if b.String() != tc.want {
				t.Errorf("got\n%s\nwant\n%s", b.String(), tc.want)
			}
		})
	}
}
