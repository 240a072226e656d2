package daemon

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// logEvery is how often serve writes a warning or error of one kind at
// most; the rest are counted (flashgate_log_suppressed_total{kind}).
const logEvery = 10 * time.Second

// maxLogKinds bounds the kinds a logLimit tells apart (and so the label
// values of its counter); later kinds share "other".
const maxLogKinds = 32

// logLimit rate-limits the warnings and errors of a logger: of each kind
// (a record's message up to its first ':' or ';') at most one is written
// per logEvery; the ones held back in between are counted, and the last of
// them is written when the interval ends, with "suppressed": the records
// of its kind dropped since the previous line of that kind. Debug and info
// records pass untouched. It is safe for concurrent use.
type logLimit struct {
	every      time.Duration
	now        func() time.Time
	suppressed *prometheus.CounterVec
	// mu guards the fields below and every logKind's.
	mu     sync.Mutex
	kinds  map[string]*logKind
	closed bool
}

// logKind is the state of one kind of record.
type logKind struct {
	label string
	// next is when a record of this kind may be written again.
	next time.Time
	// dropped counts the records not written since the last one that was.
	dropped int
	// pending is the latest record held back, written when next comes.
	pending *heldRecord
	timer   *time.Timer
	// gen tells the current timer from a stopped one that fired anyway.
	gen uint64
}

// heldRecord is a record held back, with the handler (attributes and
// groups included) that received it.
type heldRecord struct {
	h slog.Handler
	r slog.Record
}

func newLogLimit(every time.Duration, now func() time.Time) *logLimit {
	return &logLimit{
		every: every, now: now, kinds: map[string]*logKind{},
		suppressed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "flashgate_log_suppressed_total",
			Help: "Warnings and errors not logged because one of their kind was logged less than 10s before; kind is the message up to its first ':' or ';'.",
		}, []string{"kind"}),
	}
}

// handler wraps next so that its warnings and errors go through l.
func (l *logLimit) handler(next slog.Handler) slog.Handler { return &limitHandler{next: next, l: l} }

// collector is the suppressed-lines counter, for /metrics.
func (l *logLimit) collector() prometheus.Collector { return l.suppressed }

// close writes every record still held back and lets later ones through
// unlimited: nothing is written after it returns but what is logged after.
func (l *logLimit) close() {
	l.mu.Lock()
	l.closed = true
	var held []*heldRecord
	for _, k := range l.kinds {
		if k.timer != nil {
			k.timer.Stop()
			k.timer = nil
		}
		if k.pending != nil {
			held = append(held, k.withDroppedLocked(k.pending, k.dropped-1))
			k.pending, k.dropped = nil, 0
		}
	}
	l.mu.Unlock()
	for _, p := range held {
		_ = p.h.Handle(context.Background(), p.r)
	}
}

// kindOf returns the kind of a message: up to its first ':' or ';',
// at most 64 bytes.
func kindOf(msg string) string {
	if i := strings.IndexAny(msg, ":;"); i >= 0 {
		msg = msg[:i]
	}
	msg = strings.TrimSpace(msg)
	if len(msg) > 64 {
		msg = msg[:64]
	}
	return msg
}

// kindLocked returns the state of msg's kind, made on first use.
func (l *logLimit) kindLocked(msg string) *logKind {
	name := kindOf(msg)
	if k, ok := l.kinds[name]; ok {
		return k
	}
	if len(l.kinds) >= maxLogKinds {
		name = "other"
		if k, ok := l.kinds[name]; ok {
			return k
		}
	}
	k := &logKind{label: name}
	l.kinds[name] = k
	return k
}

// withDroppedLocked returns p with a "suppressed" attribute of n, when n
// is positive.
func (k *logKind) withDroppedLocked(p *heldRecord, n int) *heldRecord {
	if n <= 0 {
		return p
	}
	r := p.r.Clone()
	r.AddAttrs(slog.Int("suppressed", n))
	return &heldRecord{h: p.h, r: r}
}

// admit decides a warning or error: it returns the record to write now
// (nil to hold it back).
func (l *logLimit) admit(h slog.Handler, r slog.Record) *heldRecord {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return &heldRecord{h: h, r: r}
	}
	k := l.kindLocked(r.Message)
	now := l.now()
	if !now.Before(k.next) {
		// A record held back whose timer has not fired yet is dropped for
		// this newer one.
		if k.pending != nil {
			k.pending = nil
			k.timer.Stop()
			k.timer = nil
			l.suppressed.WithLabelValues(k.label).Inc()
		}
		out := k.withDroppedLocked(&heldRecord{h: h, r: r}, k.dropped)
		k.next, k.dropped = now.Add(l.every), 0
		return out
	}
	k.dropped++
	if k.pending != nil {
		l.suppressed.WithLabelValues(k.label).Inc() // replaced by r
	}
	k.pending = &heldRecord{h: h, r: r.Clone()}
	if k.timer == nil {
		k.gen++
		gen := k.gen
		k.timer = time.AfterFunc(k.next.Sub(now), func() { l.flush(k, gen) })
	}
	return nil
}

// flush writes k's record held back, when its interval has ended.
func (l *logLimit) flush(k *logKind, gen uint64) {
	l.mu.Lock()
	p := k.pending
	if l.closed || p == nil || k.gen != gen {
		l.mu.Unlock()
		return
	}
	// p is counted in dropped but is written: dropped-1 were not.
	out := k.withDroppedLocked(p, k.dropped-1)
	k.pending, k.timer, k.dropped = nil, nil, 0
	k.next = l.now().Add(l.every)
	l.mu.Unlock()
	_ = out.h.Handle(context.Background(), out.r)
}

// limitHandler is the slog.Handler of a logLimit.
type limitHandler struct {
	next slog.Handler
	l    *logLimit
}

func (h *limitHandler) Enabled(ctx context.Context, lv slog.Level) bool {
	return h.next.Enabled(ctx, lv)
}

func (h *limitHandler) Handle(ctx context.Context, r slog.Record) error {
	if r.Level < slog.LevelWarn {
		return h.next.Handle(ctx, r)
	}
	if out := h.l.admit(h.next, r); out != nil {
		return out.h.Handle(ctx, out.r)
	}
	return nil
}

func (h *limitHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return &limitHandler{next: h.next.WithAttrs(as), l: h.l}
}

func (h *limitHandler) WithGroup(name string) slog.Handler {
	return &limitHandler{next: h.next.WithGroup(name), l: h.l}
}
