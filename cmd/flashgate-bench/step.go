package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
)

// stepOptions are the step command's flags: the load's (benchOptions) and
// the schedule's.
type stepOptions struct {
	load benchOptions
	// idle is how long the load stays at idleRate before the step; peak
	// how long it then stays at factor × idleRate.
	idle, peak time.Duration
	idleRate   float64
	factor     float64
	// bucket is the span of one reported row of the peak.
	bucket time.Duration
	// envoyTimeout is the ext_authz timeout of the Envoy in front: a check
	// answered later than this is a 403 to the buyer.
	envoyTimeout time.Duration
	// steadyFrom is where, after the step, the steady state is taken to
	// begin.
	steadyFrom time.Duration
	// jsonFile, if set, receives the JSON result besides the table.
	jsonFile string
	// metricsURL, if set, is the server's /metrics, read at the start,
	// the step, a second after it and the end.
	metricsURL string
}

func newStepCmd(e env) *cobra.Command {
	var o stepOptions
	cmd := &cobra.Command{
		Use:   "step --addr A [--idle 60s] --idle-rate R [--factor 50] [--peak 10s] [--redis-addr R] [--server-pid P] [--json]",
		Short: "Hold an idle load, then step it up at once, and report the step in rows of 100ms",
		Long: `flashgate-bench step sends checks on a fixed schedule: --idle-rate per
second for --idle, then --factor times as many per second from one instant
on, for --peak. Up to --concurrency checks are in flight; a check counts
its latency from when it was due, so a server (or a load generator) that
falls behind shows it in the latency rather than in a lower rate.

It reports the idle period in one row and the peak in rows of --bucket, by
when each check was due: checks due and answered, errors, p50/p99/max
latency, checks slower than --envoy-timeout (Envoy's ext_authz timeout,
200ms by default) and the 403s Envoy would then send the buyer
(failure_mode_allow off: a check slower than the timeout, or failed, is
denied with status_on_error, 403), and with --redis-addr the script calls
and commands Redis ran per check in the row's span and the connections it
accepted (INFO, sampled at every row's edge), with --server-pid the
server's CPU time in it. Then the first
second, the steady state (from --steady-from after the step to its end)
and the goal: no check slower than --envoy-timeout, and the first second's
p99 within 3× the steady p99.`,
		Example: `  flashgate-bench step --addr 127.0.0.1:9191 --idle 60s --idle-rate 60 --factor 50 --peak 10s --users 100000 --redis-addr 127.0.0.1:6379`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runStep(cmd.Context(), e, o)
		},
	}
	f := cmd.Flags()
	addLoadFlags(f, &o.load, 512)
	f.DurationVar(&o.idle, "idle", time.Minute, "how long the load stays at --idle-rate before the step")
	f.Float64Var(&o.idleRate, "idle-rate", 50, "checks per second while idle")
	f.Float64Var(&o.factor, "factor", 50, "the step: the peak sends this many times --idle-rate")
	f.DurationVar(&o.peak, "peak", 10*time.Second, "how long the peak lasts")
	f.DurationVar(&o.bucket, "bucket", 100*time.Millisecond, "the span of one row of the peak")
	f.DurationVar(&o.envoyTimeout, "envoy-timeout", 200*time.Millisecond, "Envoy's ext_authz timeout: a check answered later is a 403 to the buyer")
	f.StringVar(&o.metricsURL, "metrics-url", "", "the server's /metrics (e.g. http://127.0.0.1:9192/metrics): its failure-mode decisions, backend errors, GC cycles, goroutines and Redis budget at the start, the step, a second later and the end")
	f.StringVar(&o.jsonFile, "json-file", "", "also write the result as one JSON object to this file")
	f.DurationVar(&o.steadyFrom, "steady-from", 5*time.Second, "where, after the step, the steady state it is compared with begins")
	return cmd
}

func (o stepOptions) validate() error {
	switch {
	case o.idle < 0:
		return fmt.Errorf("--idle %s: must not be negative", o.idle)
	case o.peak <= 0:
		return fmt.Errorf("--peak %s: must be positive", o.peak)
	case !(o.idleRate > 0):
		return fmt.Errorf("--idle-rate %g: must be positive", o.idleRate)
	case !(o.factor >= 1):
		return fmt.Errorf("--factor %g: must be at least 1", o.factor)
	case o.bucket <= 0 || o.bucket > o.peak:
		return fmt.Errorf("--bucket %s: must be positive and at most --peak", o.bucket)
	case o.envoyTimeout <= 0:
		return fmt.Errorf("--envoy-timeout %s: must be positive", o.envoyTimeout)
	case o.steadyFrom < 0 || o.steadyFrom >= o.peak:
		return fmt.Errorf("--steady-from %s: must be within --peak", o.steadyFrom)
	}
	o.load.duration = o.idle + o.peak
	return o.load.validate()
}

// stepSchedule says when each check of a step run is due: check k of the
// idle period at k / idleRate, check k of the peak at idle + k / peakRate.
type stepSchedule struct {
	start    time.Time
	idle     time.Duration
	idleN    int64 // checks due while idle
	idleRate float64
	peakRate float64
	end      time.Time
}

func newStepSchedule(o stepOptions, start time.Time) stepSchedule {
	return stepSchedule{
		start: start, idle: o.idle, idleRate: o.idleRate, peakRate: o.idleRate * o.factor,
		idleN: int64(math.Ceil(o.idle.Seconds() * o.idleRate)),
		end:   start.Add(o.idle + o.peak),
	}
}

// due returns when check k is due; false past the end.
func (s stepSchedule) due(k int64) (time.Time, bool) {
	var at time.Time
	if k < s.idleN {
		at = s.start.Add(time.Duration(math.Round(float64(k) / s.idleRate * float64(time.Second))))
	} else {
		at = s.start.Add(s.idle + time.Duration(math.Round(float64(k-s.idleN)/s.peakRate*float64(time.Second))))
	}
	return at, at.Before(s.end)
}

// stepRow is the tally of the checks due within one span. Its methods are
// safe for concurrent use.
type stepRow struct {
	// mu guards the fields below.
	mu                               sync.Mutex
	hist                             histogram
	due, allowed, denied, errs, slow uint64
}

func (r *stepRow) record(lat time.Duration, allowed bool, err error, slow time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.due++
	switch {
	case err != nil:
		r.errs++
		return
	case allowed:
		r.allowed++
	default:
		r.denied++
	}
	r.hist.record(lat)
	if lat > slow {
		r.slow++
	}
}

func (r *stepRow) mergeInto(into *stepRow) {
	into.hist.merge(&r.hist)
	into.due += r.due
	into.allowed += r.allowed
	into.denied += r.denied
	into.errs += r.errs
	into.slow += r.slow
}

// stepSample is what Redis and the server had done at one row's edge.
type stepSample struct {
	ok                       bool
	scripts, commands, conns int64
	server                   time.Duration
}

// stepRowResult is one row of the report (JSON).
type stepRowResult struct {
	FromMS   float64 `json:"from_ms"` // after the step (negative: before it)
	ToMS     float64 `json:"to_ms"`
	Due      uint64  `json:"due"`
	Answered uint64  `json:"answered"`
	Allowed  uint64  `json:"allowed"`
	Denied   uint64  `json:"denied"`
	Errors   uint64  `json:"errors"`
	P50MS    float64 `json:"p50_ms"`
	P99MS    float64 `json:"p99_ms"`
	MaxMS    float64 `json:"max_ms"`
	// Slow were answered after --envoy-timeout; Envoy403 is what Envoy
	// denies with its status_on_error: Slow plus Errors.
	Slow     uint64 `json:"slow"`
	Envoy403 uint64 `json:"envoy_403"`
	// ScriptsPerCheck and CommandsPerCheck: Redis's script calls and
	// commands in the row's span, over the checks due in it (with
	// --redis-addr); ServerCPUMS the server's CPU time in it (--server-pid).
	ScriptsPerCheck  *float64 `json:"redis_scripts_per_check,omitempty"`
	CommandsPerCheck *float64 `json:"redis_commands_per_check,omitempty"`
	ServerCPUMS      *float64 `json:"server_cpu_ms,omitempty"`
	// RedisConns are the connections Redis accepted in the span (a pool
	// that dials under load shows here).
	RedisConns *int64 `json:"redis_conns_opened,omitempty"`
}

// stepResult is the outcome of a step run, as printed by step --json.
type stepResult struct {
	Addr          string          `json:"addr"`
	Users         int             `json:"users"`
	Hot           float64         `json:"hot"`
	Concurrency   int             `json:"concurrency"`
	IdleS         float64         `json:"idle_s"`
	IdleRate      float64         `json:"idle_rate"`
	PeakRate      float64         `json:"peak_rate"`
	PeakS         float64         `json:"peak_s"`
	EnvoyTimeout  float64         `json:"envoy_timeout_ms"`
	Idle          stepRowResult   `json:"idle"`
	Rows          []stepRowResult `json:"rows"`
	FirstSecond   stepRowResult   `json:"first_second"`
	Steady        stepRowResult   `json:"steady"`
	Peak          stepRowResult   `json:"peak"`
	FirstError    string          `json:"first_error,omitempty"`
	Metrics       []stepScrape    `json:"metrics,omitempty"`
	NoneSlow      bool            `json:"goal_none_slow"`
	FirstP99Ratio float64         `json:"first_second_p99_over_steady"`
	RatioMet      bool            `json:"goal_first_p99_within_3x"`
}

func runStep(ctx context.Context, e env, o stepOptions) error {
	if err := o.validate(); err != nil {
		return err
	}
	o.load.duration = o.idle + o.peak
	newCall, closeCalls, err := newCallers(ctx, o.load)
	if err != nil {
		return err
	}
	defer closeCalls()
	probe, err := newCostProbe(ctx, o.load)
	if err != nil {
		return err
	}
	defer probe.close()

	nRows := int((o.peak + o.bucket - 1) / o.bucket)
	rows := make([]stepRow, nRows+1) // rows[0]: the idle period
	samples := make([]stepSample, nRows+1)
	var firstErr atomic.Pointer[error]
	start := time.Now().Add(10 * time.Millisecond)
	sched := newStepSchedule(o, start)
	step := start.Add(o.idle)
	rowOf := func(due time.Time) *stepRow {
		if due.Before(step) {
			return &rows[0]
		}
		return &rows[min(1+int(due.Sub(step)/o.bucket), nRows)]
	}

	idleSample := probe.sample(ctx)
	sampleDone := make(chan struct{})
	go func() {
		defer close(sampleDone)
		for i := range samples {
			if !sleepUntil(ctx, step.Add(time.Duration(i)*o.bucket)) {
				return
			}
			samples[i] = probe.sample(ctx)
		}
	}()

	var scrapes []stepScrape
	scrapeDone := make(chan struct{})
	go func() {
		defer close(scrapeDone)
		if o.metricsURL == "" {
			return
		}
		for _, at := range []time.Duration{-o.idle, 0, min(time.Second, o.peak), o.peak} {
			if !sleepUntil(ctx, step.Add(at)) {
				return
			}
			if v, err := scrapeMetrics(ctx, o.metricsURL); err == nil {
				scrapes = append(scrapes, stepScrape{AtMS: ms(at), Values: v})
			}
		}
	}()

	var next atomic.Int64
	var wg sync.WaitGroup
	for i := range o.load.concurrency {
		call := newCall(i)
		rng := rand.New(rand.NewPCG(uint64(start.UnixNano()), uint64(i)))
		wk := benchWorkerRun{o: o.load, rng: rng}
		wg.Go(func() {
			for ctx.Err() == nil {
				due, ok := sched.due(next.Add(1) - 1)
				if !ok {
					return
				}
				sent := due
				if late := time.Now(); late.Before(due) {
					if !sleepUntil(ctx, due) {
						return
					}
					sent = time.Now() // the timer's own lateness is not the server's
				}
				cctx, cancel := context.WithTimeout(ctx, o.load.timeout)
				allowed, err := call(cctx, wk.pickUser())
				cancel()
				if err != nil && ctx.Err() != nil {
					return
				}
				if err != nil {
					firstErr.CompareAndSwap(nil, &err)
				}
				rowOf(due).record(time.Since(sent), allowed, err, o.envoyTimeout)
			}
		})
	}
	wg.Wait()
	<-sampleDone
	<-scrapeDone
	if ctx.Err() != nil {
		return ctx.Err()
	}
	res := stepReport(o, rows, idleSample, samples)
	if p := firstErr.Load(); p != nil {
		res.FirstError = (*p).Error()
	}
	res.Metrics = scrapes
	b, err := json.Marshal(res)
	if err != nil {
		return fmt.Errorf("encode result: %w", err)
	}
	if o.jsonFile != "" {
		if err := os.WriteFile(o.jsonFile, append(b, '\n'), 0o644); err != nil {
			return fmt.Errorf("--json-file: %w", err)
		}
	}
	if o.load.json {
		if _, err := fmt.Fprintf(e.stdout, "%s\n", b); err != nil {
			return fmt.Errorf("write: %w", err)
		}
		return nil
	}
	return writeStepTable(e.stdout, res)
}

// sample reads the Redis and server counters now; ok is false when one
// could not be read (that row's figures are then left out).
func (p *costProbe) sample(ctx context.Context) stepSample {
	if len(p.pids) == 0 && len(p.rdbs) == 0 {
		return stepSample{}
	}
	var s costStats
	if err := p.read(ctx, &s); err != nil {
		return stepSample{}
	}
	return stepSample{ok: true, scripts: s.scripts, commands: s.commands, conns: s.conns, server: s.server}
}

// stepReport turns the rows' tallies and the samples at their edges into
// the result.
func stepReport(o stepOptions, rows []stepRow, idleSample stepSample, samples []stepSample) stepResult {
	res := stepResult{
		Addr: o.load.addr, Users: o.load.users, Hot: o.load.hot, Concurrency: o.load.concurrency,
		IdleS: o.idle.Seconds(), IdleRate: o.idleRate, PeakRate: o.idleRate * o.factor, PeakS: o.peak.Seconds(),
		EnvoyTimeout: ms(o.envoyTimeout),
	}
	res.Idle = rows[0].result(-o.idle, 0)
	o.costs(&res.Idle, idleSample, samples[0])
	var first, steady, peak stepRow
	for i := 1; i < len(rows); i++ {
		from := time.Duration(i-1) * o.bucket
		to := min(from+o.bucket, o.peak)
		r := rows[i].result(from, to)
		o.costs(&r, samples[i-1], samples[i])
		res.Rows = append(res.Rows, r)
		if from < time.Second {
			rows[i].mergeInto(&first)
		}
		if from >= o.steadyFrom {
			rows[i].mergeInto(&steady)
		}
		rows[i].mergeInto(&peak)
	}
	res.FirstSecond = first.result(0, min(time.Second, o.peak))
	res.Steady = steady.result(o.steadyFrom, o.peak)
	res.Peak = peak.result(0, o.peak)
	res.NoneSlow = res.Idle.Envoy403 == 0 && res.Peak.Envoy403 == 0
	if res.Steady.P99MS > 0 {
		res.FirstP99Ratio = res.FirstSecond.P99MS / res.Steady.P99MS
	}
	res.RatioMet = res.Steady.P99MS > 0 && res.FirstP99Ratio <= 3
	return res
}

// costs fills r's Redis and server figures from the samples at its edges,
// if both were read.
func (o stepOptions) costs(r *stepRowResult, from, to stepSample) {
	if !from.ok || !to.ok || r.Due == 0 {
		return
	}
	n := float64(r.Due)
	if o.load.redisAddr != "" {
		// Less the probe's own INFO, one per Redis and sample.
		sc := float64(to.scripts-from.scripts) / n
		cm := float64(to.commands-from.commands-int64(len(strings.Split(o.load.redisAddr, ",")))) / n
		conns := to.conns - from.conns
		r.ScriptsPerCheck, r.CommandsPerCheck, r.RedisConns = &sc, &cm, &conns
	}
	if len(o.load.serverPIDs) > 0 {
		cpu := ms(to.server - from.server)
		r.ServerCPUMS = &cpu
	}
}

// result is r's row over [from, to) after the step.
func (r *stepRow) result(from, to time.Duration) stepRowResult {
	return stepRowResult{
		FromMS: ms(from), ToMS: ms(to),
		Due: r.due, Answered: r.allowed + r.denied, Allowed: r.allowed, Denied: r.denied, Errors: r.errs,
		P50MS: ms(r.hist.quantile(0.5)), P99MS: ms(r.hist.quantile(0.99)), MaxMS: ms(r.hist.max),
		Slow: r.slow, Envoy403: r.slow + r.errs,
	}
}

func writeStepTable(w io.Writer, r stepResult) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(w, "step: %s, %d users, hot %.2f; %.0f/s for %.0fs, then %.0f/s (×%.0f) for %.0fs; up to %d in flight\n",
		r.Addr, r.Users, r.Hot, r.IdleRate, r.IdleS, r.PeakRate, r.PeakRate/r.IdleRate, r.PeakS, r.Concurrency)
	fmt.Fprintf(w, "slow: answered after %.0fms, Envoy's ext_authz timeout; 403: what Envoy then sends the buyer (failure_mode_allow off: slow + errors)\n",
		r.EnvoyTimeout)
	fmt.Fprintln(tw, "ms after step\tdue\tanswered\terrors\tp50 ms\tp99 ms\tmax ms\tslow\t403\tscripts/check\tcmds/check\tredis dials\tserver cpu ms\t")
	row := func(name string, x stepRowResult) {
		opt := func(p *float64, f string) string {
			if p == nil {
				return "-"
			}
			return fmt.Sprintf(f, *p)
		}
		dials := "-"
		if x.RedisConns != nil {
			dials = fmt.Sprint(*x.RedisConns)
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%.2f\t%.2f\t%.2f\t%d\t%d\t%s\t%s\t%s\t%s\t\n", name, x.Due, x.Answered, x.Errors,
			x.P50MS, x.P99MS, x.MaxMS, x.Slow, x.Envoy403,
			opt(x.ScriptsPerCheck, "%.3f"), opt(x.CommandsPerCheck, "%.2f"), dials, opt(x.ServerCPUMS, "%.0f"))
	}
	row("idle", r.Idle)
	for _, x := range r.Rows {
		row(fmt.Sprintf("%.0f-%.0f", x.FromMS, x.ToMS), x)
	}
	row("first second", r.FirstSecond)
	row(fmt.Sprintf("steady %.0f-%.0f", r.Steady.FromMS, r.Steady.ToMS), r.Steady)
	row("whole peak", r.Peak)
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("write: %w", err)
	}
	yes := map[bool]string{true: "met", false: "missed"}
	fmt.Fprintf(w, "goal: no check slower than %.0fms: %s (%d slow, %d errors); first second's p99 %.2fms = %.2f × the steady %.2fms (within 3×): %s\n",
		r.EnvoyTimeout, yes[r.NoneSlow], r.Idle.Slow+r.Peak.Slow, r.Idle.Errors+r.Peak.Errors,
		r.FirstSecond.P99MS, r.FirstP99Ratio, r.Steady.P99MS, yes[r.RatioMet])
	for _, m := range r.Metrics {
		fmt.Fprintf(w, "server at %+.0fms:", m.AtMS)
		for _, name := range stepMetrics {
			if v, ok := m.Values[name]; ok {
				fmt.Fprintf(w, " %s %g", name, v)
			}
		}
		fmt.Fprintln(w)
	}
	if r.FirstError != "" {
		fmt.Fprintf(w, "first error: %s\n", r.FirstError)
	}
	return nil
}

// stepMetrics are the server's series (summed over their labels) that the
// step reads from --metrics-url: the failure mode's decisions and the
// backend's errors show a Redis that fell behind, the GC cycles and
// goroutines the Go runtime's part in the step.
var stepMetrics = []string{
	"flashgate_failure_mode_decisions_total", "flashgate_backend_errors_total",
	"go_gc_duration_seconds_count", "go_goroutines", "flashgate_redis_budget_seconds",
}

// stepScrape is the server's stepMetrics at one moment (ms after the step).
type stepScrape struct {
	AtMS   float64            `json:"at_ms"`
	Values map[string]float64 `json:"values"`
}

// scrapeMetrics reads the stepMetrics out of the Prometheus text at url.
func scrapeMetrics(ctx context.Context, url string) (map[string]float64, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, fmt.Errorf("--metrics-url: %w", err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("--metrics-url: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("--metrics-url: %s", resp.Status)
	}
	vals := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		for _, name := range stepMetrics {
			rest, ok := strings.CutPrefix(line, name)
			if !ok || rest == "" || (rest[0] != ' ' && rest[0] != '{') {
				continue
			}
			f := strings.Fields(rest[strings.LastIndexByte(rest, '}')+1:])
			if len(f) == 0 {
				continue
			}
			if v, err := strconv.ParseFloat(f[0], 64); err == nil {
				vals[name] += v
			}
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("--metrics-url: %w", err)
	}
	return vals, nil
}
