package e2e

import (
	"bufio"
	"cmp"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashgate/flashgate/window/redistest"
)

// The leased fleet benchmark: a hot global limit at the scale of a flash
// sale (twelve sidecars, 2,000 admissions a second, leases of 50 ms), each
// fault of the leased rule's tests at that scale, and the cost leased and
// not as the lease length and the fleet's size move. It is a benchmark,
// not a test: a dozen sidecars and their callers fill a small machine for
// minutes. Every run fails loudly if a window certainly held more than its
// bound; BENCHMARKS.md ("Leased admissions") has the command and figures.

const (
	judgedSidecars = 12
	judgedLimit    = 2000
	judgedLease    = 50 * time.Millisecond
	judgedCallers  = 6
	judgedRun      = 4 * time.Second
	// faultAt is when in the load a scene's fault comes.
	faultAt = 1500 * time.Millisecond
	// leaseBenchPrefix is every sidecar's key prefix: one fleet.
	leaseBenchPrefix = "lb"
	// perUserLimit is the per-user rule's limit, per window.
	perUserLimit = 4
)

// leaseScene is one run: a fleet of sidecars on a fresh Redis, one global
// rule on the claim path (a per-user rule of 4 a window under it),
// judgedCallers closed-loop callers per sidecar for run, and a fault at
// faultAt.
type leaseScene struct {
	sidecars int
	limit    int           // requests per window
	window   time.Duration // 0: 1 s
	lease    time.Duration // 0: the rule is not leased
	run      time.Duration // the load's length beyond the fault's own time; 0: judgedRun
	users    int           // > 0: every check carries an x-uid of so many (the seed's shape)
	local    bool          // failure mode local (default flags) instead of leasesDecide
	slowLink bool          // the last sidecar reaches Redis through a proxy that delays by a lease
	// bound is the most admissions a window may hold; 0: limit.
	bound int
	// fault, if not nil, runs at faultAt; the function it returns, if not
	// nil, checks the admissions after the run.
	fault func(b *testing.B, r *leaseRun) func(all []answer)
}

// leaseRun is a scene under way.
type leaseRun struct {
	scene     leaseScene
	rs        *redistest.Server
	rc        *redis.Client
	cm        *configMap
	args      []string // every sidecar's flags
	procs     []*proc
	load      *fleetLoad
	restarted bool // Redis's counters started again from zero
}

// leaseCost is what a scene measured.
type leaseCost struct {
	admitted          int
	denied, failed    int64
	most              int     // admissions certainly within one window
	perSec            float64 // admitted per second from one window into the run
	share             float64 // perSec against the limit's rate
	calls, cpuMicros  float64 // script calls and Redis CPU µs per admitted check; NaN if not measured
	leases, fromLease float64 // leases taken, admissions from them (the live sidecars')
	returned          float64 // slots the live sidecars gave back unused
	refusals          float64 // the live sidecars' reservations that granted nothing (their metric)
	reservations      float64 // reserving calls (lease.lua's ZSCORE), granting or not; NaN if not measured
}

// win is the scene's window.
func (s leaseScene) win() time.Duration { return cmp.Or(s.window, time.Second) }

// config returns the scene's descriptors file with the global limit n.
func (s leaseScene) config(n int) []byte {
	lease := ""
	if s.lease > 0 {
		lease = fmt.Sprintf("\n    lease: {for: %s}", s.lease)
	}
	return fmt.Appendf(nil, `domain: e2e
sources:
  path: {request_path: {}}
  uid: {request_headers: {header_name: x-uid}}
descriptors:
  - key: path
    value: /api/claim
    name: claims
    rate_limit: {requests: %d, window: %s}%s
    descriptors:
      - key: uid
        name: claims_per_uid
        rate_limit: {requests: %d, window: %s}
`, n, s.win(), lease, perUserLimit, s.win())
}

// redisCount is what redisStats reads.
type redisCount struct {
	// calls counts script calls (EVALSHA and EVAL), cpu Redis's CPU
	// seconds (user and system).
	calls, cpu float64
	// zscores counts ZSCORE commands, scripts' included: lease.lua runs one
	// per reservation, so on a leased rule alone it counts reservations.
	zscores float64
}

// redisStats reads Redis's script calls, CPU seconds and ZSCORE commands
// so far.
func redisStats(b testing.TB, rc *redis.Client) redisCount {
	b.Helper()
	text, err := rc.Info(bg(), "commandstats", "cpu").Result()
	if err != nil {
		b.Fatalf("INFO: %v", err)
	}
	var c redisCount
	sc := bufio.NewScanner(strings.NewReader(text))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		name, val, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		switch name {
		case "cmdstat_evalsha", "cmdstat_eval", "cmdstat_zscore":
			for kv := range strings.SplitSeq(val, ",") {
				if n, ok := strings.CutPrefix(kv, "calls="); ok {
					f, _ := strconv.ParseFloat(n, 64)
					if name == "cmdstat_zscore" {
						c.zscores += f
					} else {
						c.calls += f
					}
				}
			}
		case "used_cpu_sys", "used_cpu_user":
			f, _ := strconv.ParseFloat(val, 64)
			c.cpu += f
		}
	}
	return c
}

// measure runs s once and fails b if a window held more than its bound.
func (s leaseScene) measure(b *testing.B) leaseCost {
	b.Helper()
	run := cmp.Or(s.run, judgedRun)
	r := &leaseRun{scene: s, rs: redistest.Start(b)}
	r.rc = redisClient(b, r.rs.Addr())
	r.cm = newConfigMap(b, s.config(s.limit))
	r.args = []string{"--config", r.cm.Path(), "--log-level", "warn"}
	if !s.local {
		r.args = append(r.args, leasesDecide...)
	}
	direct := s.sidecars
	if s.slowLink {
		direct--
	}
	r.procs = startFleet(b, direct, r.rs.Addr(), leaseBenchPrefix, r.args...)
	var px *proxy
	if s.slowLink {
		px = startProxy(b, r.rs.Addr())
		r.procs = append(r.procs, startFleet(b, 1, px.Addr(), leaseBenchPrefix, r.args...)...)
	}
	waitFleetSize(b, r.procs, s.sidecars, 60*time.Second)
	if px != nil {
		px.SetDelay(judgedLease)
	}

	// What Redis does with the fleet idle (heartbeats, the bans' and
	// overrides' rounds) is taken off the load's figures.
	const idle = 2 * time.Second
	i0 := redisStats(b, r.rc)
	time.Sleep(idle)
	i1 := redisStats(b, r.rc)
	idleCalls, idleCPU := (i1.calls-i0.calls)/idle.Seconds(), (i1.cpu-i0.cpu)/idle.Seconds()
	idleZscores := (i1.zscores - i0.zscores) / idle.Seconds()

	users := &userClaims{users: s.users} // the seed's shape, if s.users > 0
	stop := make(chan struct{})
	r.load = &fleetLoad{adm: &admissions{}, callers: judgedCallers, stop: stop, ask: func(_ int, p *proc) answer {
		switch {
		case p.Exited(): // killed: its callers idle rather than spin on a dead socket
			time.Sleep(10 * time.Millisecond)
			return answer{Err: errors.New("sidecar exited"), Sent: time.Now()}
		case s.users > 0:
			return users.ask(p)
		}
		return p.Check(claim(""))
	}}
	s0 := redisStats(b, r.rc)
	began := time.Now()
	r.load.add(r.procs...)
	var after func([]answer)
	if s.fault != nil {
		time.Sleep(faultAt)
		after = s.fault(b, r)
		time.Sleep(run - faultAt)
	} else {
		time.Sleep(run)
	}
	close(stop)
	r.load.wg.Wait()
	took := time.Since(began)
	s1 := redisStats(b, r.rc)
	c0, u0, c1, u1 := s0.calls, s0.cpu, s1.calls, s1.cpu

	all := r.load.adm.snapshot()
	fig := leaseCost{admitted: len(all), denied: r.load.nDenied.Load(), failed: r.load.nFailed.Load(), calls: math.NaN(), cpuMicros: math.NaN(), reservations: math.NaN()}
	steady := 0
	for _, a := range all {
		if a.Sent.After(began.Add(s.win())) {
			steady++
		}
	}
	fig.perSec = float64(steady) / (took - s.win()).Seconds()
	fig.share = fig.perSec * s.win().Seconds() / float64(s.limit)
	if !r.restarted && fig.admitted > 0 {
		fig.calls = (c1 - c0 - idleCalls*took.Seconds()) / float64(fig.admitted)
		fig.cpuMicros = (u1 - u0 - idleCPU*took.Seconds()) * 1e6 / float64(fig.admitted)
		if s.lease > 0 && s.users == 0 {
			fig.reservations = s1.zscores - s0.zscores - idleZscores*took.Seconds()
		}
	}
	for _, p := range r.procs {
		if !p.Exited() {
			m := p.Metrics()
			fig.leases += m.Value("flashgate_leases_total")
			fig.fromLease += m.Value("flashgate_lease_admissions_total")
			fig.returned += m.Value("flashgate_lease_slots_returned_total")
			fig.refusals += m.Value("flashgate_lease_refusals_total")
		}
	}
	if !math.IsNaN(fig.reservations) {
		b.Logf("%.0f reservations for %.0f leases: %.0f granted nothing (%.0f refusals counted by the sidecars)", fig.reservations, fig.leases, fig.reservations-fig.leases, fig.refusals)
		b.ReportMetric(fig.reservations/max(fig.leases, 1), "reservations/lease")
	}
	bound := cmp.Or(s.bound, s.limit)
	var span []answer
	fig.most, span = worstSpan(all, s.win())
	b.Logf("%d sidecars, %d/%s, lease %s: %d admitted (%d from %.0f leases, %.0f slots returned), %d denied, %d failed over %s; most in one window %d (bound %d); %.0f admitted/s from %s in (%.1f%% of the limit); %.3f script calls and %.1f Redis CPU µs per admitted check",
		len(r.procs), s.limit, s.win(), s.lease, fig.admitted, int(fig.fromLease), fig.leases, fig.returned, fig.denied, fig.failed, took.Round(time.Millisecond),
		fig.most, bound, fig.perSec, s.win(), 100*fig.share, fig.calls, fig.cpuMicros)
	if fig.most > bound {
		logSpan(b, span, began, s.win())
		b.Errorf("BOUND BROKEN: %d admissions certainly within one window of %s, over the bound %d", fig.most, s.win(), bound)
	}
	if fig.denied == 0 {
		b.Logf("nothing was denied: the load did not reach the limit")
	}
	if after != nil {
		after(all)
	}
	if s.users > 0 {
		n, uid := users.most(s.win())
		b.Logf("the most one user was admitted in one window: %d (user %s; its rule's limit %d)", n, uid, perUserLimit)
		if n > perUserLimit {
			b.Errorf("BOUND BROKEN: user %s admitted %d times within one window, over the per-user %d", uid, n, perUserLimit)
		}
	}
	b.ReportMetric(float64(fig.most), "max/window")
	b.ReportMetric(fig.perSec, "admitted/s")
	b.ReportMetric(100*fig.share, "%limit")
	if !math.IsNaN(fig.calls) {
		b.ReportMetric(fig.calls, "calls/admitted")
		b.ReportMetric(fig.cpuMicros, "redis-µs/admitted")
	}
	return fig
}

// logSpan logs a window that broke its bound: where it lies in the run,
// and each sidecar's admissions in it, in tenths of the window.
func logSpan(b testing.TB, span []answer, began time.Time, w time.Duration) {
	b.Helper()
	if len(span) == 0 {
		return
	}
	from := span[0].Sent
	b.Logf("the window from %s into the run (%s): %d admissions", from.Sub(began).Round(time.Millisecond), from.Format("15:04:05.000"), len(span))
	by := map[int][]int{}
	for _, a := range span {
		if by[a.Proc] == nil {
			by[a.Proc] = make([]int, 10)
		}
		by[a.Proc][min(int(10*a.Sent.Sub(from)/w), 9)]++
	}
	for _, id := range slices.Sorted(maps.Keys(by)) {
		n := 0
		for _, c := range by[id] {
			n += c
		}
		b.Logf("sidecar %2d: %4d admitted, by tenth of the window %v", id, n, by[id])
	}
}

// redisRestarted is the scene fault that kills Redis and restarts it
// empty 1.5 s later; after the run, some admissions came from leases on
// the new Redis.
func redisRestarted(b *testing.B, r *leaseRun) func([]answer) {
	r.rs.Kill()
	time.Sleep(1500 * time.Millisecond)
	r.rs.Restart()
	r.restarted = true
	waitTurnedBack(b, r.procs)
	before := leaseAdmissions(r.procs)
	return func([]answer) {
		if now := leaseAdmissions(r.procs); now <= before {
			b.Errorf("no admission from a lease after Redis returned (%v before, %v after)", before, now)
		}
	}
}

// sidecarKilled is the scene fault that SIGKILLs the first sidecar, which
// holds a lease.
func sidecarKilled(_ *testing.B, r *leaseRun) func([]answer) {
	r.procs[0].kill()
	return nil
}

// sidecarPaused is the scene fault that stops the first sidecar for 200 ms.
func sidecarPaused(_ *testing.B, r *leaseRun) func([]answer) {
	r.procs[0].Signal(syscall.SIGSTOP)
	time.Sleep(200 * time.Millisecond)
	r.procs[0].Signal(syscall.SIGCONT)
	return nil
}

// limitHalved is the scene fault that reloads the limit to half; once every
// sidecar has applied it (and the checks already being decided are done),
// no window holds more than the new limit.
func limitHalved(b *testing.B, r *leaseRun) func([]answer) {
	lower := r.scene.limit / 2
	since := time.Now()
	r.cm.Update(r.scene.config(lower))
	for _, p := range r.procs {
		if _, ok := untilApplied(since, func() bool {
			n, err := strconv.Atoi(p.Check(claim("")).Headers()["x-ratelimit-limit"])
			return err == nil && n == lower
		}); !ok {
			b.Errorf("a sidecar never applied the lower limit")
		}
	}
	applied := time.Now()
	b.Logf("every sidecar applied %d after %s", lower, applied.Sub(since).Round(time.Millisecond))
	return func(all []answer) {
		const margin = 300 * time.Millisecond // checks mapped under the old rule still being decided
		var later []answer
		for _, a := range all {
			if a.Sent.After(applied.Add(margin)) {
				later = append(later, a)
			}
		}
		n, span := worstSpan(later, r.scene.win())
		b.Logf("after the reload applied: %d admissions, the most in one window %d (bound %d)", len(later), n, lower)
		if n > lower {
			logSpan(b, span, applied, r.scene.win())
			b.Errorf("BOUND BROKEN: %d admissions within one window after every sidecar applied the limit of %d", n, lower)
		}
	}
}

// fleetDoubled is the scene fault that starts as many sidecars again and
// puts the same load on them; after the run, every sidecar that joined
// took leases once the whole fleet counted it.
func fleetDoubled(b *testing.B, r *leaseRun) func([]answer) {
	n := len(r.procs)
	start := time.Now()
	more := startFleet(b, n, r.rs.Addr(), leaseBenchPrefix, r.args...)
	r.load.add(more...)
	r.procs = append(r.procs, more...)
	waitFleetSize(b, r.procs, 2*n, 60*time.Second)
	b.Logf("%d sidecars joined and every one counted %d after %s", n, 2*n, time.Since(start).Round(time.Millisecond))
	before := make([]float64, len(r.procs))
	for i, p := range r.procs {
		before[i], _ = leaseCounts(p)
	}
	return func([]answer) {
		starved := 0
		for i, p := range r.procs {
			if now, _ := leaseCounts(p); now == before[i] && i >= n {
				starved++
			}
		}
		if starved > 0 {
			b.Errorf("%d of the %d sidecars that joined took no lease on the grown fleet", starved, n)
		}
	}
}

// judged returns the scene of 12 sidecars on the limit of 2,000 a second
// leased for 50 ms, with the fault f.
func judged(f func(*testing.B, *leaseRun) func([]answer)) leaseScene {
	return leaseScene{sidecars: judgedSidecars, limit: judgedLimit, lease: judgedLease, fault: f}
}

// BenchmarkLeasedFleet: the judging set. Twelve sidecars, one leased
// global rule of 2,000 a second (leases of 50 ms), six callers per sidecar
// for 4 s; the same rule without a lease first, for the cost's ratio; then
// each fault. Run it once:
//
//	go test -run '^$' -bench LeasedFleet -benchtime 1x -timeout 60m ./e2e/
func BenchmarkLeasedFleet(b *testing.B) {
	unleased := judged(nil)
	unleased.lease = 0
	var plain leaseCost
	b.Run("unleased", func(b *testing.B) { plain = unleased.measure(b) })
	b.Run("steady", func(b *testing.B) {
		c := judged(nil).measure(b)
		ratio(b, c, plain)
	})
	local := judged(redisRestarted)
	local.local = true
	local.bound = judgedLimit + judgedSidecars*((judgedLimit+judgedSidecars-1)/judgedSidecars) // guarantees.md: L + N·s
	slow := judged(nil)
	slow.slowLink = true
	grow := judged(fleetDoubled)
	perUser := judged(nil)
	perUser.users = 1000
	for _, sc := range []struct {
		name  string
		scene leaseScene
	}{
		{"redis-restarted", judged(redisRestarted)},
		{"redis-restarted-local", local},
		{"sidecar-killed", judged(sidecarKilled)},
		{"sidecar-paused", judged(sidecarPaused)},
		{"slow-link", slow},
		{"reload-halved", judged(limitHalved)},
		{"fleet-doubled", grow},
		{"per-user", perUser},
	} {
		b.Run(sc.name, func(b *testing.B) { sc.scene.measure(b) })
	}
	// A limit above 10,000 is an exact log when leased (descriptors turn
	// the automatic buckets off for it): the same fleet, at 12,000 a
	// second and at 12,000 per 3 s (which this machine can saturate).
	for _, w := range []time.Duration{time.Second, 3 * time.Second} {
		big := judged(nil)
		big.limit, big.window, big.run = 12_000, w, 2*w+judgedRun
		if w == time.Second {
			big.lease = 0 // bucketed (60 buckets) without a lease, for the cost's ratio
			b.Run("limit-12000-per-1s-unleased", func(b *testing.B) { plain = big.measure(b) })
			big.lease = judgedLease
		}
		b.Run("limit-12000-per-"+w.String(), func(b *testing.B) {
			c := big.measure(b)
			if w == time.Second {
				ratio(b, c, plain)
			}
		})
	}
}

// BenchmarkLeasedFleetSweep: the cost leased and not as the fleet grows (4,
// 8, 12, 24 sidecars, leases of 50 ms) and as the lease lengthens (20, 50,
// 100 ms on 12 sidecars), one global rule of 2,000 a second, six callers
// per sidecar for 4 s:
//
//	go test -run '^$' -bench LeasedFleetSweep -benchtime 1x -timeout 60m ./e2e/
func BenchmarkLeasedFleetSweep(b *testing.B) {
	for _, n := range []int{4, 8, 12, 24} {
		var plain leaseCost
		s := leaseScene{sidecars: n, limit: judgedLimit}
		b.Run(fmt.Sprintf("sidecars=%d/lease=none", n), func(b *testing.B) { plain = s.measure(b) })
		for _, d := range []time.Duration{20 * time.Millisecond, 50 * time.Millisecond, 100 * time.Millisecond} {
			if d != judgedLease && n != judgedSidecars {
				continue
			}
			s.lease = d
			b.Run(fmt.Sprintf("sidecars=%d/lease=%s", n, d), func(b *testing.B) { ratio(b, s.measure(b), plain) })
		}
	}
}

// ratio reports c's Redis CPU per admitted check against plain's, the same
// rule without a lease in the same run.
func ratio(b *testing.B, c, plain leaseCost) {
	if r := c.cpuMicros / plain.cpuMicros; !math.IsNaN(r) && !math.IsInf(r, 0) && plain.cpuMicros > 0 {
		b.ReportMetric(r, "cpu-vs-unleased")
		b.Logf("Redis CPU per admitted check %.2f × the unleased rule's; script calls per admitted check %.3f against %.3f", r, c.calls, plain.calls)
	}
}
