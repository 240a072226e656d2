package e2e

// The conformance suite against envoyproxy/ratelimit's own integration
// cases (its test/integration/integration_test.go at commit f2fb157:
// testBasicBaseConfig with its plain, local-cache, cache-key-prefix and
// stop-cache-key-increment variants, testShareThreshold and
// testConfigReload), rewritten for a real process run as a swap runs it:
// the binary called ratelimit, configured by ratelimit's environment
// variables alone (REDIS_URL, RUNTIME_ROOT, LOCAL_CACHE_SIZE_IN_BYTES, ...,
// none of flashgate's), on ratelimit's runtime directory
// (testdata/ratelimit-integration, see its ORIGIN.md), on a standalone
// Redis, a password-protected one, a password-protected one behind a
// Sentinel and a password-protected Redis Cluster.
//
// Every step compares the answer as received as ratelimit's suite does:
// proto.Equal against the response ratelimit expects, each status's
// duration_until_reset taken from the answer in whole seconds (ratelimit's
// newDescriptorStatus drops the nanoseconds; a sliding window's reset is
// its own, documented). Nothing is cleared first: a header, a raw_body or
// any field ratelimit would not send fails the step. ratelimit's statsd
// counters (total_hits, over_limit, the local cache's hit and miss gauges)
// are not ported: flashgate exports Prometheus metrics instead
// (documented).
//
// A step that differs from ratelimit is accepted only when one of
// rlDifferences explains it: the difference turns ratelimit's expected
// answer into the one flashgate deliberately gives, and the answer must
// equal that. A step still waiting for a fix in the rls package is listed,
// by group, in pendingFixes. An entry of either table that no step needed
// fails the suite: the tables say what is true.

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/redis/go-redis/v9"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/flashgate/flashgate/window/redistest"
)

// rlSuiteDir is ratelimit's runtime directory (RUNTIME_ROOT/RUNTIME_SUBDIRECTORY).
const rlSuiteDir = "testdata/ratelimit-integration/ratelimit"

// rlPassword is the password of the protected topologies, ratelimit's.
const rlPassword = "password123"

// rlVariant is one of ratelimit's settings under which testBasicBaseConfig
// runs.
type rlVariant struct {
	name string
	// localCache: ratelimit's LOCAL_CACHE_SIZE_IN_BYTES=1000, whose keys get
	// the suffix "_local" (getCacheKey); flashgate's local cache is always
	// on, here at its smallest budget.
	localCache bool
	// stopIncrement: ratelimit's STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT=true.
	stopIncrement bool
	// keyPrefix: ratelimit's CACHE_KEY_PREFIX; "": none.
	keyPrefix string
}

// env is ratelimit's environment of variant v beyond the Redis's and the
// runtime directory's: LOCAL_CACHE_SIZE_IN_BYTES=1000 (flashgate takes its
// smallest budget), STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT, CACHE_KEY_PREFIX.
func (v rlVariant) env() []string {
	var env []string
	if v.localCache {
		env = append(env, "LOCAL_CACHE_SIZE_IN_BYTES=1000")
	}
	if v.stopIncrement {
		env = append(env, "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT=true")
	}
	if v.keyPrefix != "" {
		env = append(env, "CACHE_KEY_PREFIX="+v.keyPrefix)
	}
	return env
}

// rlVariants are the variants of ratelimit's TestBasicConfig without a
// per-second Redis (REDIS_PERSECOND is not honoured: one Redis holds every
// window).
var rlVariants = []rlVariant{
	{name: "WithoutPerSecondRedis"},
	{name: "WithoutPerSecondRedisWithLocalCache", localCache: true},
	{name: "WithoutPerSecondRedisWithCachePrefix", keyPrefix: "prefix:"},
	{name: "WithoutPerSecondRedisWithstopCacheKeyIncrementWhenOverlimitConfig", stopIncrement: true},
	{name: "WithoutPerSecondRedisWithLocalCacheAndstopCacheKeyIncrementWhenOverlimitConfig", localCache: true, stopIncrement: true},
}

// Step groups: the steps of one group are one loop of ratelimit's test.
const (
	gUnknownDomain  = "unknown domain"
	gKey1           = "basic key1, first hit"
	gKey2Under      = "another key2 alone, under its limit"
	gKey2Over       = "another key2 alone, over its limit"
	gKey23Under     = "another key2 and key3, under key3's limit"
	gKey23Over      = "another key2 and key3, over key3's limit"
	gKey23Cached    = "another key2 and key3, over key3's limit again"
	gResetTicks     = "another key4, duration_until_reset ticks down"
	gShareFill      = "share_threshold files/*, filling the shared limit"
	gShareOver      = "share_threshold files/*, another value over the shared limit"
	gNoShare        = "share_threshold files_no_share/*, a limit per value"
	gReloadBefore   = "reload, domain not loaded yet"
	gReloadLoaded   = "reload, file added: reloaded"
	gReloadAnswered = "reload, the added domain answers"
	gReloadRemoved  = "reload, file removed: reloaded"
)

// rlDifference is a documented, deliberate difference from ratelimit.
type rlDifference struct {
	reason string
	// applies reports whether the difference shows in variant v.
	applies func(v rlVariant) bool
	// answers returns flashgate's documented answers to a step whose
	// answer by ratelimit is want (left as it is); any of them is accepted.
	answers func(want *rlsv3.RateLimitResponse) []*rlsv3.RateLimitResponse
}

// withStatus returns a copy of want whose status i edit changed.
func withStatus(want *rlsv3.RateLimitResponse, i int, edit func(st *rlsv3.RateLimitResponse_DescriptorStatus)) *rlsv3.RateLimitResponse {
	c := proto.Clone(want).(*rlsv3.RateLimitResponse)
	edit(c.Statuses[i])
	return c
}

// rlDifferences, by step group.
var rlDifferences = map[string]rlDifference{
	gKey23Over: {
		reason:  "all or nothing (ratelimit's STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT=true, always): the request key3 refuses is counted in no window, so key2 keeps 10 remaining where ratelimit's default counts it in key2's",
		applies: func(v rlVariant) bool { return !v.stopIncrement },
		answers: func(want *rlsv3.RateLimitResponse) []*rlsv3.RateLimitResponse {
			return []*rlsv3.RateLimitResponse{withStatus(want, 0, func(st *rlsv3.RateLimitResponse_DescriptorStatus) { st.LimitRemaining = 10 })}
		},
	},
	gKey23Cached: {
		reason:  "the local over-limit cache, always on: key3 over its limit refuses the request without Redis, so no window is counted and key2, uncounted, says OK with no current_limit, so that Envoy's headers name the limit that refused",
		applies: func(rlVariant) bool { return true },
		answers: func(want *rlsv3.RateLimitResponse) []*rlsv3.RateLimitResponse {
			return []*rlsv3.RateLimitResponse{
				withStatus(want, 0, func(st *rlsv3.RateLimitResponse_DescriptorStatus) {
					st.LimitRemaining, st.CurrentLimit, st.DurationUntilReset = 0, nil, nil
				}),
			}
		},
	},
}

// pendingFix is a step group that fails in this tree only because of a
// change being made in the rls package.
type pendingFix struct {
	reason string
	// excuse, when not nil, undoes the pending change's part of an
	// answer: the step counts as pending only if the answer then equals
	// ratelimit's (or the documented) one; otherwise it fails.
	excuse func(got *rlsv3.RateLimitResponse)
}

// wholeSeconds drops the fraction of a second of every
// duration_until_reset: what a reset rounded up to whole seconds changes.
func wholeSeconds(got *rlsv3.RateLimitResponse) {
	for _, st := range got.GetStatuses() {
		if d := st.GetDurationUntilReset(); d != nil {
			d.Nanos = 0
		}
	}
}

// pendingFixes are step groups known to fail until a change to the rls
// package lands; they are tallied, not failed. None today. The suite
// fails on an entry that no step needs, so an entry goes with its fix.
var pendingFixes = map[string]pendingFix{}

// rlTally counts the outcomes of the steps of one topology.
type rlTally struct {
	pass, documented, pending int
	// pendingPass and pendingDocumented are the pending steps whose answer,
	// the pending change undone, equals ratelimit's, or the documented one.
	pendingPass, pendingDocumented int
	// usedDiff and pendingFailed name the groups where a difference was
	// needed, and where a pending fix was.
	usedDiff, pendingFailed map[string]bool
	// appliedDiff names the groups of differences that applied to a
	// variant that ran.
	appliedDiff map[string]bool
	// pendingSeen names the pending groups with a step that ran.
	pendingSeen map[string]bool
}

func newRLTally() *rlTally {
	return &rlTally{usedDiff: map[string]bool{}, pendingFailed: map[string]bool{}, appliedDiff: map[string]bool{}, pendingSeen: map[string]bool{}}
}

func (tl *rlTally) String() string {
	return fmt.Sprintf("%d pass, %d documented differences, %d pending fixes (of %d steps; of the pending, %d then pass and %d are documented differences)",
		tl.pass, tl.documented, tl.pending, tl.pass+tl.documented+tl.pending, tl.pendingPass, tl.pendingDocumented)
}

// rlRun is one flashgate process under one variant.
type rlRun struct {
	t      *testing.T
	v      rlVariant
	tally  *rlTally
	client rlsv3.RateLimitServiceClient
	p      *proc
	dir    string // the runtime directory (RUNTIME_ROOT/RUNTIME_SUBDIRECTORY), a copy
}

// key is ratelimit's getCacheKey.
func (r *rlRun) key(k string) string {
	if r.v.localCache {
		return k + "_local"
	}
	return k
}

// ask sends ratelimit's common.NewRateLimitRequest(domain, descriptors, 1).
func (r *rlRun) ask(domain string, descriptors ...[][2]string) *rlsv3.RateLimitResponse {
	r.t.Helper()
	req := &rlsv3.RateLimitRequest{Domain: domain, HitsAddend: 1}
	for _, d := range descriptors {
		nd := &ratelimitv3.RateLimitDescriptor{}
		for _, e := range d {
			nd.Entries = append(nd.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: e[0], Value: e[1]})
		}
		req.Descriptors = append(req.Descriptors, nd)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := r.client.ShouldRateLimit(ctx, req)
	if err != nil {
		r.t.Fatalf("ShouldRateLimit %v: %v", req, err)
	}
	return resp
}

// rlStatus is ratelimit's newDescriptorStatus: the duration in whole seconds
// of got's (the answer's own) duration.
func rlStatus(code rlsv3.RateLimitResponse_Code, rpu uint32, unit rlsv3.RateLimitResponse_RateLimit_Unit, remaining uint32, got *durationpb.Duration) *rlsv3.RateLimitResponse_DescriptorStatus {
	return &rlsv3.RateLimitResponse_DescriptorStatus{
		Code:               code,
		CurrentLimit:       &rlsv3.RateLimitResponse_RateLimit{RequestsPerUnit: rpu, Unit: unit},
		LimitRemaining:     remaining,
		DurationUntilReset: &durationpb.Duration{Seconds: got.GetSeconds()},
	}
}

// durOf returns the duration_until_reset of got's status i, nil if none.
func durOf(got *rlsv3.RateLimitResponse, i int) *durationpb.Duration {
	if i < len(got.GetStatuses()) {
		return got.GetStatuses()[i].GetDurationUntilReset()
	}
	return nil
}

// compare records one step: got against ratelimit's want.
func (r *rlRun) compare(group, name string, got, want *rlsv3.RateLimitResponse) {
	r.t.Helper()
	if proto.Equal(want, got) {
		r.record(group, name, true, "")
		return
	}
	detail := fmt.Sprintf("expected: %v\nactual:   %v", want, got)
	var documented []*rlsv3.RateLimitResponse
	if d, ok := rlDifferences[group]; ok && d.applies(r.v) {
		documented = d.answers(want)
		if slices.ContainsFunc(documented, func(a *rlsv3.RateLimitResponse) bool { return proto.Equal(a, got) }) {
			r.seen(group)
			r.tally.documented++
			r.tally.usedDiff[group] = true
			return
		}
		for _, a := range documented {
			detail += fmt.Sprintf("\nflashgate's documented answer (%s): %v", d.reason, a)
		}
	}
	if p, ok := pendingFixes[group]; ok && p.excuse != nil {
		ex := proto.Clone(got).(*rlsv3.RateLimitResponse)
		p.excuse(ex)
		switch {
		case proto.Equal(want, ex):
			r.tally.pendingPass++
		case slices.ContainsFunc(documented, func(a *rlsv3.RateLimitResponse) bool { return proto.Equal(a, ex) }):
			r.tally.pendingDocumented++
			r.tally.usedDiff[group] = true
		default:
			r.t.Errorf("%s: %s: differs from ratelimit beyond the pending fix (%s)\n%s", group, name, p.reason, detail)
			return
		}
	}
	r.record(group, name, false, detail)
}

// seen notes that a step of group ran, for the checks of the tables.
func (r *rlRun) seen(group string) {
	if d, has := rlDifferences[group]; has && d.applies(r.v) {
		r.tally.appliedDiff[group] = true
	}
	if _, has := pendingFixes[group]; has {
		r.tally.pendingSeen[group] = true
	}
}

// record records a step that passed or failed; a failure in a pending
// group is tallied as pending.
func (r *rlRun) record(group, name string, ok bool, detail string) {
	r.t.Helper()
	r.seen(group)
	switch {
	case ok:
		r.tally.pass++
	case pendingFixes[group].reason != "":
		r.tally.pending++
		if !r.tally.pendingFailed[group] { // the first of the group: an example
			r.t.Logf("pending fix (%s): %s: %s\n%s", pendingFixes[group].reason, group, name, detail)
		}
		r.tally.pendingFailed[group] = true
	default:
		r.t.Errorf("%s: %s: differs from ratelimit\n%s", group, name, detail)
	}
}

// copyRuntime copies ratelimit's runtime directory into a new temporary
// directory and returns the copy's path.
func copyRuntime(t *testing.T) string {
	t.Helper()
	dst := filepath.Join(t.TempDir(), "ratelimit")
	err := filepath.WalkDir(rlSuiteDir, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(rlSuiteDir, path)
		if err != nil {
			return err
		}
		if d.IsDir() {
			return os.MkdirAll(filepath.Join(dst, rel), 0o755)
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dst, rel), b, 0o644)
	})
	if err != nil {
		t.Fatalf("copy %s: %v", rlSuiteDir, err)
	}
	return dst
}

// rlTopology is a Redis to run the suite on: ratelimit's Redis variables.
type rlTopology struct {
	name  string
	start func(t *testing.T) []string
}

// rlRedis is ratelimit's environment of a Redis: REDIS_TYPE (single,
// sentinel, cluster), REDIS_URL and, when not "", REDIS_AUTH.
func rlRedis(typ, url, auth string) []string {
	env := []string{"REDIS_SOCKET_TYPE=tcp", "REDIS_TYPE=" + typ, "REDIS_URL=" + url}
	if auth != "" {
		env = append(env, "REDIS_AUTH="+auth)
	}
	return env
}

// startRatelimit starts the binary as ratelimit in the environment env
// (ratelimit's variables: the Redis's, the config's, the variant's) and
// USE_STATSD=false, as ratelimit's suite runs it; lo's TLS too.
func startRatelimit(t *testing.T, lo launchOpts, env ...string) *proc {
	t.Helper()
	lo.ratelimitEnv = append([]string{"USE_STATSD=false"}, env...)
	p, err := launchRetryWith(t, nil, lo)
	if err != nil {
		t.Fatalf("start ratelimit %s: %v", strings.Join(lo.ratelimitEnv, " "), err)
	}
	return p
}

// protect sets ratelimit's password on the Redis at addr and checks that
// it is asked for.
func protect(t *testing.T, addr string) {
	t.Helper()
	c := redisClient(t, addr)
	if err := c.ConfigSet(bg(), "requirepass", rlPassword).Err(); err != nil {
		t.Fatalf("CONFIG SET requirepass on %s: %v", addr, err)
	}
	anon := redis.NewClient(&redis.Options{Addr: addr, DisableIdentity: true, Protocol: 2, MaxRetries: -1})
	defer anon.Close()
	if err := anon.Ping(bg()).Err(); err == nil || !strings.Contains(err.Error(), "NOAUTH") {
		t.Fatalf("PING without the password on %s: %v, want NOAUTH", addr, err)
	}
}

var rlTopologies = []rlTopology{
	{name: "standalone", start: func(t *testing.T) []string {
		return rlRedis("single", redistest.Start(t).Addr(), "")
	}},
	{name: "password", start: func(t *testing.T) []string {
		s := redistest.Start(t)
		protect(t, s.Addr())
		return rlRedis("single", s.Addr(), rlPassword)
	}},
	{name: "sentinel-password", start: func(t *testing.T) []string {
		m := redistest.Start(t)
		sen := redistest.StartSentinel(t, m, "mymaster")
		sc := redis.NewSentinelClient(&redis.Options{Addr: sen.Addr(), DisableIdentity: true, Protocol: 2})
		defer sc.Close()
		if err := sc.Set(bg(), "mymaster", "auth-pass", rlPassword).Err(); err != nil {
			t.Fatalf("SENTINEL SET mymaster auth-pass: %v", err)
		}
		protect(t, m.Addr())
		return rlRedis("sentinel", "mymaster,"+sen.Addr(), rlPassword)
	}},
	{name: "cluster-password", start: func(t *testing.T) []string {
		cl := redistest.StartCluster(t, 3)
		for _, a := range cl.Addrs() {
			protect(t, a)
		}
		return rlRedis("cluster", strings.Join(cl.Addrs(), ","), rlPassword)
	}},
}

// TestRatelimitSuite runs ratelimit's integration cases on each topology
// and logs the tally of each.
func TestRatelimitSuite(t *testing.T) {
	for _, topo := range rlTopologies {
		t.Run(topo.name, func(t *testing.T) {
			redisEnv := topo.start(t)
			tally := newRLTally()
			start := func(t *testing.T, v rlVariant) *rlRun {
				t.Helper()
				dir := copyRuntime(t)
				env := append([]string{"RUNTIME_ROOT=" + filepath.Dir(dir), "RUNTIME_SUBDIRECTORY=" + filepath.Base(dir)}, redisEnv...)
				p := startRatelimit(t, launchOpts{}, append(env, v.env()...)...)
				return &rlRun{t: t, v: v, tally: tally, client: rlsv3.NewRateLimitServiceClient(p.conn), p: p, dir: dir}
			}
			for _, v := range rlVariants {
				t.Run("BasicConfig/"+v.name, func(t *testing.T) { testRLBasic(start(t, v)) })
			}
			t.Run("ShareThreshold", func(t *testing.T) { testRLShareThreshold(start(t, rlVariants[0])) })
			t.Run("ConfigReload", func(t *testing.T) { testRLConfigReload(start(t, rlVariants[0])) })

			tally.finish(t, topo.name+" Redis")
		})
	}
}

// finish fails the test on a table entry no step needed and logs the
// tally of the suite run on what.
func (tl *rlTally) finish(t *testing.T, what string) {
	t.Helper()
	for g := range rlDifferences {
		if tl.appliedDiff[g] && !tl.usedDiff[g] && !tl.pendingFailed[g] {
			t.Errorf("rlDifferences[%q] was needed by no step: flashgate answers as ratelimit; delete it", g)
		}
	}
	for g := range pendingFixes {
		if tl.pendingSeen[g] && !tl.pendingFailed[g] {
			t.Errorf("pendingFixes[%q]: every step passes now; delete it", g)
		}
	}
	t.Logf("ratelimit's integration suite on %s: %s", what, tl)
	var notes []string
	for g := range tl.usedDiff {
		notes = append(notes, fmt.Sprintf("documented difference in %q: %s", g, rlDifferences[g].reason))
	}
	for g := range tl.pendingFailed {
		notes = append(notes, fmt.Sprintf("pending fix in %q: %s", g, pendingFixes[g].reason))
	}
	slices.Sort(notes)
	for _, n := range notes {
		t.Log(n)
	}
}

// testRLBasic is ratelimit's testBasicBaseConfig.
func testRLBasic(r *rlRun) {
	const (
		ok   = rlsv3.RateLimitResponse_OK
		over = rlsv3.RateLimitResponse_OVER_LIMIT
	)
	got := r.ask("foo", [][2]string{{r.key("hello"), "world"}})
	r.compare(gUnknownDomain, "foo hello=world", got, &rlsv3.RateLimitResponse{
		OverallCode: ok,
		Statuses:    []*rlsv3.RateLimitResponse_DescriptorStatus{{Code: ok, CurrentLimit: nil, LimitRemaining: 0}},
	})

	got = r.ask("basic", [][2]string{{r.key("key1"), "foo"}})
	r.compare(gKey1, "basic key1=foo", got, &rlsv3.RateLimitResponse{
		OverallCode: ok,
		Statuses:    []*rlsv3.RateLimitResponse_DescriptorStatus{rlStatus(ok, 50, rlsv3.RateLimitResponse_RateLimit_SECOND, 49, durOf(got, 0))},
	})

	// A random key, over its limit of a minute.
	value := strconv.FormatUint(rand.Uint64(), 10)
	for i := 0; i < 25; i++ {
		code, remaining, group := ok, uint32(20-(i+1)), gKey2Under
		if i >= 20 {
			code, remaining, group = over, 0, gKey2Over
		}
		got := r.ask("another", [][2]string{{r.key("key2"), value}})
		r.compare(group, fmt.Sprintf("request %d", i+1), got, &rlsv3.RateLimitResponse{
			OverallCode: code,
			Statuses:    []*rlsv3.RateLimitResponse_DescriptorStatus{rlStatus(code, 20, rlsv3.RateLimitResponse_RateLimit_MINUTE, remaining, durOf(got, 0))},
		})
	}

	// Two keys of one domain.
	value = strconv.FormatUint(rand.Uint64(), 10)
	for i := 0; i < 15; i++ {
		code, group := ok, gKey23Under
		remaining1, remaining2 := uint32(20-(i+1)), uint32(10-(i+1))
		if i >= 10 {
			code, group, remaining2 = over, gKey23Over, 0
			if i > 10 {
				group = gKey23Cached
			}
			if r.v.stopIncrement {
				remaining1 = 10
			}
		}
		got := r.ask("another", [][2]string{{r.key("key2"), value}}, [][2]string{{r.key("key3"), value}})
		r.compare(group, fmt.Sprintf("request %d", i+1), got, &rlsv3.RateLimitResponse{
			OverallCode: code,
			Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{
				rlStatus(ok, 20, rlsv3.RateLimitResponse_RateLimit_MINUTE, remaining1, durOf(got, 0)),
				rlStatus(code, 10, rlsv3.RateLimitResponse_RateLimit_HOUR, remaining2, durOf(got, 1)),
			},
		})
	}

	// duration_until_reset ticks down: the same key twice, 2 s apart. (The
	// pause is the case itself: the second answer must say less time left.)
	value = "durTest-" + strconv.FormatUint(rand.Uint64(), 10)
	resp1 := r.ask("another", [][2]string{{r.key("key4"), value}})
	time.Sleep(2 * time.Second)
	resp2 := r.ask("another", [][2]string{{r.key("key4"), value}})
	d1, d2 := durOf(resp1, 0).GetSeconds(), durOf(resp2, 0).GetSeconds()
	r.record(gResetTicks, "key4 twice, 2 s apart", d2 < d1,
		fmt.Sprintf("duration_until_reset %ds then %ds 2 s later, want less the second time", d1, d2))
}

// testRLShareThreshold is ratelimit's testShareThreshold.
func testRLShareThreshold(r *rlRun) {
	const domain = "share-threshold-test"
	for i := 0; i < 10; i++ {
		got := r.ask(domain, [][2]string{{"files", "files/a.pdf"}})
		c := got.GetOverallCode()
		r.record(gShareFill, fmt.Sprintf("files/a.pdf request %d", i+1), c == rlsv3.RateLimitResponse_OK || c == rlsv3.RateLimitResponse_OVER_LIMIT,
			fmt.Sprintf("overall code %v, want OK or OVER_LIMIT", c))
	}
	got := r.ask(domain, [][2]string{{"files", "files/b.csv"}})
	r.compare(gShareOver, "files/b.csv", got, &rlsv3.RateLimitResponse{
		OverallCode: rlsv3.RateLimitResponse_OVER_LIMIT,
		Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{
			rlStatus(rlsv3.RateLimitResponse_OVER_LIMIT, 10, rlsv3.RateLimitResponse_RateLimit_HOUR, 0, durOf(got, 0)),
		},
	})
	base := time.Now().UnixNano()
	for i := 0; i < 10; i++ {
		got := r.ask(domain, [][2]string{{"files_no_share", fmt.Sprintf("files_no_share/%d-%d", base, rand.Int64())}})
		r.compare(gNoShare, fmt.Sprintf("a new value, request %d", i+1), got, &rlsv3.RateLimitResponse{
			OverallCode: rlsv3.RateLimitResponse_OK,
			Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{
				rlStatus(rlsv3.RateLimitResponse_OK, 10, rlsv3.RateLimitResponse_RateLimit_HOUR, 9, durOf(got, 0)),
			},
		})
	}
}

// testRLConfigReload is ratelimit's testConfigReload on a config
// directory: reload.yaml copied into config/ is loaded, and its removal
// reloads too.
func testRLConfigReload(r *rlRun) {
	reload := filepath.Join(r.dir, "config", "reload.yaml")
	testRLReload(r, func() {
		b, err := os.ReadFile(filepath.Join(r.dir, "reload.yaml"))
		if err != nil {
			r.t.Fatal(err)
		}
		if err := os.WriteFile(reload, b, 0o644); err != nil {
			r.t.Fatal(err)
		}
	}, func() {
		if err := os.Remove(reload); err != nil {
			r.t.Fatal(err)
		}
	})
}

// testRLReload is ratelimit's testConfigReload: add makes the domain
// reload appear, remove makes it go. ratelimit's config_load_success is
// flashgate's flashgate_rls_config_reloads_total{result="success"}.
func testRLReload(r *rlRun, add, remove func()) {
	got := r.ask("reload", [][2]string{{r.key("block"), "foo"}})
	r.compare(gReloadBefore, "reload block=foo", got, &rlsv3.RateLimitResponse{
		OverallCode: rlsv3.RateLimitResponse_OK,
		Statuses:    []*rlsv3.RateLimitResponse_DescriptorStatus{{Code: rlsv3.RateLimitResponse_OK}},
	})

	loads := func() float64 {
		code, _, err := r.p.get("/metrics")
		if err != nil || code != http.StatusOK {
			return -1
		}
		return r.p.Metrics().Value("flashgate_rls_config_reloads_total", "result", "success")
	}
	waitReload := func(before float64) (float64, bool) {
		var after float64
		_, ok := waitFor(120*time.Second, func() bool { after = loads(); return after > before })
		return after, ok
	}

	before := loads()
	add()
	after, ok := waitReload(before)
	r.record(gReloadLoaded, "reload domain added", ok, fmt.Sprintf("config reloads %v, then %v", before, after))

	got = r.ask("reload", [][2]string{{r.key("key1"), "foo"}})
	r.compare(gReloadAnswered, "reload key1=foo", got, &rlsv3.RateLimitResponse{
		OverallCode: rlsv3.RateLimitResponse_OK,
		Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{
			rlStatus(rlsv3.RateLimitResponse_OK, 50, rlsv3.RateLimitResponse_RateLimit_SECOND, 49, durOf(got, 0)),
		},
	})

	remove()
	before = after
	after, ok = waitReload(before)
	r.record(gReloadRemoved, "reload domain removed", ok, fmt.Sprintf("config reloads %v, then %v", before, after))

	// Beyond ratelimit's case (not tallied): the removed domain is unknown
	// again.
	got = r.ask("reload", [][2]string{{r.key("key1"), "foo"}})
	if want := (&rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK,
		Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{{Code: rlsv3.RateLimitResponse_OK}}}); !proto.Equal(want, got) {
		r.t.Errorf("after the domain reload was removed: %v, want %v", got, want)
	}
}

// TestRatelimitResponseHeaders: with LIMIT_RESPONSE_HEADERS_ENABLED=true
// and ratelimit's header names set, an answer is ratelimit's with exactly
// its three headers (the limit, the remaining count and the seconds until
// reset of the descriptor with the fewest remaining), OVER_LIMIT included:
// nothing of flashgate's. Not one of ratelimit's integration cases.
func TestRatelimitResponseHeaders(t *testing.T) {
	dir := copyRuntime(t)
	p := startRatelimit(t, launchOpts{}, append(rlRedis("single", redistest.Start(t).Addr(), ""),
		"RUNTIME_ROOT="+filepath.Dir(dir), "RUNTIME_SUBDIRECTORY="+filepath.Base(dir), "LIMIT_RESPONSE_HEADERS_ENABLED=true",
		"LIMIT_LIMIT_HEADER=X-Limit", "LIMIT_REMAINING_HEADER=X-Remaining", "LIMIT_RESET_HEADER=X-Reset")...)
	r := &rlRun{t: t, tally: newRLTally(), client: rlsv3.NewRateLimitServiceClient(p.conn), p: p, dir: dir}
	value := strconv.FormatUint(rand.Uint64(), 10)
	for i := 0; i < 22; i++ {
		code, remaining := rlsv3.RateLimitResponse_OK, uint32(20-(i+1))
		if i >= 20 {
			code, remaining = rlsv3.RateLimitResponse_OVER_LIMIT, 0
		}
		got := r.ask("another", [][2]string{{"key2", value}})
		reset := durOf(got, 0).GetSeconds()
		want := &rlsv3.RateLimitResponse{
			OverallCode: code,
			Statuses:    []*rlsv3.RateLimitResponse_DescriptorStatus{rlStatus(code, 20, rlsv3.RateLimitResponse_RateLimit_MINUTE, remaining, durOf(got, 0))},
			ResponseHeadersToAdd: []*corev3.HeaderValue{
				{Key: "X-Limit", Value: "20"},
				{Key: "X-Remaining", Value: strconv.FormatUint(uint64(remaining), 10)},
				{Key: "X-Reset", Value: strconv.FormatInt(reset, 10)},
			},
		}
		if reset < 1 || reset > 60 || !proto.Equal(want, got) {
			t.Errorf("request %d: %v\nwant %v (a reset of 1 to 60 s)", i+1, got, want)
		}
	}
}
