package main

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/flashgate/flashgate/daemon/keyadmin"
	"github.com/flashgate/flashgate/window"
)

// rlsDirBanning is rlsDir with a rule that asks for serve's penalty box,
// as a hand ban needs.
func rlsDirBanning(t *testing.T) string {
	t.Helper()
	dir := rlsDir(t)
	yaml := "domain: edge\ndescriptors:\n  - key: remote_address\n    ban: {}\n    rate_limit: {unit: minute, requests_per_unit: 2}\n"
	if err := os.WriteFile(filepath.Join(dir, "config", "edge.yaml"), []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// banList is bans list --json.
type banList struct {
	Bans []keyadmin.Ban `json:"bans"`
}

// TestBansRoundTrip: bans add, list and lift on serve's Redis, for a rule
// of the descriptors file and a domain of the ratelimit service, in JSON
// and as tables: a value is shown only where the key holds it verbatim, a
// lift forgets the ban and, with --reset-window, the window.
func TestBansRoundTrip(t *testing.T) {
	f := startFleet(t, "bans", "--rls-config", rlsDirBanning(t))
	for range 5 {
		f.check(t, "bob")
	}

	var uid, ip, edge keyadmin.Ban
	f.runJSON(t, &uid, "bans", "add", "--rule", "coupon_per_uid", "--value", "bob", "--for", "1h")
	f.runJSON(t, &ip, "bans", "add", "--rule", "per_ip", "--value", "192.0.2.7", "--for", "10m")
	f.runJSON(t, &edge, "bans", "add", "--domain", "edge", "--entry", "remote_address=203.0.113.9", "--for", "5m")
	keys, err := window.NewKeys("bans")
	if err != nil {
		t.Fatal(err)
	}
	if uid.Rule != "coupon_per_uid" || uid.Value != "" || uid.Key != f.inspect(t, "coupon_per_uid", "bob").Key ||
		uid.RemainingMS <= (time.Hour-time.Minute).Milliseconds() || uid.RemainingMS > time.Hour.Milliseconds() {
		t.Errorf("add coupon_per_uid: %+v, want its key, 1h, no value (hashed with the path pattern)", uid)
	}
	if ip.Rule != "per_ip" || ip.Value != "192.0.2.7" || ip.Key != keys.Key("per_ip", "192.0.2.7") {
		t.Errorf("add per_ip: %+v, want the value shown", ip)
	}
	if edge.Rule != "" || edge.Domain != "edge" || edge.Value != "" {
		t.Errorf("add edge: %+v, want domain edge and no value", edge)
	}

	var all banList
	f.runJSON(t, &all, "bans", "list")
	if len(all.Bans) != 3 || all.Bans[0].Key != edge.Key || all.Bans[1].Key != ip.Key || all.Bans[2].Key != uid.Key {
		t.Fatalf("list: %+v, want the three, soonest to end first", all)
	}
	for i, want := range []keyadmin.Ban{edge, ip, uid} {
		got := all.Bans[i]
		if got.KeyNames != want.KeyNames || !got.Until.Equal(want.Until) {
			t.Errorf("list[%d] = %+v, want %+v", i, got, want)
		}
	}
	var one banList
	if f.runJSON(t, &one, "bans", "list", "--rule", "per_ip"); len(one.Bans) != 1 || one.Bans[0].Key != ip.Key {
		t.Errorf("list --rule per_ip: %+v", one)
	}
	if f.runJSON(t, &one, "bans", "list", "--domain", "edge"); len(one.Bans) != 1 || one.Bans[0].Key != edge.Key {
		t.Errorf("list --domain edge: %+v", one)
	}
	table := f.run(t, "bans", "list")
	for _, want := range []string{"rule", "remaining", "per_ip", "192.0.2.7", "coupon_per_uid", "domain edge", uid.Key} {
		if !strings.Contains(table, want) {
			t.Errorf("list table lacks %q:\n%s", want, table)
		}
	}
	if strings.Contains(table, "bob") || strings.Contains(table, "203.0.113.9") {
		t.Errorf("list table shows a value its key holds hashed:\n%s", table)
	}

	if r := f.inspect(t, "coupon_per_uid", "bob"); !r.Banned || !r.BannedUntil.Equal(uid.Until) || r.Count != 5 {
		t.Errorf("inspect a banned key: %+v, want banned until %s, 5 counted", r, uid.Until)
	}
	var lift keyadmin.Lift
	f.runJSON(t, &lift, "bans", "lift", "--rule", "coupon_per_uid", "--value", "bob")
	if !lift.WasBanned || !lift.WasUntil.Equal(uid.Until) || lift.ResetWindow || lift.Key != uid.Key {
		t.Errorf("lift: %+v", lift)
	}
	if r := f.inspect(t, "coupon_per_uid", "bob"); r.Banned || r.Count != 5 {
		t.Errorf("inspect after a lift: %+v, want not banned, the window kept", r)
	}
	f.runJSON(t, &lift, "bans", "lift", "--rule", "coupon_per_uid", "--value", "bob", "--reset-window")
	if lift.WasBanned || !lift.ResetWindow {
		t.Errorf("lift --reset-window of a key no longer banned: %+v", lift)
	}
	if r := f.inspect(t, "coupon_per_uid", "bob"); r.Count != 0 || r.Full {
		t.Errorf("inspect after --reset-window: %+v, want an empty window", r)
	}

	if out := f.run(t, "bans", "lift", "--rule", "per_ip", "--value", "192.0.2.7"); !strings.Contains(out, "lifted  yes: the ban that would have ended ") {
		t.Errorf("lift table:\n%s", out)
	}
	f.run(t, "bans", "lift", "--domain", "edge", "--entry", "remote_address=203.0.113.9")
	if f.runJSON(t, &all, "bans", "list"); all.Bans == nil || len(all.Bans) != 0 {
		t.Errorf("list after the lifts: %+v, want an empty list", all)
	}
	if out := f.run(t, "bans", "list"); out != "no bans\n" {
		t.Errorf("list table of no bans: %q, want \"no bans\"", out)
	}
	// Its window emptied and its client IP's ban lifted, bob is admitted
	// (once serve has heard of the lift).
	waitFor(t, eventually, "serve to admit bob", func() bool { return f.check(t, "bob").Allowed })
}

// TestBansReachServe: a ban added by hand is refused by a running serve
// (from its local cache, with the ban's retry-after), and lifted with
// --reset-window it is admitted again at once.
func TestBansReachServe(t *testing.T) {
	f := startFleet(t, "reach")
	if a := f.check(t, "carol"); !a.Allowed {
		t.Fatalf("before the ban: %+v", a)
	}
	f.run(t, "bans", "add", "--rule", "coupon_per_uid", "--value", "carol", "--for", "1h")
	// A refusal by the window (a minute at most) is not the ban's.
	waitFor(t, eventually, "serve to refuse carol for the ban's hour", func() bool {
		a := f.check(t, "carol")
		ra, _ := strconv.Atoi(a.Headers["retry-after"])
		return !a.Allowed && ra > 3000
	})
	if a := f.check(t, "dave"); !a.Allowed {
		t.Errorf("another user: %+v, want allowed", a)
	}
	f.run(t, "bans", "lift", "--rule", "coupon_per_uid", "--value", "carol", "--reset-window")
	waitFor(t, eventually, "serve to admit carol again", func() bool { return f.check(t, "carol").Allowed })
}
