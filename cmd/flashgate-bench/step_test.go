package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestStepSchedule(t *testing.T) {
	start := time.Unix(1000, 0)
	s := newStepSchedule(stepOptions{idle: time.Second, idleRate: 4, factor: 10, peak: 500 * time.Millisecond}, start)
	tests := map[string]struct {
		k    int64
		at   time.Duration
		more bool
	}{
		"first":             {0, 0, true},
		"last idle":         {3, 750 * time.Millisecond, true},
		"first of the peak": {4, time.Second, true},
		"second of peak":    {5, time.Second + 25*time.Millisecond, true},
		"last of the peak":  {23, time.Second + 475*time.Millisecond, true},
		"past the end":      {24, 1500 * time.Millisecond, false},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			at, more := s.due(tc.k)
			if got := at.Sub(start); got != tc.at || more != tc.more {
				t.Errorf("due(%d) = +%s, %v; want +%s, %v", tc.k, got, more, tc.at, tc.more)
			}
		})
	}
}

// TestStepAgainstNoop runs a short step against the do-nothing server: every
// check due is sent once and lands in the row of when it was due, whatever
// the machine's speed (which the latencies show, and the test does not judge).
func TestStepAgainstNoop(t *testing.T) {
	addr := startNoop(t)
	metrics := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprint(w, "# HELP go_goroutines x\ngo_goroutines 7\n"+
			`flashgate_failure_mode_decisions_total{rule="a"} 2`+"\n"+
			`flashgate_failure_mode_decisions_total{rule="b"} 3`+"\n"+
			"flashgate_failure_mode_decisions_totally 100\n")
	}))
	defer metrics.Close()
	file := filepath.Join(t.TempDir(), "step.json")
	out, stderr, err := runArgs("step", "--addr", addr, "--idle", "300ms", "--idle-rate", "20", "--factor", "5",
		"--peak", "500ms", "--steady-from", "200ms", "--concurrency", "8", "--users", "10",
		"--timeout", "30s", "--metrics-url", metrics.URL, "--json-file", file)
	if err != nil {
		t.Fatalf("step: %v\n%s", err, stderr)
	}
	for _, want := range []string{"ms after step", "idle", "400-500", "first second", "steady 200-500", "goal:", "server at +0ms:"} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var r stepResult
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatalf("--json-file %s: %v", b, err)
	}
	if r.Idle.Due != 6 || r.Idle.Answered != 6 {
		t.Errorf("idle row = %+v, want 6 checks due (300ms at 20/s), all answered", r.Idle)
	}
	if len(r.Rows) != 5 {
		t.Fatalf("%d rows, want 5 (500ms in rows of 100ms)", len(r.Rows))
	}
	var due uint64
	for i, row := range r.Rows {
		if row.Due != 10 || row.Answered != row.Due || row.Errors != 0 {
			t.Errorf("row %d = %+v, want 10 checks due (100ms at 100/s), all answered", i, row)
		}
		if row.Slow > row.Answered || row.Envoy403 != row.Slow+row.Errors || !(row.P50MS <= row.P99MS && row.P99MS <= row.MaxMS) {
			t.Errorf("row %d = %+v: slow beyond answered, 403s other than slow + errors, or percentiles out of order", i, row)
		}
		if row.FromMS != float64(100*i) || row.ToMS != float64(100*(i+1)) {
			t.Errorf("row %d spans %g-%gms", i, row.FromMS, row.ToMS)
		}
		due += row.Due
	}
	if r.Peak.Due != due || r.FirstSecond.Due != due || r.Steady.Due != 30 {
		t.Errorf("peak %d, first second %d, steady %d checks due; want %d, %d, 30", r.Peak.Due, r.FirstSecond.Due, r.Steady.Due, due, due)
	}
	if r.NoneSlow != (r.Idle.Envoy403+r.Peak.Envoy403 == 0) {
		t.Errorf("goal_none_slow %v with %d + %d 403s", r.NoneSlow, r.Idle.Envoy403, r.Peak.Envoy403)
	}
	if len(r.Metrics) != 4 {
		t.Fatalf("%d scrapes of --metrics-url, want 4 (start, step, a second later or the end, the end)", len(r.Metrics))
	}
	if v := r.Metrics[1].Values; v["flashgate_failure_mode_decisions_total"] != 5 || v["go_goroutines"] != 7 {
		t.Errorf("scraped %v, want the failure-mode decisions summed over their labels (5) and 7 goroutines", v)
	}
}

func TestStepFlagErrors(t *testing.T) {
	tests := map[string]struct {
		args []string
		want string
	}{
		"no peak":             {[]string{"--peak", "0s"}, "--peak"},
		"no idle rate":        {[]string{"--idle-rate", "0"}, "--idle-rate"},
		"step down":           {[]string{"--factor", "0.5"}, "--factor"},
		"bucket beyond peak":  {[]string{"--peak", "1s", "--bucket", "2s", "--steady-from", "0s"}, "--bucket"},
		"steady beyond peak":  {[]string{"--peak", "1s", "--steady-from", "1s"}, "--steady-from"},
		"the load's own flag": {[]string{"--users", "0"}, "--users"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			_, _, err := runArgs(append([]string{"step", "--addr", "127.0.0.1:1"}, tc.args...)...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want one containing %q", err, tc.want)
			}
		})
	}
}
