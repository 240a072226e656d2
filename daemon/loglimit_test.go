package daemon

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/flashgate/flashgate/internal/testing/logtest"
)

// suppressedOf reads the limit's counter of kind.
func suppressedOf(t *testing.T, l *logLimit, kind string) float64 {
	t.Helper()
	var m dto.Metric
	if err := l.suppressed.WithLabelValues(kind).Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

func TestLogLimit(t *testing.T) {
	var buf logtest.Buffer
	limit := newLogLimit(logEvery, time.Now)
	log := slog.New(limit.handler(slog.NewJSONHandler(&buf, nil)))
	// Within one interval (the default 10s, far longer than this loop):
	// the first of a kind is written, the rest held back; kinds are told
	// apart by the message up to ':' or ';'; info is never held back.
	for i := range 100 {
		log.Warn("redis client", "detail", i)
		log.Error("redis is not ready; not serving", "attempt", i)
		log.Info("info line", "i", i)
	}
	log.With("component", "x").Warn("redis client: another wording")
	recs := logtest.JSONLines(t, buf.String())
	byMsg := map[string]int{}
	for _, r := range recs {
		byMsg[r["msg"].(string)]++
	}
	if byMsg["redis client"] != 1 || byMsg["redis is not ready; not serving"] != 1 || byMsg["info line"] != 100 || len(recs) != 102 {
		t.Fatalf("lines by message %v (%d lines), want one of each warning or error, every info line", byMsg, len(recs))
	}
	// Of each kind, one record is held for the end of the interval; the
	// others were dropped and counted.
	if got := suppressedOf(t, limit, "redis client"); got != 99 {
		t.Errorf(`suppressed{kind="redis client"} = %v, want 99`, got)
	}
	if got := suppressedOf(t, limit, "redis is not ready"); got != 98 {
		t.Errorf(`suppressed{kind="redis is not ready"} = %v, want 98`, got)
	}
	// close writes the held ones, with how many of their kind were dropped.
	limit.close()
	recs = logtest.JSONLines(t, buf.String())[102:]
	if len(recs) != 2 {
		t.Fatalf("close wrote %d lines, want 2: %v", len(recs), recs)
	}
	for _, r := range recs {
		switch r["msg"] {
		case "redis client: another wording":
			if r["suppressed"] != float64(99) || r["component"] != "x" {
				t.Errorf("held line %v: want suppressed 99 and its logger's attributes", r)
			}
		case "redis is not ready; not serving":
			if r["suppressed"] != float64(98) || r["attempt"] != float64(99) {
				t.Errorf("held line %v: want the last one (attempt 99), suppressed 98", r)
			}
		default:
			t.Errorf("close wrote %v", r)
		}
	}
	// After close, nothing is held back.
	log.Warn("redis client", "detail", "late")
	if n := len(logtest.JSONLines(t, buf.String())); n != 105 {
		t.Errorf("%d lines after a warning past close, want 105", n)
	}
}

func TestLogLimitFlushesAtIntervalEnd(t *testing.T) {
	var buf logtest.Buffer
	limit := newLogLimit(100*time.Millisecond, time.Now)
	log := slog.New(limit.handler(slog.NewJSONHandler(&buf, nil)))
	defer limit.close()
	for i := range 3 {
		log.Warn("breaker open", "i", i)
	}
	waitFor(t, eventually, "the held line", func() bool { return strings.Count(buf.String(), "\n") == 2 })
	recs := logtest.JSONLines(t, buf.String())
	if recs[0]["i"] != float64(0) || recs[1]["i"] != float64(2) || recs[1]["suppressed"] != float64(1) {
		t.Errorf("lines %v, want i=0, then i=2 with suppressed 1", recs)
	}
	// A new interval began with the held line written: the next record is
	// held for its end.
	log.Warn("breaker open", "i", 3)
	waitFor(t, eventually, "the next held line", func() bool { return strings.Count(buf.String(), "\n") == 3 })
	if r := logtest.JSONLines(t, buf.String())[2]; r["i"] != float64(3) || r["suppressed"] != nil {
		t.Errorf("line %v, want i=3 without suppressed", r)
	}
}

func TestLogKindsBounded(t *testing.T) {
	limit := newLogLimit(time.Hour, time.Now)
	log := slog.New(limit.handler(slog.NewTextHandler(&logtest.Buffer{}, nil)))
	for i := range 2 * maxLogKinds {
		for range 3 { // the first written, the second held, the third replaces it
			log.Warn(strings.Repeat("k", i+1) + ": x")
		}
	}
	limit.close()
	reg := prometheus.NewRegistry()
	reg.MustRegister(limit.collector())
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	if n := len(mfs[0].GetMetric()); n != maxLogKinds+1 {
		t.Errorf("%d kinds counted, want %d (the rest as other)", n, maxLogKinds+1)
	}
}
