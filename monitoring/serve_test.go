package monitoring

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/flashgate/flashgate/window/redistest"
)

// The rules the serve processes run: one rule keyed by x-user, 2 a minute,
// with a penalty box whose threshold nobody reaches (so that bans come only
// from `flashgate bans add`), and a ratelimit (RLS) domain of 1 a minute.
const (
	rulesYAML = `domain: monitoring
sources:
  user: {request_headers: {header_name: x-user}}
descriptors:
  - key: user
    name: per_user
    rate_limit: {requests: 2, window: 1m}
    ban: {threshold: 1000, window: 10s, duration: 10m}
`
	rlsYAML = `domain: mon
descriptors:
  - key: client
    rate_limit:
      unit: minute
      requests_per_unit: 1
`
	// badYAML is a descriptors file (and a ratelimit config) that fails to
	// load: reloads count an error and keep the rules in force.
	badYAML = "domain: [unterminated\n"
)

// eventually bounds every wait for serve to show an event in /metrics.
const eventually = 20 * time.Second

// buildFlashgate builds the flashgate binary into a temporary directory.
func buildFlashgate(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "flashgate")
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/flashgate")
	cmd.Dir = ".." // the product's module: monitoring/ is a module of its own
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/flashgate: %v\n%s", err, out)
	}
	return bin
}

// syncBuffer is a bytes.Buffer safe for a process's two output streams and
// the test's reads.
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

// serveProc is one `flashgate serve` process with its descriptors file,
// ratelimit config directory, /metrics, HTTP front-end and ratelimit HTTP
// side on free loopback ports.
type serveProc struct {
	t                            *testing.T
	bin                          string
	rules, rlsFile               string
	httpAddr, authzAddr, rlsHTTP string
	out                          *syncBuffer
	cmd                          *exec.Cmd
	exited                       chan struct{}
	seen                         map[string]bool // series names in any scrape so far
	redisFlags                   []string
}

// freeAddrs returns n loopback addresses that were free a moment ago.
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

// writeFile replaces path's content at once (rename), as a ConfigMap update
// does, so that a reload never reads half a file.
func writeFile(t *testing.T, path, data string) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// startServe runs `flashgate serve` with the rules above and extra flags,
// waits until /readyz answers 200, and kills it in cleanup.
func startServe(t *testing.T, bin string, extra ...string) *serveProc {
	t.Helper()
	dir := t.TempDir()
	p := &serveProc{t: t, bin: bin, rules: filepath.Join(dir, "rules.yaml"), seen: map[string]bool{}}
	rlsDir := filepath.Join(dir, "ratelimit")
	if err := os.Mkdir(rlsDir, 0o755); err != nil {
		t.Fatal(err)
	}
	p.rlsFile = filepath.Join(rlsDir, "mon.yaml")
	writeFile(t, p.rules, rulesYAML)
	writeFile(t, p.rlsFile, rlsYAML)
	for attempt := 0; ; attempt++ {
		err := p.launch(rlsDir, extra)
		if err == nil {
			return p
		}
		if attempt == 2 || !strings.Contains(err.Error(), "address already in use") {
			t.Fatalf("start flashgate serve: %v", err)
		}
	}
}

func (p *serveProc) launch(rlsDir string, extra []string) error {
	addrs, err := freeAddrs(4)
	if err != nil {
		return err
	}
	p.httpAddr, p.authzAddr, p.rlsHTTP = addrs[1], addrs[2], addrs[3]
	args := append([]string{"serve", "--config", p.rules, "--grpc-addr", addrs[0], "--http-addr", p.httpAddr,
		"--http-authz-addr", p.authzAddr, "--rls-config", rlsDir, "--rls-http-addr", p.rlsHTTP}, extra...)
	p.out = &syncBuffer{}
	p.cmd = exec.Command(p.bin, args...)
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	if err := p.cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", p.bin, err)
	}
	p.exited = make(chan struct{})
	go func() { _ = p.cmd.Wait(); close(p.exited) }()
	p.t.Cleanup(func() {
		_ = p.cmd.Process.Kill()
		<-p.exited
		if p.t.Failed() {
			p.t.Logf("flashgate %s output:\n%s", strings.Join(args, " "), p.out)
		}
	})
	deadline := time.Now().Add(eventually)
	for time.Now().Before(deadline) {
		select {
		case <-p.exited:
			return fmt.Errorf("flashgate serve exited before it was ready:\n%s", p.out)
		default:
		}
		if code, _, err := get("http://"+p.httpAddr+"/readyz", nil); err == nil && code == http.StatusOK {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("flashgate serve not ready within %s:\n%s", eventually, p.out)
}

// get sends a GET with headers and returns the status and body.
func get(url string, headers map[string]string) (int, []byte, error) {
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		return 0, nil, fmt.Errorf("new request: %w", err)
	}
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	return do(req)
}

func do(req *http.Request) (int, []byte, error) {
	c := &http.Client{Timeout: 5 * time.Second}
	resp, err := c.Do(req)
	if err != nil {
		return 0, nil, fmt.Errorf("%s %s: %w", req.Method, req.URL, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return resp.StatusCode, nil, fmt.Errorf("read %s: %w", req.URL, err)
	}
	return resp.StatusCode, b, nil
}

// scrape reads /metrics and adds the series names it exports to p.seen. A
// histogram's series are its _bucket, _sum and _count; a family without a
// sample (a vector none of whose children exists yet) exports nothing.
func (p *serveProc) scrape() map[string]*dto.MetricFamily {
	p.t.Helper()
	code, body, err := get("http://"+p.httpAddr+"/metrics", nil)
	if err != nil || code != http.StatusOK {
		p.t.Fatalf("GET /metrics: %d %v", code, err)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := parser.TextToMetricFamilies(bytes.NewReader(body))
	if err != nil {
		p.t.Fatalf("parse /metrics: %v", err)
	}
	for _, n := range seriesNames(mfs) {
		p.seen[n] = true
	}
	return mfs
}

// seriesNames are the names of the series that mfs export, sorted.
func seriesNames(mfs map[string]*dto.MetricFamily) []string {
	var names []string
	for name, mf := range mfs {
		if len(mf.GetMetric()) == 0 {
			continue
		}
		switch mf.GetType() {
		case dto.MetricType_HISTOGRAM, dto.MetricType_GAUGE_HISTOGRAM:
			names = append(names, name+"_bucket", name+"_sum", name+"_count")
		case dto.MetricType_SUMMARY:
			names = append(names, name, name+"_sum", name+"_count")
		default:
			names = append(names, name)
		}
	}
	sort.Strings(names)
	return names
}

// value is the sum of family name's samples whose labels include labels
// ("k", "v", ...), and whether any matched.
func value(mfs map[string]*dto.MetricFamily, name string, labels ...string) (float64, bool) {
	var sum float64
	found := false
next:
	for _, m := range mfs[name].GetMetric() {
		for i := 0; i+1 < len(labels); i += 2 {
			if !hasLabel(m, labels[i], labels[i+1]) {
				continue next
			}
		}
		found = true
		switch {
		case m.GetCounter() != nil:
			sum += m.GetCounter().GetValue()
		case m.GetGauge() != nil:
			sum += m.GetGauge().GetValue()
		case m.GetHistogram() != nil:
			sum += float64(m.GetHistogram().GetSampleCount())
		default:
			sum += m.GetUntyped().GetValue()
		}
	}
	return sum, found
}

func hasLabel(m *dto.Metric, name, val string) bool {
	for _, lp := range m.GetLabel() {
		if lp.GetName() == name && lp.GetValue() == val {
			return true
		}
	}
	return false
}

// await scrapes until cond holds of a scrape, failing the test after
// eventually; each round first calls poke (nil: none), which drives the
// traffic that makes the event happen.
func (p *serveProc) await(what string, poke func(), cond func(map[string]*dto.MetricFamily) bool) {
	p.t.Helper()
	deadline := time.Now().Add(eventually)
	for {
		if poke != nil {
			poke()
		}
		if cond(p.scrape()) {
			return
		}
		if time.Now().After(deadline) {
			p.t.Fatalf("/metrics never showed %s within %s", what, eventually)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// positive is a cond of await: family name has a sample > 0 with labels.
func positive(name string, labels ...string) func(map[string]*dto.MetricFamily) bool {
	return func(mfs map[string]*dto.MetricFamily) bool {
		v, ok := value(mfs, name, labels...)
		return ok && v > 0
	}
}

// check sends one check for user through the HTTP front-end and returns
// its status (200 allowed, 429 denied).
func (p *serveProc) check(user string) int {
	p.t.Helper()
	code, body, err := get("http://"+p.authzAddr+"/", map[string]string{"x-user": user})
	if err != nil {
		p.t.Fatalf("check: %v", err)
	}
	if code != http.StatusOK && code != http.StatusTooManyRequests {
		p.t.Fatalf("check: status %d, want 200 or 429: %s", code, body)
	}
	return code
}

// rlsCall sends one ShouldRateLimit call (ratelimit's POST /json) for
// client and returns its status: 200 OK, 429 OVER_LIMIT.
func (p *serveProc) rlsCall(client string) int {
	p.t.Helper()
	body := fmt.Sprintf(`{"domain":"mon","descriptors":[{"entries":[{"key":"client","value":%q}]}]}`, client)
	req, err := http.NewRequest(http.MethodPost, "http://"+p.rlsHTTP+"/json", strings.NewReader(body))
	if err != nil {
		p.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	code, out, err := do(req)
	if err != nil {
		p.t.Fatalf("ShouldRateLimit: %v", err)
	}
	if code != http.StatusOK && code != http.StatusTooManyRequests {
		p.t.Fatalf("ShouldRateLimit: status %d: %s", code, out)
	}
	return code
}

// driveCommon makes every event any backend shows: checks allowed and
// denied, a request the HTTP front-end rejects, RLS calls allowed and over
// the limit, a failed and a successful reload of the descriptors file and
// of the ratelimit config.
func (p *serveProc) driveCommon() {
	t := p.t
	t.Helper()
	var codes []int
	for range 3 {
		codes = append(codes, p.check("alice"))
	}
	if codes[0] != http.StatusOK || codes[2] != http.StatusTooManyRequests {
		t.Fatalf("checks of alice answered %v, want 200 first and 429 third (2 a minute)", codes)
	}
	code, _, err := get("http://"+p.authzAddr+"/", map[string]string{"x-original-method": "NOT A METHOD"})
	if err != nil || code != http.StatusBadRequest {
		t.Fatalf("a bad X-Original-Method: %d %v, want 400", code, err)
	}
	if a, b := p.rlsCall("c1"), p.rlsCall("c1"); a != http.StatusOK || b != http.StatusTooManyRequests {
		t.Fatalf("ShouldRateLimit answered %d then %d, want 200 then 429 (1 a minute)", a, b)
	}

	writeFile(t, p.rules, badYAML)
	p.await(`flashgate_config_reloads_total{result="error"}`, nil, positive("flashgate_config_reloads_total", "result", "error"))
	// A reload of the same rules as in force is no reload: change a comment.
	writeFile(t, p.rules, rulesYAML+"# reloaded\n")
	p.await(`flashgate_config_reloads_total{result="success"}`, nil, positive("flashgate_config_reloads_total", "result", "success"))
	writeFile(t, p.rlsFile, badYAML)
	p.await(`flashgate_rls_config_reloads_total{result="error"}`, nil, positive("flashgate_rls_config_reloads_total", "result", "error"))
	writeFile(t, p.rlsFile, rlsYAML+"# reloaded\n")
	p.await(`flashgate_rls_config_reloads_total{result="success"}`, nil, positive("flashgate_rls_config_reloads_total", "result", "success"))

	p.await(`flashgate_checks_total{decision="denied"}`, nil, positive("flashgate_checks_total", "rule", "per_user", "decision", "denied"))
	p.await(`flashgate_http_authz_rejected_total{reason="bad_method"}`, nil, positive("flashgate_http_authz_rejected_total", "reason", "bad_method"))
	p.await(`flashgate_rls_requests_total`, nil, positive("flashgate_rls_requests_total", "domain", "mon"))
}

// run runs the flashgate binary with args (an operator command) and
// fails the test if it fails.
func run(t *testing.T, bin string, args ...string) {
	t.Helper()
	out, err := exec.Command(bin, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("flashgate %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// driveRedis makes the events only the Redis backend shows: a ban added
// and lifted with `flashgate bans`, an override set and cleared with
// `flashgate limits`, then Redis killed under traffic, so
// that backend errors, failure-mode decisions and the breaker show.
func (p *serveProc) driveRedis(redis *redistest.Server) {
	t := p.t
	t.Helper()
	ops := append([]string{"--config", p.rules}, p.redisFlags...)
	run(t, p.bin, append([]string{"bans", "add", "--rule", "per_user", "--value", "mallory", "--for", "10m"}, ops...)...)
	p.await(`flashgate_bans_in_force{rule="per_user"}`, nil, positive("flashgate_bans_in_force", "rule", "per_user"))
	p.await(`flashgate_bans_raised_total{by="hand"}`, nil, positive("flashgate_bans_raised_total", "rule", "per_user", "by", "hand"))
	run(t, p.bin, append([]string{"bans", "lift", "--rule", "per_user", "--value", "mallory"}, ops...)...)
	p.await(`flashgate_bans_lifted_total`, nil, positive("flashgate_bans_lifted_total", "rule", "per_user"))
	run(t, p.bin, append([]string{"limits", "set", "--rule", "per_user", "--requests", "1", "--for", "10m"}, ops...)...)
	p.await(`flashgate_overrides_in_force{rule="per_user"}`, nil, positive("flashgate_overrides_in_force", "rule", "per_user"))
	p.await(`flashgate_override_sets_total`, nil, positive("flashgate_override_sets_total", "rule", "per_user"))
	run(t, p.bin, append([]string{"limits", "clear", "--rule", "per_user"}, ops...)...)
	p.await(`flashgate_override_clears_total`, nil, positive("flashgate_override_clears_total", "rule", "per_user"))

	redis.Kill()
	n := 0
	poke := func() {
		for range 5 {
			n++
			p.check(fmt.Sprintf("outage-%d", n))
			p.rlsCall(fmt.Sprintf("outage-%d", n))
		}
	}
	p.await("flashgate_backend_errors_total", poke, positive("flashgate_backend_errors_total"))
	p.await("flashgate_failure_mode_decisions_total", poke, positive("flashgate_failure_mode_decisions_total", "mode", "local"))
	p.await("flashgate_rls_backend_errors_total", poke, positive("flashgate_rls_backend_errors_total"))
	p.await("flashgate_breaker_open 1", poke, positive("flashgate_breaker_open"))
}

// exportedSeries starts serve on the memory backend and on Redis, drives
// each through the events above and returns every series name their
// /metrics showed, with the backend that showed it first.
func exportedSeries(t *testing.T) map[string]string {
	t.Helper()
	bin := buildFlashgate(t)
	out := map[string]string{}

	mem := startServe(t, bin, "--backend", "memory")
	mem.driveCommon()
	for n := range mem.seen {
		out[n] = "memory"
	}

	redis := redistest.Start(t)
	flags := []string{"--redis-addr", redis.Addr(), "--key-prefix", "monitoring"}
	rp := startServe(t, bin, append([]string{"--backend", "redis", "--failure-mode", "local"}, flags...)...)
	rp.redisFlags = flags
	rp.driveCommon()
	rp.driveRedis(redis)
	for n := range rp.seen {
		if _, ok := out[n]; !ok {
			out[n] = "redis"
		}
	}
	return out
}
