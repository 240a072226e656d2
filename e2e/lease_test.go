package e2e

import (
	"errors"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/flashgate/flashgate/window/redistest"
)

const (
	leaseLimit    = 300 // e2e/testdata/lease.yaml's claims rule, per second
	leaseSidecars = 4
)

// leasesDecide are the flags of the tests that hold the leases alone to the
// limit: a generous budget and failure mode deny, so that a reservation
// late on a loaded machine is refused rather than admitted by the local
// fallback (whose bounds guarantees.md states and the fault tests hold).
var leasesDecide = []string{"--redis-timeout", "1s", "--failure-mode", "deny"}

// claim is a request for the leased claim path, with x-uid: uid if not "".
func claim(uid string) req {
	r := req{Path: "/api/claim", IP: "10.7.7.7"}
	if uid != "" {
		r.Headers = map[string]string{"x-uid": uid}
	}
	return r
}

// leaseFigures logs the fleet's lease counters and script calls per
// admission, and fails unless some admissions came from leases.
func leaseFigures(t *testing.T, procs []*proc, admitted int) {
	t.Helper()
	var leases, fromLease, returned float64
	for _, p := range procs {
		m := p.Metrics()
		leases += m.Value("flashgate_leases_total")
		fromLease += m.Value("flashgate_lease_admissions_total")
		returned += m.Value("flashgate_lease_slots_returned_total")
	}
	t.Logf("%.0f leases, %.0f admissions from them, %.0f slots returned unused; %d admitted in all", leases, fromLease, returned, admitted)
	if fromLease == 0 {
		t.Error("no admission came from a lease")
	}
}

// TestLeasedFleetExact: four sidecars on one Redis, six callers each
// hammering the leased global rule (300 per second, leases of 50 ms) for
// 3 s: no window provably holds more than the limit.
func TestLeasedFleetExact(t *testing.T) {
	rs := redistest.Start(t)
	procs := startFleet(t, leaseSidecars, rs.Addr(), "e2elease", append(leasesDecide, "--config", "testdata/lease.yaml")...)
	all := runFleetAsking(t, procs, 3*time.Second, leaseLimit, func(_ int, p *proc) answer { return p.Check(claim("")) }, nil).snapshot()
	leaseFigures(t, procs, len(all))
}

// userClaims asks the seed's request shape: a claim with an x-uid drawn
// from users, each user's admissions recorded. It is safe for concurrent
// use.
type userClaims struct {
	users int

	mu sync.Mutex // guards by
	by map[string][]answer
}

// ask sends one claim of a random user to p.
func (u *userClaims) ask(p *proc) answer {
	uid := "u" + strconv.Itoa(rand.IntN(u.users))
	a := p.Check(claim(uid))
	if a.Verdict() == vAllowed {
		u.mu.Lock()
		if u.by == nil {
			u.by = map[string][]answer{}
		}
		u.by[uid] = append(u.by[uid], a)
		u.mu.Unlock()
	}
	return a
}

// most returns the most admissions one user had certainly within a span of
// w, and that user.
func (u *userClaims) most(w time.Duration) (n int, uid string) {
	u.mu.Lock()
	defer u.mu.Unlock()
	for id, as := range u.by {
		if m := provablyWithin(as, w); m > n {
			n, uid = m, id
		}
	}
	return n, uid
}

// TestLeasedFleetPerUser: the seed's request shape, the leased global rule
// and a per-user rule on the same request: neither limit is passed.
func TestLeasedFleetPerUser(t *testing.T) {
	rs := redistest.Start(t)
	procs := startFleet(t, leaseSidecars, rs.Addr(), "e2eleaseuser", append(leasesDecide, "--config", "testdata/lease.yaml")...)
	u := &userClaims{users: 200}
	all := runFleetAsking(t, procs, 3*time.Second, leaseLimit, func(_ int, p *proc) answer { return u.ask(p) }, nil).snapshot()
	if n, uid := u.most(time.Second); n > 4 {
		t.Errorf("user %s: %d admissions within one window, over the per-user 4", uid, n)
	}
	leaseFigures(t, procs, len(all))
}

// TestLeasedFleetSidecarKilled: one sidecar SIGKILLed mid-run, holding a
// lease: its unused slots are never used and still count, so no window
// holds more than the limit.
func TestLeasedFleetSidecarKilled(t *testing.T) {
	rs := redistest.Start(t)
	procs := startFleet(t, leaseSidecars, rs.Addr(), "e2eleasekill", append(leasesDecide, "--config", "testdata/lease.yaml")...)
	var killed atomic.Bool
	runFleetAsking(t, procs, 3*time.Second, leaseLimit, func(i int, p *proc) answer {
		if i == 0 && killed.Load() {
			time.Sleep(10 * time.Millisecond) // its callers idle rather than spin on a dead socket
			return answer{Err: errors.New("killed"), Sent: time.Now()}
		}
		return p.Check(claim(""))
	}, func() {
		killed.Store(true)
		procs[0].kill()
	})
}

// TestLeasedFleetSidecarPaused: one sidecar stopped (SIGSTOP) for 200 ms,
// longer than its lease: when it resumes, its lease has ended, and the
// checks it decides then are not admitted from it.
func TestLeasedFleetSidecarPaused(t *testing.T) {
	rs := redistest.Start(t)
	procs := startFleet(t, leaseSidecars, rs.Addr(), "e2eleasepause", append(leasesDecide, "--config", "testdata/lease.yaml")...)
	runFleetAsking(t, procs, 3*time.Second, leaseLimit, func(_ int, p *proc) answer { return p.Check(claim("")) }, func() {
		procs[0].Signal(syscall.SIGSTOP)
		time.Sleep(200 * time.Millisecond)
		procs[0].Signal(syscall.SIGCONT)
	})
}

// leaseAdmissions sums the fleet's admissions from leases.
func leaseAdmissions(procs []*proc) float64 {
	var n float64
	for _, p := range procs {
		n += p.Metrics().Value("flashgate_lease_admissions_total")
	}
	return n
}

// TestLeasedFleetRedisRestarted: Redis is killed 1.5 s in and restarted
// empty 1.5 s later. The fallback decides the leased rule in the outage at
// its share (no seed for the key: the bound is L + N·s, guarantees.md);
// after the settle the sidecars lease again from the new Redis.
func TestLeasedFleetRedisRestarted(t *testing.T) {
	rs := redistest.Start(t)
	procs := startFleet(t, leaseSidecars, rs.Addr(), "e2eleaserestart", "--config", "testdata/lease.yaml")
	share := (leaseLimit + leaseSidecars - 1) / leaseSidecars
	var after float64
	runFleetAsking(t, procs, 6*time.Second, leaseLimit+leaseSidecars*share, func(_ int, p *proc) answer { return p.Check(claim("")) }, func() {
		rs.Kill()
		time.Sleep(1500 * time.Millisecond)
		rs.Restart()
		time.Sleep(3 * time.Second) // each sidecar saw Redis again and settled
		after = leaseAdmissions(procs)
	})
	if now := leaseAdmissions(procs); now <= after {
		t.Errorf("no admission from a lease in the last 1.5 s after Redis returned (%v before, %v after)", after, now)
	}
}

// TestLeasedFleetReloadLowersLimit: the leased rule's limit is reloaded
// from 300 to 150 mid-run (a ConfigMap swap every sidecar watches). No
// window holds more than the old limit, and once every sidecar has the new
// rule (plus a margin for the checks already being decided) no window holds
// more than the new one: the leases granted under the old limit are
// revoked at the next check.
func TestLeasedFleetReloadLowersLimit(t *testing.T) {
	rs := redistest.Start(t)
	old := fixture(t, "lease.yaml")
	lower := []byte(strings.Replace(string(old), "requests: 300", "requests: 150", 1))
	cm := newConfigMap(t, old)
	procs := startFleet(t, leaseSidecars, rs.Addr(), "e2eleasereload", append(leasesDecide, "--config", cm.Path())...)
	limitOf := func(p *proc) int {
		n, err := strconv.Atoi(p.Check(claim("")).Headers()["x-ratelimit-limit"])
		if err != nil {
			return -1
		}
		return n
	}
	var applied time.Time
	adm := runFleetAsking(t, procs, 4*time.Second, leaseLimit, func(_ int, p *proc) answer { return p.Check(claim("")) }, func() {
		since := time.Now()
		cm.Update(lower)
		for _, p := range procs {
			if _, ok := untilApplied(since, func() bool { return limitOf(p) == 150 }); !ok {
				t.Errorf("a sidecar never applied the lower limit")
			}
		}
		applied = time.Now()
	})
	const margin = 300 * time.Millisecond // checks mapped under the old rule still being decided
	var later []answer
	for _, a := range adm.snapshot() {
		if a.Sent.After(applied.Add(margin)) {
			later = append(later, a)
		}
	}
	n := provablyWithin(later, time.Second)
	t.Logf("after the reload applied: %d admissions, the most in one window %d", len(later), n)
	if n > 150 {
		t.Errorf("%d admissions within one window after every sidecar applied the limit of 150", n)
	}
}

// TestLeasedFleetSlowLink: one sidecar's Redis link delays every reply by
// 50 ms, as long as a lease: its reservations come back too late to use
// (or past its budget), so its checks take failure mode local at its
// share; a slot Redis granted it anyway is never used and only makes the
// window stricter. No window holds more than the limit plus that share.
func TestLeasedFleetSlowLink(t *testing.T) {
	rs := redistest.Start(t)
	px := startProxy(t, rs.Addr())
	const prefix = "e2eleaseslow"
	procs := startFleet(t, leaseSidecars-1, rs.Addr(), prefix, "--config", "testdata/lease.yaml")
	procs = append(procs, startFleet(t, 1, px.Addr(), prefix, "--config", "testdata/lease.yaml")...)
	waitFleetSize(t, procs, leaseSidecars, 10*time.Second)
	px.SetDelay(50 * time.Millisecond)
	share := (leaseLimit + leaseSidecars - 1) / leaseSidecars
	runFleetAsking(t, procs, 3*time.Second, leaseLimit+share, func(_ int, p *proc) answer { return p.Check(claim("")) }, nil)
	m := procs[len(procs)-1].Metrics()
	t.Logf("the slow sidecar: %v admissions from leases, %v by failure mode local", m.Value("flashgate_lease_admissions_total"),
		m.Value("flashgate_failure_mode_decisions_total", "mode", "local"))
}

// leaseCounts is a sidecar's leases taken and slots reserved so far.
func leaseCounts(p *proc) (leases, slots float64) {
	m := p.Metrics()
	return m.Value("flashgate_leases_total"), m.Value("flashgate_lease_slots_reserved_total")
}

// TestLeasedFleetGrows: four sidecars hammer the leased rule; 1.5 s in,
// four more join and take the same load. Every sidecar comes to count
// eight, so that a lease is at most ceil(300/8) slots, down from
// ceil(300/4); no window holds more than the limit throughout, and every
// sidecar that joined is granted leases on the grown fleet and admits
// from them (none is starved by the ones that held the window first).
func TestLeasedFleetGrows(t *testing.T) {
	rs := redistest.Start(t)
	const prefix = "e2eleasegrow"
	args := append(leasesDecide, "--config", "testdata/lease.yaml")
	first := startFleet(t, leaseSidecars, rs.Addr(), prefix, args...)
	waitFleetSize(t, first, leaseSidecars, 10*time.Second)
	stop := make(chan struct{})
	l := &fleetLoad{adm: &admissions{}, callers: fleetCallers, ask: func(_ int, p *proc) answer { return p.Check(claim("")) }, stop: stop}
	began := time.Now()
	l.add(first...)
	time.Sleep(1500 * time.Millisecond)
	more := startFleet(t, leaseSidecars, rs.Addr(), prefix, args...)
	l.add(more...)
	all := append(slices.Clone(first), more...)
	waitFleetSize(t, all, 2*leaseSidecars, 10*time.Second)
	// A reservation sent before its sidecar counted eight asked for the
	// share of four; each ends within the reservation's timeout (1 s).
	time.Sleep(time.Second)
	leases0, slots0 := make([]float64, len(all)), make([]float64, len(all))
	for i, p := range all {
		leases0[i], slots0[i] = leaseCounts(p)
	}
	time.Sleep(1500 * time.Millisecond) // the grown fleet under load
	if _, ok := waitFor(15*time.Second, func() bool {
		for i, p := range more {
			if n, _ := leaseCounts(p); n == leases0[leaseSidecars+i] {
				return false
			}
		}
		return true
	}); !ok {
		t.Error("a sidecar that joined was granted no lease on the grown fleet within 15 s")
	}
	close(stop)
	l.check(t, time.Since(began), leaseLimit)
	share := (leaseLimit + 2*leaseSidecars - 1) / (2 * leaseSidecars)
	for i, p := range all {
		leases, slots := leaseCounts(p)
		dl, ds := leases-leases0[i], slots-slots0[i]
		t.Logf("sidecar %d on the grown fleet: %v leases, %v slots (%.1f a lease); %v admissions from leases in all", i, dl, ds, ds/max(dl, 1),
			p.Metrics().Value("flashgate_lease_admissions_total"))
		if dl > 0 && ds/dl > float64(share) {
			t.Errorf("sidecar %d on the grown fleet: %.1f slots a lease, over the share of eight, %d", i, ds/dl, share)
		}
	}
}
