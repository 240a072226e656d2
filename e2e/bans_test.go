package e2e

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/flashgate/flashgate/window"
	"github.com/flashgate/flashgate/window/redisstore"
	"github.com/flashgate/flashgate/window/redistest"
)

// The fleet-wide ban tests: sidecars sharing one Redis, with two rules of
// 3 requests a minute whose windows stay full for the whole test, so that a
// ban's refusal (retry-after about ten minutes) is never mistaken for a
// full window's (a minute at most):
//   - uid (x-uid): banned after more than 2 denials within 30 s, fleet-wide;
//   - user (x-user): the same box with a threshold nobody reaches, for bans
//     added by hand.
const bansConfig = `domain: bans
sources:
  uid: {request_headers: {header_name: x-uid}}
  user: {request_headers: {header_name: x-user}}
descriptors:
  - key: uid
    name: uid
    rate_limit: {requests: 3, window: 1m}
    ban: {threshold: 2, window: 30s, duration: 10m}
  - key: user
    name: user
    rate_limit: {requests: 3, window: 1m}
    ban: {threshold: 1000, window: 10s, duration: 10m}
`

// banRetry is the least retry-after (seconds) that tells a ban's refusal
// from a full window's.
const banRetry = 120

// bansFleet is a Redis, the sidecars on it and a FleetBans of its prefix.
type bansFleet struct {
	redis  *redistest.Server
	prefix string
	keys   window.Keys
	config string
	bans   *redisstore.FleetBans
}

func newBansFleet(t *testing.T) *bansFleet {
	t.Helper()
	f := &bansFleet{redis: redistest.Start(t), prefix: "bans"}
	var err error
	if f.keys, err = window.NewKeys(f.prefix); err != nil {
		t.Fatal(err)
	}
	f.config = filepath.Join(t.TempDir(), "bans.yaml")
	if err := os.WriteFile(f.config, []byte(bansConfig), 0o644); err != nil {
		t.Fatal(err)
	}
	c, err := redisstore.NewClient(redisstore.ClientConfig{Addrs: []string{f.redis.Addr()}, Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	if f.bans, err = redisstore.NewFleetBans(c, f.keys, redisstore.FleetBansOptions{}); err != nil {
		t.Fatal(err)
	}
	return f
}

// start starts n sidecars at once.
func (f *bansFleet) start(t *testing.T, n int) []*proc {
	t.Helper()
	procs := make([]*proc, n)
	var wg sync.WaitGroup
	for i := range procs {
		wg.Go(func() {
			p, err := launchRetry(t, []string{"--backend", "redis", "--redis-addr", f.redis.Addr(),
				"--key-prefix", f.prefix, "--config", f.config})
			if err != nil {
				t.Errorf("start sidecar %d: %v", i, err)
				return
			}
			procs[i] = p
		})
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	return procs
}

func uidReq(v string) req  { return req{Path: "/x", Headers: map[string]string{"x-uid": v}} }
func userReq(v string) req { return req{Path: "/x", Headers: map[string]string{"x-user": v}} }

// retryAfter returns a denial's retry-after in seconds, -1 for anything
// else.
func retryAfter(a answer) int {
	if a.Verdict() != vDenied {
		return -1
	}
	n, err := strconv.Atoi(a.Headers()["retry-after"])
	if err != nil {
		return -1
	}
	return n
}

// isBanned reports whether a is a ban's refusal.
func isBanned(a answer) bool { return retryAfter(a) >= banRetry }

// mustBanned fails unless a is a ban's refusal of rule within the 10-minute
// ban's retry-after.
func mustBanned(t *testing.T, a answer, what string) {
	t.Helper()
	if n := retryAfter(a); n < banRetry || n > 600 {
		t.Fatalf("%s: want a ban's refusal (retry-after %d..600 s), got %s", what, banRetry, a)
	}
	if err := checkDeniedShape(a, 3); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// untilEach polls every sidecar with r every 20 ms until done says its
// answer is the one awaited (at most 10 s each, a loaded CI machine's
// margin) and logs how long each took.
func untilEach(t *testing.T, procs []*proc, what string, r req, done func(answer) bool) {
	t.Helper()
	start := time.Now()
	var took []string
	for i, p := range procs {
		var last answer
		if _, ok := waitFor(10*time.Second, func() bool { last = p.Check(r); return done(last) }); !ok {
			t.Fatalf("sidecar %d: %s: not within 10 s; last answer %s", i, what, last)
		}
		took = append(took, time.Since(start).Round(time.Millisecond).String())
	}
	t.Logf("%s: sidecars done after %s", what, strings.Join(took, ", "))
}

// monitor records the commands Redis runs (MONITOR) until stop is called,
// which returns them.
func monitor(t *testing.T, addr string) (stop func() []string) {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatalf("MONITOR: %v", err)
	}
	if _, err := conn.Write([]byte("MONITOR\r\n")); err != nil {
		t.Fatalf("MONITOR: %v", err)
	}
	rd := bufio.NewReader(conn)
	if line, err := rd.ReadString('\n'); err != nil || line != "+OK\r\n" {
		t.Fatalf("MONITOR: %q %v", line, err)
	}
	var (
		mu    sync.Mutex
		lines []string
		done  = make(chan struct{})
	)
	go func() {
		defer close(done)
		for {
			line, err := rd.ReadString('\n')
			if err != nil {
				return
			}
			mu.Lock()
			lines = append(lines, line)
			mu.Unlock()
		}
	}()
	return func() []string {
		conn.Close()
		<-done
		mu.Lock()
		defer mu.Unlock()
		return lines
	}
}

// naming returns the MONITOR lines of commands a client sent (not those a
// script ran) that carry arg as a whole argument.
func naming(lines []string, arg string) []string {
	var out []string
	for _, l := range lines {
		if strings.Contains(l, `"`+arg+`"`) && !strings.Contains(l, "[0 lua]") {
			out = append(out, l)
		}
	}
	return out
}

// TestBansSpreadAcrossFleet: one device round-robin over three sidecars is
// banned after 3 denials in total (one per sidecar, a third of any
// sidecar's own threshold); then every sidecar refuses it with the ban's
// retry-after without a check reaching Redis: MONITOR sees no command on
// its limit key, only the denial reports (a script on K!bc and K!ban, at
// most one a second per sidecar).
func TestBansSpreadAcrossFleet(t *testing.T) {
	f := newBansFleet(t)
	procs := f.start(t, 3)
	uid := freshUID("abuser")
	key := f.keys.Key("uid", uid)

	// 3 admitted, then 3 denied by the full window: one denial per sidecar.
	for i := range 6 {
		a := procs[i%3].Check(uidReq(uid))
		if want := vAllowed; i >= 3 {
			mustDenied(t, a, 3, fmt.Sprintf("check %d", i))
		} else if a.Verdict() != want {
			t.Fatalf("check %d: %s, want allowed", i, a)
		}
	}
	start := time.Now()
	for i, p := range procs {
		if _, ok := waitFor(10*time.Second, func() bool {
			return p.Metrics().Value("flashgate_bans_in_force", "rule", "uid") == 1
		}); !ok {
			t.Fatalf("sidecar %d: the fleet's ban not in force within 10 s", i)
		}
	}
	t.Logf("ban in force on all three sidecars %s after the third denial", time.Since(start).Round(time.Millisecond))
	if until, banned, err := f.bans.Get(bg(), key); err != nil || !banned || time.Until(until) < 9*time.Minute {
		t.Fatalf("Redis's ban of %s: %v %v %v, want about 10 minutes", key, until, banned, err)
	}

	stop := monitor(t, f.redis.Addr())
	began := time.Now()
	const checks = 30
	for i := range checks {
		mustBanned(t, procs[i%3].Check(uidReq(uid)), fmt.Sprintf("banned check %d", i))
	}
	time.Sleep(300 * time.Millisecond) // the reporters' last flush
	lines := stop()
	secs := int(time.Since(began)/time.Second) + 1
	if calls := naming(lines, key); len(calls) != 0 {
		t.Fatalf("Redis ran %d commands on the banned key's window, want none:\n%s", len(calls), strings.Join(calls, ""))
	}
	reports := naming(lines, key+"!bc")
	t.Logf("%d checks refused in %s; Redis ran %d denial reports for the key (bound: %d sidecars × %d s)",
		checks, time.Since(began).Round(time.Millisecond), len(reports), len(procs), secs)
	if len(reports) > len(procs)*secs {
		t.Fatalf("%d denial reports in %d s from %d sidecars: more than one a second each:\n%s", len(reports), secs, len(procs), strings.Join(reports, ""))
	}
	var banned float64
	for i, p := range procs {
		m := p.Metrics()
		banned += m.Value("flashgate_local_denials_total", "reason", "banned")
		if n := m.Value("flashgate_bans_raised_total", "rule", "uid", "by", "threshold"); n != 1 {
			t.Errorf("sidecar %d: flashgate_bans_raised_total{rule=uid,by=threshold} %v, want 1", i, n)
		}
	}
	if banned < checks {
		t.Errorf("flashgate_local_denials_total{reason=banned} sums to %v, want at least %d", banned, checks)
	}
}

// TestBansByHand: a ban added with FleetBans.Add (what `flashgate bans
// add` calls) is enforced by every sidecar; lifted, the key is decided by
// its window again (still full: refused as full), and lifted with the
// window reset, admitted at once.
func TestBansByHand(t *testing.T) {
	f := newBansFleet(t)
	procs := f.start(t, 3)
	user := freshUID("customer")
	key := f.keys.Key("user", user)
	for i, p := range procs { // fills the window: 3 a minute
		mustAllowed(t, p.Check(userReq(user)), 3, fmt.Sprintf("sidecar %d", i))
	}
	if err := f.bans.Add(bg(), key, time.Now().Add(10*time.Minute)); err != nil {
		t.Fatalf("Add: %v", err)
	}
	untilEach(t, procs, "added ban refused", userReq(user), isBanned)
	for i, p := range procs {
		mustBanned(t, p.Check(userReq(user)), fmt.Sprintf("sidecar %d after the add", i))
		if n := p.Metrics().Value("flashgate_bans_raised_total", "rule", "user", "by", "hand"); n != 1 {
			t.Errorf("sidecar %d: flashgate_bans_raised_total{rule=user,by=hand} %v, want 1", i, n)
		}
	}

	if err := f.bans.Lift(bg(), key, false); err != nil {
		t.Fatalf("Lift: %v", err)
	}
	untilEach(t, procs, "lifted, refused by the full window", userReq(user), func(a answer) bool {
		n := retryAfter(a)
		return n >= 1 && n <= 60
	})
	if err := f.bans.Lift(bg(), key, true); err != nil {
		t.Fatalf("Lift with reset: %v", err)
	}
	untilEach(t, procs, "lifted with the window reset, admitted", userReq(user), func(a answer) bool { return a.Verdict() == vAllowed })
	for i, p := range procs {
		if n := p.Metrics().Value("flashgate_bans_lifted_total", "rule", "user"); n != 1 {
			t.Errorf("sidecar %d: flashgate_bans_lifted_total{rule=user} %v, want 1 (the second lift found no ban)", i, n)
		}
	}
}

// TestBansOutlastRedis: a sidecar started after a ban refuses it from its
// first check; Redis killed, every sidecar keeps refusing it; Redis
// restarted empty, the sidecars write the ban back (same end), so that a
// sidecar started then refuses it from its first check too.
func TestBansOutlastRedis(t *testing.T) {
	f := newBansFleet(t)
	user := freshUID("abuser")
	key := f.keys.Key("user", user)
	until := time.Now().Add(10 * time.Minute).Truncate(time.Millisecond)
	if err := f.bans.Add(bg(), key, until); err != nil {
		t.Fatalf("Add: %v", err)
	}
	procs := f.start(t, 2)
	for i, p := range procs {
		mustBanned(t, p.Check(userReq(user)), fmt.Sprintf("sidecar %d started after the ban, first check", i))
	}

	f.redis.Kill()
	for round := range 5 {
		for i, p := range procs {
			mustBanned(t, p.Check(userReq(user)), fmt.Sprintf("Redis down, sidecar %d, round %d", i, round))
		}
		time.Sleep(100 * time.Millisecond)
	}

	f.redis.Restart() // persistence off: empty
	if _, ok := waitFor(20*time.Second, func() bool {
		got, banned, err := f.bans.Get(bg(), key)
		list, lerr := f.bans.List(bg())
		return err == nil && banned && got.Equal(until) && lerr == nil && len(list) == 1 && list[0].Key == key
	}); !ok {
		t.Fatal("the ban was not written back (and indexed) to the restarted Redis within 20 s")
	}
	for i, p := range procs {
		mustBanned(t, p.Check(userReq(user)), fmt.Sprintf("Redis back, sidecar %d", i))
	}
	late := f.start(t, 1)[0]
	mustBanned(t, late.Check(userReq(user)), "sidecar started after the restart, first check")
}
