package e2e

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

var longFlag = flag.Bool("long", false, "run the long variants (1,000,000-user flood); also FLASHGATE_E2E_LONG=1")

// long reports whether the long, benchmark-sized variants should run.
func long() bool { return *longFlag || os.Getenv("FLASHGATE_E2E_LONG") == "1" }

// flashgateBin is the flashgate binary TestMain built.
var flashgateBin string

// startTimeout bounds how long a flashgate process may take to report
// SERVING (a -race binary on two busy cores is slow to start).
const startTimeout = 20 * time.Second

// maxCallMsg is the gRPC message size limit of the test clients: hostile
// requests carry megabytes of headers.
const maxCallMsg = 64 << 20

func TestMain(m *testing.M) {
	flag.Parse()
	os.Exit(testMain(m))
}

func testMain(m *testing.M) int {
	dir, err := os.MkdirTemp("", "flashgate-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	defer os.RemoveAll(dir)
	flashgateBin = filepath.Join(dir, "flashgate")
	args := []string{"build", "-o", flashgateBin}
	if raceEnabled {
		args = append(args, "-race")
	}
	args = append(args, "./cmd/flashgate")
	cmd := exec.Command("go", args...)
	cmd.Dir = ".." // the module root: this package is e2e/
	if out, err := cmd.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "e2e: FAIL: go %s (in the module root): %v\n%s\n", strings.Join(args, " "), err, out)
		return 1
	}
	return m.Run()
}

// syncBuffer is a bytes.Buffer safe for the process's two output streams
// and readers.
type syncBuffer struct {
	mu  sync.Mutex // guards buf
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// proc is one `flashgate serve` process.
type proc struct {
	t        testing.TB
	cmd      *exec.Cmd
	args     []string
	GRPCAddr string
	HTTPAddr string
	// HTTPAuthzAddr is the HTTP front-end's address (launchOpts.httpAuthz),
	// else "".
	HTTPAuthzAddr string
	out           *syncBuffer
	done          chan struct{} // closed when the process has exited
	exitCode      int           // valid once done is closed; -1 if killed by a signal

	conn   *grpc.ClientConn
	Auth   authv3.AuthorizationClient
	Health healthpb.HealthClient
}

// freeAddrs returns n distinct loopback addresses that were free a moment
// ago: all are held open until each is picked, so that the kernel does not
// hand the same port out twice. Another process may still take one before
// it is used; launchRetry starts again on new ones then. (It returns an
// error rather than failing t: startFleet calls it off the test goroutine.)
func freeAddrs(n int) ([]string, error) {
	addrs := make([]string, n)
	for i := range addrs {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("find a free port: %w", err)
		}
		defer l.Close()
		addrs[i] = l.Addr().String()
	}
	return addrs, nil
}

// startFlashgate runs `flashgate serve --grpc-addr A --http-addr B args...`
// on free loopback ports, waits until grpc.health.v1 Check answers SERVING,
// and kills it in cleanup. Its output is dumped when the test fails, and a
// data race or panic in it fails the test.
func startFlashgate(t testing.TB, args ...string) *proc {
	t.Helper()
	p, err := launchRetry(t, args)
	if err != nil {
		t.Fatalf("start flashgate serve %s: %v", strings.Join(args, " "), err)
	}
	return p
}

// launchOpts are the harness's own options of a serve process.
type launchOpts struct {
	// httpAuthz also serves the HTTP front-end, --http-authz-addr on a free
	// loopback port (proc.HTTPAuthzAddr).
	httpAuthz bool
	// clientTLS, when not nil, is the TLS of the test's gRPC connection,
	// for a serve with --grpc-tls-cert.
	clientTLS *tls.Config
	// ratelimitEnv, when not nil, runs the binary as a swap for
	// envoyproxy/ratelimit runs it: called ratelimit, with no arguments (args
	// must be empty), configured by these NAME=value variables of
	// ratelimit's alone (no FLASHGATE_ variable reaches it), the ports in
	// GRPC_PORT, DEBUG_PORT and PORT, on loopback.
	ratelimitEnv []string
}

// launchRetry launches serve, and again on new ports (up to 3 times) when
// a port it was given was taken in between (by a process launched at the
// same time, say).
func launchRetry(t testing.TB, args []string) (*proc, error) {
	return launchRetryWith(t, args, launchOpts{})
}

// launchRetryWith is launchRetry with lo.
func launchRetryWith(t testing.TB, args []string, lo launchOpts) (*proc, error) {
	var err error
	for attempt := 0; attempt < 3; attempt++ {
		var p *proc
		p, err = launch(t, args, lo)
		if err == nil {
			return p, nil
		}
		if !strings.Contains(err.Error(), "address already in use") {
			break
		}
	}
	return nil, err
}

func launch(t testing.TB, args []string, lo launchOpts) (*proc, error) {
	addrs, err := freeAddrs(3)
	if err != nil {
		return nil, err
	}
	p := &proc{
		t:        t,
		GRPCAddr: addrs[0],
		HTTPAddr: addrs[1],
		out:      &syncBuffer{},
		done:     make(chan struct{}),
	}
	p.args = []string{"serve", "--grpc-addr", p.GRPCAddr, "--http-addr", p.HTTPAddr}
	if lo.httpAuthz {
		p.HTTPAuthzAddr = addrs[2]
		p.args = append(p.args, "--http-authz-addr", p.HTTPAuthzAddr)
	}
	p.args = append(p.args, args...)
	p.cmd = exec.Command(flashgateBin, p.args...)
	p.cmd.Env = append(os.Environ(), "GORACE=halt_on_error=0")
	if lo.ratelimitEnv != nil {
		if len(args) > 0 {
			return nil, fmt.Errorf("ratelimit takes no arguments, got %q", args)
		}
		if p.cmd, err = ratelimitCmd(addrs, lo.ratelimitEnv); err != nil {
			return nil, err
		}
		p.args = append([]string{"ratelimit"}, lo.ratelimitEnv...)
	}
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	if err := p.cmd.Start(); err != nil {
		return nil, err
	}
	go func() {
		err := p.cmd.Wait()
		p.exitCode = 0
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			p.exitCode = ee.ExitCode()
		} else if err != nil {
			p.exitCode = -2
		}
		close(p.done)
	}()
	t.Cleanup(func() { p.cleanup() })

	creds := insecure.NewCredentials()
	if lo.clientTLS != nil {
		creds = credentials.NewTLS(lo.clientTLS)
	}
	conn, err := grpc.NewClient(p.GRPCAddr,
		grpc.WithTransportCredentials(creds),
		grpc.WithDefaultCallOptions(grpc.MaxCallSendMsgSize(maxCallMsg), grpc.MaxCallRecvMsgSize(maxCallMsg)))
	if err != nil {
		return nil, err
	}
	p.conn = conn
	p.Auth = authv3.NewAuthorizationClient(conn)
	p.Health = healthpb.NewHealthClient(conn)

	deadline := time.Now().Add(startTimeout)
	for {
		select {
		case <-p.done:
			return nil, fmt.Errorf("exited with code %d before SERVING; output:\n%s", p.exitCode, p.out.String())
		default:
		}
		st, err := p.healthStatus(500 * time.Millisecond)
		if err == nil && st == healthpb.HealthCheckResponse_SERVING {
			return p, nil
		}
		if time.Now().After(deadline) {
			p.kill()
			return nil, fmt.Errorf("not SERVING within %s (last: %v %v); output:\n%s", startTimeout, st, err, p.out.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// ratelimitCmd is the binary called ratelimit (a link to flashgateBin, as
// the image's /bin/ratelimit), listening on addrs (gRPC, debug, HTTP),
// with vars and the process's environment but its FLASHGATE_ variables.
func ratelimitCmd(addrs, vars []string) (*exec.Cmd, error) {
	bin := filepath.Join(filepath.Dir(flashgateBin), "ratelimit")
	if err := os.Symlink(flashgateBin, bin); err != nil && !errors.Is(err, os.ErrExist) {
		return nil, err
	}
	cmd := exec.Command(bin)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "FLASHGATE_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, "GORACE=halt_on_error=0")
	for i, name := range []string{"GRPC", "DEBUG", ""} {
		host, port, err := net.SplitHostPort(addrs[i])
		if err != nil {
			return nil, err
		}
		pre := name + "_"
		if name == "" {
			pre = ""
		}
		cmd.Env = append(cmd.Env, pre+"HOST="+host, pre+"PORT="+port)
	}
	cmd.Env = append(cmd.Env, vars...)
	return cmd, nil
}

func (p *proc) cleanup() {
	if p.conn != nil {
		p.conn.Close()
	}
	p.kill()
	out := p.out.String()
	if strings.Contains(out, "WARNING: DATA RACE") {
		p.t.Errorf("flashgate (%s) reported a data race", strings.Join(p.args, " "))
	}
	if strings.Contains(out, "panic: ") || strings.Contains(out, "fatal error: ") {
		p.t.Errorf("flashgate (%s) panicked", strings.Join(p.args, " "))
	}
	if p.t.Failed() {
		const max = 64 << 10
		if len(out) > max {
			out = "…" + out[len(out)-max:]
		}
		p.t.Logf("flashgate %s output:\n%s", strings.Join(p.args, " "), out)
	}
}

// kill sends SIGKILL unless the process has exited, and waits for it.
func (p *proc) kill() {
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Kill()
	<-p.done
}

// Pid returns the process id.
func (p *proc) Pid() int { return p.cmd.Process.Pid }

// Signal sends sig (syscall.SIGTERM, syscall.SIGHUP ...) to the process.
func (p *proc) Signal(sig os.Signal) {
	p.t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		p.t.Fatalf("signal %v to flashgate: %v", sig, err)
	}
}

// Wait waits up to timeout for the process to exit and returns its exit
// code; ok is false on timeout.
func (p *proc) Wait(timeout time.Duration) (code int, ok bool) {
	select {
	case <-p.done:
		return p.exitCode, true
	case <-time.After(timeout):
		return 0, false
	}
}

// Exited reports whether the process has exited.
func (p *proc) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Output returns everything the process wrote so far.
func (p *proc) Output() string { return p.out.String() }

// healthStatus calls grpc.health.v1 Check for the server as a whole ("").
func (p *proc) healthStatus(timeout time.Duration) (healthpb.HealthCheckResponse_ServingStatus, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	r, err := p.Health.Check(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		return healthpb.HealthCheckResponse_UNKNOWN, err
	}
	return r.GetStatus(), nil
}

// HealthStatus is healthStatus with a 2 s deadline.
func (p *proc) HealthStatus() (healthpb.HealthCheckResponse_ServingStatus, error) {
	return p.healthStatus(2 * time.Second)
}

var httpClient = &http.Client{Timeout: 5 * time.Second}

// get fetches http://HTTPAddr/path.
func (p *proc) get(path string) (int, []byte, error) {
	resp, err := httpClient.Get("http://" + p.HTTPAddr + path)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, err
}

// Readyz returns the HTTP status of /readyz.
func (p *proc) Readyz() (int, error) {
	code, _, err := p.get("/readyz")
	return code, err
}

// metrics scrapes and parses /metrics.
type metrics map[string]*dto.MetricFamily

// Metrics scrapes /metrics, failing the test when it cannot.
func (p *proc) Metrics() metrics {
	p.t.Helper()
	code, body, err := p.get("/metrics")
	if err != nil || code != http.StatusOK {
		p.t.Fatalf("GET /metrics: %d %v", code, err)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := parser.TextToMetricFamilies(bytes.NewReader(body))
	if err != nil {
		p.t.Fatalf("parse /metrics: %v\n%s", err, body)
	}
	return mfs
}

// Has reports whether the family name is exported.
func (m metrics) Has(name string) bool { _, ok := m[name]; return ok }

// Value sums the counters, gauges or untyped values (histogram or summary:
// the sample count) of family name whose labels include every pair of
// labels ("k", "v", ...). A missing family reads as 0.
func (m metrics) Value(name string, labels ...string) float64 {
	mf, ok := m[name]
	if !ok {
		return 0
	}
	var sum float64
next:
	for _, mt := range mf.GetMetric() {
		for i := 0; i+1 < len(labels); i += 2 {
			found := false
			for _, lp := range mt.GetLabel() {
				if lp.GetName() == labels[i] && lp.GetValue() == labels[i+1] {
					found = true
					break
				}
			}
			if !found {
				continue next
			}
		}
		switch {
		case mt.Counter != nil:
			sum += mt.GetCounter().GetValue()
		case mt.Gauge != nil:
			sum += mt.GetGauge().GetValue()
		case mt.Untyped != nil:
			sum += mt.GetUntyped().GetValue()
		case mt.Histogram != nil:
			sum += float64(mt.GetHistogram().GetSampleCount())
		case mt.Summary != nil:
			sum += float64(mt.GetSummary().GetSampleCount())
		}
	}
	return sum
}

// LabelValues returns every value label takes in family name.
func (m metrics) LabelValues(name, label string) []string {
	var out []string
	for _, mt := range m[name].GetMetric() {
		for _, lp := range mt.GetLabel() {
			if lp.GetName() == label {
				out = append(out, lp.GetValue())
			}
		}
	}
	return out
}

// RSS returns the process's resident set size in bytes (Linux
// /proc/PID/status VmRSS).
func (p *proc) RSS() (int64, error) {
	if runtime.GOOS != "linux" {
		return 0, errors.New("RSS needs /proc (Linux)")
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.Pid()))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			f := strings.Fields(rest)
			if len(f) >= 1 {
				kb, err := strconv.ParseInt(f[0], 10, 64)
				return kb << 10, err
			}
		}
	}
	return 0, errors.New("no VmRSS in /proc/PID/status")
}

// waitFor polls cond every 10ms until it is true or timeout passes; it
// returns how long it took and whether cond became true.
func waitFor(timeout time.Duration, cond func() bool) (time.Duration, bool) {
	start := time.Now()
	for {
		if cond() {
			return time.Since(start), true
		}
		if time.Since(start) > timeout {
			return time.Since(start), false
		}
		time.Sleep(10 * time.Millisecond)
	}
}

var _ = syscall.SIGTERM

// histBound returns the smallest bucket bound of histogram family name (all
// label sets together) that holds every observation; ok is false when the
// family is missing or observations exceed every finite bucket.
func histBound(m metrics, name string) (time.Duration, bool) {
	mf, ok := m[name]
	if !ok {
		return 0, false
	}
	cum := map[float64]uint64{}
	var total uint64
	for _, mt := range mf.GetMetric() {
		h := mt.GetHistogram()
		if h == nil {
			continue
		}
		total += h.GetSampleCount()
		for _, b := range h.GetBucket() {
			cum[b.GetUpperBound()] += b.GetCumulativeCount()
		}
	}
	best := -1.0
	for le, c := range cum {
		if c == total && (best < 0 || le < best) {
			best = le
		}
	}
	if best < 0 || best > 1e9 {
		return 0, false
	}
	return time.Duration(best * float64(time.Second)), true
}

// histAbove returns how many observations of histogram family name (all
// label sets) exceed the bucket bound le, which must be one of its buckets.
func histAbove(m metrics, name string, le float64) uint64 {
	var n uint64
	for _, mt := range m[name].GetMetric() {
		h := mt.GetHistogram()
		if h == nil {
			continue
		}
		for _, b := range h.GetBucket() {
			if b.GetUpperBound() == le {
				n += h.GetSampleCount() - b.GetCumulativeCount()
			}
		}
	}
	return n
}
