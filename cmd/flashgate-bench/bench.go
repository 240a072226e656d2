package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/netip"
	"os"
	"runtime/pprof"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/flashgate/flashgate/internal/checkreq"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"golang.org/x/term"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

type benchOptions struct {
	addr        string
	duration    time.Duration
	concurrency int
	connections int
	users       int
	hot         float64
	path        string
	method      string
	ip          string
	rate        float64
	timeout     time.Duration
	json        bool
	quiet       bool
	cpuProfile  string
	shape       string
	serverPIDs  []int
	redisAddr   string
	api         string // authz, rls or http
	domain      string // --api rls: the request's domain
	descKey     string // --api rls: the descriptor entry's key
	tls         checkreq.TLS
}

// prebuildMax is the largest --users for which every user's request
// (CheckRequest, or RateLimitRequest with --api rls) is encoded once up front
// (about 250 bytes each); above it, workers encode each request into a
// reused buffer.
const prebuildMax = 200_000

// newBenchCmd returns the load generator's command (flashgate-bench's root).
func newBenchCmd(e env) *cobra.Command {
	var o benchOptions
	cmd := &cobra.Command{
		Use:   "flashgate-bench --addr A --duration D --concurrency N --users N --hot F [--path P] [--api authz|rls|http [--domain D] [--descriptor-key K[,K...]]] [--json]",
		Short: "Load-test a running ext_authz (or rate limit service) server",
		Long: `flashgate-bench sends ext_authz Check requests (or, with --api rls, the rate
limit service's ShouldRateLimit requests; with --api http, requests to
serve's HTTP front-end) to a running server from --concurrency workers for
--duration, and reports throughput, allowed/denied/errors and the latency
distribution (p50/p90/p99/p99.9/max, measured in log buckets to within
1.6%).

Each request is one of --users distinct users', drawn uniformly, except that
a fraction --hot of all requests comes from one abusive user (uid u0000000).
A Check carries the user's x-uid and x-device-fp headers, and each user has
its own client IP (10.0.0.0/8) unless --ip sets one for all. A
ShouldRateLimit (--api rls) carries one descriptor per --descriptor-key,
each with the user's uid as its value. Over HTTP (--api http, as Envoy's
http_service asks: the request itself, --method and --path, its headers
as a Check's) each worker keeps one HTTP/1.1 keep-alive connection
(--connections does not apply), the user's IP travels in X-Forwarded-For
(the peer is the load generator), and 2xx counts as allowed, 400, 431 and
5xx as errors, any other status as denied. With --rate, workers pace
themselves to that total rate, and a late request's latency counts from when
it should have been sent. --addr may name a fleet of servers (comma-separated):
the workers spread over them, worker i calling server i mod their number,
and --server-pid then takes their PIDs, to report the fleet's CPU time per
check.

Progress goes to stderr: a redrawn line on a terminal, a line per second
otherwise (--quiet: none). The result goes to stdout: a table, or one JSON
object with --json.

flashgate-bench noop-server serves the reference it compares flashgate serve
with: an ext_authz server on serve's gRPC settings that admits everything;
noop-http-server the one of --api http: an HTTP server on the settings of
serve's HTTP front-end that answers 200 to everything.`,
		Example: `  flashgate-bench --addr 127.0.0.1:9191 --duration 10s --concurrency 32 --users 100000 --hot 0.9 --json`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runBench(cmd.Context(), e, o)
		},
	}
	f := cmd.Flags()
	addLoadFlags(f, &o, 16)
	f.DurationVar(&o.duration, "duration", 10*time.Second, "how long to send requests")
	f.Float64Var(&o.rate, "rate", 0, "total requests per second to pace to (0: as fast as possible)")
	f.BoolVar(&o.quiet, "quiet", false, "no progress display")
	f.StringVar(&o.cpuProfile, "cpuprofile", "", "write the load generator's own CPU profile to this file")
	return cmd
}

// addLoadFlags registers on f the flags of what is sent, where and how,
// shared by the load generator and its step command; concurrency is
// --concurrency's default.
func addLoadFlags(f *pflag.FlagSet, o *benchOptions, concurrency int) {
	f.StringVar(&o.addr, "addr", "127.0.0.1:9191", "the server's gRPC address (host:port or unix:///path; a fleet of servers: their addresses comma-separated, worker i calling server i mod their number, each on --connections of its own); with --api http its HTTP front-end's (also http://host:port)")
	f.IntVar(&o.concurrency, "concurrency", concurrency, "number of workers, each with one call in flight")
	f.IntVar(&o.connections, "connections", 2, "number of HTTP/2 connections the workers share (gRPC; over --api http each worker has its own)")
	f.IntVar(&o.users, "users", 1000, "number of distinct users (x-uid, x-device-fp)")
	f.Float64Var(&o.hot, "hot", 0, "fraction of requests from one abusive user, 0 to 1")
	f.StringVar(&o.path, "path", "/api/coupon/1", "request path")
	f.StringVar(&o.method, "method", "POST", "request method")
	f.StringVar(&o.ip, "ip", "", "client IP of every request (default: one per user)")
	f.DurationVar(&o.timeout, "timeout", time.Second, "deadline of each call")
	f.BoolVar(&o.json, "json", false, "print the result as one JSON object")
	f.StringVar(&o.shape, "shape", "minimal", "requests: minimal (the rule headers and a user agent) or envoy (what Envoy really sends: pseudo-headers, x-request-id, x-forwarded-*, a 1 KB cookie, ~20 headers, context_extensions)")
	f.IntSliceVar(&o.serverPIDs, "server-pid", nil, "PID of the server under test: report its CPU time per check (Linux /proc); a fleet's PIDs comma-separated: their sum")
	f.StringVar(&o.redisAddr, "redis-addr", "", "the server's Redis (a Cluster: every master, comma-separated; the figures are their sum): report Redis's CPU time, commands and script calls (EVALSHA + EVAL, the fleet heartbeat's one a second per sidecar included) per check (INFO)")
	f.StringVar(&o.api, "api", "authz", "what to call: authz (ext_authz Check), rls (the rate limit service's ShouldRateLimit, as Envoy's ratelimit filter does: --domain, one descriptor --descriptor-key=<the user's uid>; --shape, --path, --method and --ip do not apply) or http (serve's HTTP front-end, --http-authz-addr, as Envoy's http_service asks it)")
	f.StringVar(&o.domain, "domain", "flashsale", "--api rls: the request's domain")
	o.tls.AddFlags(f)
	f.StringVar(&o.descKey, "descriptor-key", "uid", "--api rls: the key of the descriptor's one entry, whose value is the user's uid (u0000000 ...); a comma-separated list sends one such descriptor per key (e.g. uid,device,ip: three limits per request, each per user)")
}

func (o benchOptions) validate() error {
	switch o.api {
	case "authz", "http":
	case "rls":
		if o.shape != "minimal" {
			return errors.New("--shape applies to --api authz only: a rate limit request is its descriptors")
		}
		if o.domain == "" || slices.Contains(strings.Split(o.descKey, ","), "") {
			return errors.New("--api rls: --domain and the keys of --descriptor-key must not be empty")
		}
	default:
		return fmt.Errorf("--api %q: want authz, rls or http", o.api)
	}
	if o.api == "http" && o.tls != (checkreq.TLS{}) {
		return errors.New("--tls flags apply to gRPC (--api authz, rls) only")
	}
	if o.shape != "minimal" && o.shape != "envoy" {
		return fmt.Errorf("--shape %q: want minimal or envoy", o.shape)
	}
	for _, pid := range o.serverPIDs {
		if pid <= 0 {
			return fmt.Errorf("--server-pid %d: must be positive", pid)
		}
	}
	if o.api == "http" && strings.Contains(o.addr, ",") {
		return errors.New("--addr: a fleet of servers applies to gRPC (--api authz, rls) only")
	}
	switch {
	case o.duration <= 0:
		return fmt.Errorf("--duration %s: must be positive", o.duration)
	case o.concurrency < 1:
		return fmt.Errorf("--concurrency %d: must be at least 1", o.concurrency)
	case o.connections < 1:
		return fmt.Errorf("--connections %d: must be at least 1", o.connections)
	case o.users < 1 || o.users > 1<<24-2:
		return fmt.Errorf("--users %d: must be 1 to %d", o.users, 1<<24-2)
	case !(o.hot >= 0 && o.hot <= 1):
		return fmt.Errorf("--hot %g: must be a fraction from 0 to 1", o.hot)
	case !(o.rate >= 0):
		return fmt.Errorf("--rate %g: must not be negative", o.rate)
	case o.timeout <= 0:
		return fmt.Errorf("--timeout %s: must be positive", o.timeout)
	case !strings.HasPrefix(o.path, "/"):
		return fmt.Errorf("--path %q: must start with /", o.path)
	}
	return nil
}

// benchResult is the outcome of a run, as printed by bench --json.
type benchResult struct {
	Addr         string            `json:"addr"`
	Path         string            `json:"path"`
	Concurrency  int               `json:"concurrency"`
	Connections  int               `json:"connections"`
	Users        int               `json:"users"`
	Hot          float64           `json:"hot"`
	Rate         float64           `json:"rate,omitempty"`
	DurationS    float64           `json:"duration_s"` // measured
	Requests     uint64            `json:"requests"`   // allowed + denied + errors
	Throughput   float64           `json:"throughput"` // requests per second
	Allowed      uint64            `json:"allowed"`
	Denied       uint64            `json:"denied"`
	Errors       uint64            `json:"errors"`
	ErrorsByCode map[string]uint64 `json:"errors_by_code,omitempty"`
	FirstError   string            `json:"first_error,omitempty"`
	// LatencyMS of the answered calls (allowed and denied), in milliseconds.
	LatencyMS benchLatency `json:"latency_ms"`
	// ClientCPUS is the CPU time (user + system) bench itself used during
	// the run: on a machine it shares with the server, what the load cost.
	ClientCPUS float64 `json:"client_cpu_s,omitempty"`
	// Shape is the request shape (--shape).
	Shape string `json:"shape"`
	// API is what was called (--api): authz, rls or http.
	API string `json:"api"`
	// The server's and Redis's CPU time over the run, and Redis's script
	// calls, with --server-pid and --redis-addr; per check below.
	ServerCPUS          float64 `json:"server_cpu_s,omitempty"`
	ServerCPUPerCheck   float64 `json:"server_cpu_us_per_check,omitempty"`
	RedisCPUS           float64 `json:"redis_cpu_s,omitempty"`
	RedisCPUPerCheck    float64 `json:"redis_cpu_us_per_check,omitempty"`
	ScriptCalls         int64   `json:"redis_script_calls,omitempty"`
	ScriptCallsPerCheck float64 `json:"redis_script_calls_per_check,omitempty"`
	// RedisCommands counts every command Redis processed
	// (total_commands_processed: a script call and each command it runs,
	// each command of a pipeline).
	RedisCommands         int64   `json:"redis_commands,omitempty"`
	RedisCommandsPerCheck float64 `json:"redis_commands_per_check,omitempty"`
}

type benchLatency struct {
	P50  float64 `json:"p50"`
	P90  float64 `json:"p90"`
	P99  float64 `json:"p99"`
	P999 float64 `json:"p99_9"`
	Max  float64 `json:"max"`
}

// benchWorker is one worker's tallies. The counters are read live by the
// progress display; the rest only after the worker has finished.
type benchWorker struct {
	allowed, denied, errors atomic.Uint64
	_                       [40]byte // keep workers' counters on separate cache lines

	hist     histogram
	byCode   map[string]uint64 // by gRPC code, or HTTP status over --api http
	firstErr error
}

// userRequests encodes the CheckRequest of each user.
type userRequests struct {
	o      benchOptions
	fixed  netip.Addr // --ip, or invalid for one IP per user
	tmpl   *authv3.CheckRequest
	rls    *rlsv3.RateLimitRequest // --api rls: the template instead of tmpl
	marsh  proto.MarshalOptions
	encBuf []byte
}

func newUserRequests(o benchOptions) (*userRequests, error) {
	u := &userRequests{o: o}
	if o.api == "rls" {
		u.rls = &rlsv3.RateLimitRequest{Domain: o.domain}
		for _, k := range strings.Split(o.descKey, ",") {
			u.rls.Descriptors = append(u.rls.Descriptors, &ratelimitv3.RateLimitDescriptor{
				Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: k}},
			})
		}
		return u, nil
	}
	if o.ip != "" {
		ip, err := checkreq.ParseIP(o.ip)
		if err != nil {
			return nil, err
		}
		u.fixed = ip
	}
	u.tmpl = checkreq.Build(requestSpec(o))
	return u, nil
}

// requestSpec describes the request of --shape, --method and --path, its
// per-user values (x-uid, x-device-fp, the IP) left empty.
func requestSpec(o benchOptions) checkreq.Spec {
	spec := checkreq.Spec{
		Method: strings.ToUpper(o.method), Path: o.path, Host: "localhost", Scheme: "http",
		Headers: map[string]string{"x-uid": "", "x-device-fp": "", "user-agent": "flashgate-bench"},
		IP:      netip.IPv4Unspecified(),
	}
	if o.shape == "envoy" {
		spec = envoyShaped(spec)
	}
	return spec
}

// userIP returns user i's client IP: --ip, or one of 10.0.0.0/8 per user.
func userIP(fixed netip.Addr, i int) netip.Addr {
	if fixed.IsValid() {
		return fixed
	}
	n := i + 1
	return netip.AddrFrom4([4]byte{10, byte(n >> 16), byte(n >> 8), byte(n)})
}

// clone returns an encoder with its own template, for one worker.
func (u *userRequests) clone() *userRequests {
	if u.rls != nil {
		return &userRequests{o: u.o, rls: proto.Clone(u.rls).(*rlsv3.RateLimitRequest), marsh: u.marsh}
	}
	return &userRequests{o: u.o, fixed: u.fixed, tmpl: proto.Clone(u.tmpl).(*authv3.CheckRequest), marsh: u.marsh}
}

// encode returns user i's request in wire form, in a buffer reused by the
// next call.
func (u *userRequests) encode(i int) ([]byte, error) {
	if u.rls != nil {
		uid := fmt.Sprintf("u%07d", i)
		for _, d := range u.rls.Descriptors {
			d.Entries[0].Value = uid
		}
		b, err := u.marsh.MarshalAppend(u.encBuf[:0], u.rls)
		if err != nil {
			return nil, fmt.Errorf("encode request of user %d: %w", i, err)
		}
		u.encBuf = b
		return b, nil
	}
	h := u.tmpl.Attributes.Request.Http.Headers
	h["x-uid"] = fmt.Sprintf("u%07d", i)
	h["x-device-fp"] = fmt.Sprintf("fp%07d", i)
	ip := userIP(u.fixed, i)
	u.tmpl.Attributes.Source.Address.GetSocketAddress().Address = ip.String()
	if _, ok := h["x-forwarded-for"]; ok {
		h["x-forwarded-for"] = ip.String()
		h["x-envoy-external-address"] = ip.String()
	}
	b, err := u.marsh.MarshalAppend(u.encBuf[:0], u.tmpl)
	if err != nil {
		return nil, fmt.Errorf("encode request of user %d: %w", i, err)
	}
	u.encBuf = b
	return b, nil
}

func runBench(ctx context.Context, e env, o benchOptions) error {
	if err := o.validate(); err != nil {
		return err
	}
	newCall, closeCalls, err := newCallers(ctx, o)
	if err != nil {
		return err
	}
	defer closeCalls()

	if o.cpuProfile != "" {
		f, err := os.Create(o.cpuProfile)
		if err != nil {
			return fmt.Errorf("--cpuprofile: %w", err)
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return fmt.Errorf("--cpuprofile: %w", err)
		}
		defer pprof.StopCPUProfile()
	}

	workers := make([]*benchWorker, o.concurrency)
	for i := range workers {
		workers[i] = &benchWorker{byCode: map[string]uint64{}}
	}
	progressDone := make(chan struct{})
	var progressWG sync.WaitGroup
	if !o.quiet {
		progressWG.Add(1)
		go func() {
			defer progressWG.Done()
			showProgress(e.stderr, o.duration, workers, progressDone)
		}()
	}

	probe, err := newCostProbe(ctx, o)
	if err != nil {
		return err
	}
	defer probe.close()
	if err := probe.before(ctx); err != nil {
		return err
	}
	cpu0, cpuOK := processCPU()
	start := time.Now()
	end := start.Add(o.duration)
	var wg sync.WaitGroup
	for i, w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			wk := benchWorkerRun{
				o: o, w: w, call: newCall(i), rng: rand.New(rand.NewPCG(uint64(start.UnixNano()), uint64(i))),
			}
			if o.rate > 0 {
				wk.interval = time.Duration(float64(o.concurrency) / o.rate * float64(time.Second))
				// Spread the workers' first sends over one interval.
				wk.next = start.Add(wk.interval * time.Duration(i) / time.Duration(o.concurrency))
			}
			wk.run(ctx, end)
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	close(progressDone)
	progressWG.Wait()

	cpu1, ok := processCPU()
	if err := probe.after(ctx); err != nil {
		return err
	}
	res := summarize(o, workers, elapsed)
	if cpuOK && ok {
		res.ClientCPUS = (cpu1 - cpu0).Seconds()
	}
	probe.report(&res)
	if o.json {
		b, err := json.Marshal(res)
		if err != nil {
			return fmt.Errorf("encode result: %w", err)
		}
		_, err = fmt.Fprintf(e.stdout, "%s\n", b)
		if err != nil {
			return fmt.Errorf("write: %w", err)
		}
		return nil
	}
	return writeBenchTable(e.stdout, res)
}

// newCallers connects to the server under test (and checks that it
// answers) and returns what makes worker i's caller, and what closes the
// connections once every worker has finished.
func newCallers(ctx context.Context, o benchOptions) (func(i int) callFunc, func(), error) {
	if o.api == "http" {
		hc, err := newHTTPCaller(ctx, o)
		if err != nil {
			return nil, nil, err
		}
		return func(int) callFunc { return hc.call }, hc.client.CloseIdleConnections, nil
	}
	enc, err := newUserRequests(o)
	if err != nil {
		return nil, nil, err
	}
	var prebuilt []rawMessage
	if o.users <= prebuildMax {
		prebuilt = make([]rawMessage, o.users)
		for i := range prebuilt {
			b, err := enc.encode(i)
			if err != nil {
				return nil, nil, err
			}
			prebuilt[i] = rawMessage(append([]byte(nil), b...))
		}
	}
	addrs := strings.Split(o.addr, ",")
	// conns[j*len(addrs)+a] is server a's connection j.
	var conns []*grpc.ClientConn
	closeAll := func() {
		for _, c := range conns {
			c.Close()
		}
	}
	for range o.connections {
		for _, addr := range addrs {
			creds, err := o.tls.DialOptions(addr)
			if err != nil {
				closeAll()
				return nil, nil, err
			}
			c, err := checkreq.Dial(addr, creds...)
			if err != nil {
				closeAll()
				return nil, nil, err
			}
			conns = append(conns, c)
		}
	}
	if err := warmUp(ctx, conns, o.timeout); err != nil {
		closeAll()
		return nil, nil, err
	}
	return func(i int) callFunc {
		// Worker i calls server i mod len(addrs), on one of its connections.
		return newGRPCCaller(o, conns[i%len(conns)], prebuilt, enc.clone()).call
	}, closeAll, nil
}

// warmUp connects every connection (with a health check, which no rate
// limit counts) so that connection set-up is not measured and an unreachable
// server is reported at once rather than as a run full of errors.
func warmUp(ctx context.Context, conns []*grpc.ClientConn, timeout time.Duration) error {
	for _, c := range conns {
		cctx, cancel := context.WithTimeout(ctx, max(timeout, time.Second))
		_, err := healthpb.NewHealthClient(c).Check(cctx, &healthpb.HealthCheckRequest{})
		cancel()
		if err != nil && status.Code(err) != codes.Unimplemented && status.Code(err) != codes.NotFound {
			return fmt.Errorf("cannot reach %s: %w", c.Target(), err)
		}
	}
	return nil
}

// callFunc sends one request of user to the server under test and reports
// whether it was allowed; an error is a failed call (or an answer outside
// the contract), not a denial. One worker calls it, one call at a time.
type callFunc func(ctx context.Context, user int) (allowed bool, err error)

// grpcCaller is one worker's caller of ext_authz Check or, with --api rls,
// ShouldRateLimit, sending pre-encoded requests through rawCodec.
type grpcCaller struct {
	conn     *grpc.ClientConn
	method   string
	opts     []grpc.CallOption
	prebuilt []rawMessage
	enc      *userRequests
	req      rawMessage
	answer   checkAnswer
}

func newGRPCCaller(o benchOptions, conn *grpc.ClientConn, prebuilt []rawMessage, enc *userRequests) *grpcCaller {
	c := &grpcCaller{
		conn: conn, prebuilt: prebuilt, enc: enc,
		method: "/envoy.service.auth.v3.Authorization/Check",
		opts:   []grpc.CallOption{grpc.ForceCodecV2(rawCodec{})},
		answer: checkAnswer{rls: o.api == "rls"},
	}
	if c.answer.rls {
		c.method = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
	}
	return c
}

func (c *grpcCaller) call(ctx context.Context, user int) (bool, error) {
	if c.prebuilt != nil {
		c.req = c.prebuilt[user]
	} else {
		b, err := c.enc.encode(user)
		if err != nil {
			return false, err
		}
		c.req = b
	}
	if err := c.conn.Invoke(ctx, c.method, &c.req, &c.answer, c.opts...); err != nil {
		return false, err
	}
	if c.answer.rls && c.answer.code != rlsOK && c.answer.code != rlsOverLimit {
		return false, fmt.Errorf("RateLimitResponse.overall_code %d: want OK or OVER_LIMIT", c.answer.code)
	}
	return c.answer.allowed(), nil
}

// benchWorkerRun is one worker's loop state.
type benchWorkerRun struct {
	o        benchOptions
	w        *benchWorker
	call     callFunc
	rng      *rand.Rand
	interval time.Duration // between sends with --rate; 0 for none
	next     time.Time     // when the next send is due with --rate
}

func (wk *benchWorkerRun) run(ctx context.Context, end time.Time) {
	behind := false // with --rate: the previous call ended after this one was due
	for ctx.Err() == nil {
		sent := time.Now()
		if wk.interval > 0 {
			if wk.next.After(sent) {
				if !sleepUntil(ctx, wk.next) {
					return
				}
				sent = time.Now()
			}
			if behind {
				sent = wk.next // count the wait a paced client would have seen
			}
		}
		if !sent.Before(end) {
			return
		}
		cctx, cancel := context.WithTimeout(ctx, wk.o.timeout)
		allowed, err := wk.call(cctx, wk.pickUser())
		cancel()
		done := time.Now()
		if wk.interval > 0 {
			wk.next = wk.next.Add(wk.interval)
			behind = done.After(wk.next)
		}
		if err != nil {
			if ctx.Err() != nil {
				return // interrupted: not the server's fault
			}
			wk.fail(err)
			continue
		}
		wk.w.hist.record(done.Sub(sent))
		if allowed {
			wk.w.allowed.Add(1)
		} else {
			wk.w.denied.Add(1)
		}
	}
}

func (wk *benchWorkerRun) fail(err error) {
	wk.w.errors.Add(1)
	wk.w.byCode[errorKind(err)]++
	if wk.w.firstErr == nil {
		wk.w.firstErr = err
	}
}

// pickUser draws the user of the next request: user 0 with probability
// --hot, else any of the --users uniformly.
func (wk *benchWorkerRun) pickUser() int {
	if wk.o.hot > 0 && wk.rng.Float64() < wk.o.hot {
		return 0
	}
	return wk.rng.IntN(wk.o.users)
}

// sleepUntil sleeps until t; it reports false if ctx ended first.
func sleepUntil(ctx context.Context, t time.Time) bool {
	d := time.Until(t)
	if d <= 0 {
		return true
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return true
	case <-ctx.Done():
		return false
	}
}

func summarize(o benchOptions, workers []*benchWorker, elapsed time.Duration) benchResult {
	res := benchResult{
		Addr: o.addr, Path: o.path, Concurrency: o.concurrency, Connections: o.connections,
		Users: o.users, Hot: o.hot, Rate: o.rate, DurationS: elapsed.Seconds(), Shape: o.shape, API: o.api,
	}
	var h histogram
	for _, w := range workers {
		res.Allowed += w.allowed.Load()
		res.Denied += w.denied.Load()
		res.Errors += w.errors.Load()
		h.merge(&w.hist)
		for c, n := range w.byCode {
			if res.ErrorsByCode == nil {
				res.ErrorsByCode = map[string]uint64{}
			}
			res.ErrorsByCode[c] += n
		}
		if w.firstErr != nil && res.FirstError == "" {
			res.FirstError = w.firstErr.Error()
		}
	}
	res.Requests = res.Allowed + res.Denied + res.Errors
	if elapsed > 0 {
		res.Throughput = float64(res.Requests) / elapsed.Seconds()
	}
	res.LatencyMS = benchLatency{
		P50: ms(h.quantile(0.50)), P90: ms(h.quantile(0.90)), P99: ms(h.quantile(0.99)),
		P999: ms(h.quantile(0.999)), Max: ms(h.max),
	}
	return res
}

func writeBenchTable(w io.Writer, r benchResult) error {
	pct := func(n uint64) string {
		if r.Requests == 0 {
			return ""
		}
		return fmt.Sprintf("(%.1f%%)", 100*float64(n)/float64(r.Requests))
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	switch r.API {
	case "rls":
		fmt.Fprintf(tw, "target\t%s ShouldRateLimit\n", r.Addr)
	case "http":
		fmt.Fprintf(tw, "target\t%s %s over HTTP (%s requests)\n", r.Addr, r.Path, r.Shape)
	default:
		fmt.Fprintf(tw, "target\t%s %s (%s requests)\n", r.Addr, r.Path, r.Shape)
	}
	fmt.Fprintf(tw, "load\t%d workers on %d connections, %d users, hot %.2f", r.Concurrency, r.Connections, r.Users, r.Hot)
	if r.Rate > 0 {
		fmt.Fprintf(tw, ", paced to %.0f/s", r.Rate)
	}
	fmt.Fprintf(tw, "\n")
	fmt.Fprintf(tw, "duration\t%.2fs\n", r.DurationS)
	fmt.Fprintf(tw, "requests\t%d\n", r.Requests)
	fmt.Fprintf(tw, "throughput\t%.1f/s\n", r.Throughput)
	fmt.Fprintf(tw, "allowed\t%d\t%s\n", r.Allowed, pct(r.Allowed))
	fmt.Fprintf(tw, "denied\t%d\t%s\n", r.Denied, pct(r.Denied))
	fmt.Fprintf(tw, "errors\t%d\t%s\n", r.Errors, pct(r.Errors))
	l := r.LatencyMS
	fmt.Fprintf(tw, "latency\tp50 %.3fms  p90 %.3fms  p99 %.3fms  p99.9 %.3fms  max %.3fms\n", l.P50, l.P90, l.P99, l.P999, l.Max)
	if r.ClientCPUS > 0 && r.Requests > 0 {
		fmt.Fprintf(tw, "client CPU\t%.2fs (%.1f µs per request)\n", r.ClientCPUS, r.ClientCPUS*1e6/float64(r.Requests))
	}
	if r.ServerCPUS > 0 {
		fmt.Fprintf(tw, "server CPU\t%.2fs (%.1f µs per check)\n", r.ServerCPUS, r.ServerCPUPerCheck)
	}
	if r.RedisCPUS > 0 || r.ScriptCalls > 0 {
		fmt.Fprintf(tw, "Redis CPU\t%.3fs (%.1f µs per check), %.3f script calls and %.3f commands per check\n", r.RedisCPUS, r.RedisCPUPerCheck, r.ScriptCallsPerCheck, r.RedisCommandsPerCheck)
	}
	if r.FirstError != "" {
		fmt.Fprintf(tw, "first error\t%s\n", r.FirstError)
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("write: %w", err)
	}
	return nil
}

// showProgress reports the workers' tallies on w until done is closed: a
// line redrawn in place five times a second on a terminal, else a line per
// second.
func showProgress(w io.Writer, total time.Duration, workers []*benchWorker, done <-chan struct{}) {
	tty := isTerminal(w)
	every := time.Second
	if tty {
		every = 200 * time.Millisecond
	}
	ticker := time.NewTicker(every)
	defer ticker.Stop()
	start := time.Now()
	var lastN uint64
	lastT := start
	for {
		select {
		case <-done:
			if tty {
				fmt.Fprint(w, "\r\x1b[K")
			}
			return
		case now := <-ticker.C:
			var a, d, errs uint64
			for _, wk := range workers {
				a += wk.allowed.Load()
				d += wk.denied.Load()
				errs += wk.errors.Load()
			}
			n := a + d + errs
			rate := float64(n-lastN) / now.Sub(lastT).Seconds()
			lastN, lastT = n, now
			line := fmt.Sprintf("bench %4.1fs/%s  %d requests  %.0f/s  allowed %d  denied %d  errors %d",
				now.Sub(start).Seconds(), total, n, rate, a, d, errs)
			if tty {
				fmt.Fprintf(w, "\r\x1b[K%s", line)
			} else {
				fmt.Fprintln(w, line)
			}
		}
	}
}

// isTerminal reports whether w is a terminal.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
