package window

import (
	"context"
	"errors"
	"io"
	"net"
	"syscall"
)

// ErrBreakerOpen is returned by a limiter that holds its backend off (a
// circuit breaker, or a fallback still writing back); Classify counts it as
// KindBreakerOpen.
var ErrBreakerOpen = errors.New("window: circuit breaker open")

// ErrClosed is returned by a limiter after it was closed (shutdown).
var ErrClosed = errors.New("window: the limiter is closed")

// KindError is an error that knows its kind: a store marks the errors of
// its own client with it, and Classify honours the kind without knowing the
// store.
type KindError interface {
	error
	Kind() ErrKind
}

// ErrKind classifies why a decision failed, for the breaker and for metrics
// (flashgate_backend_errors_total{kind}). Its String is a bounded label.
type ErrKind uint8

const (
	// KindNone: no error.
	KindNone ErrKind = iota
	// KindTimeout: the budget (or a read, write or pool timeout) ran out.
	KindTimeout
	// KindConnection: the connection was refused, reset or closed: Redis
	// is down or unreachable.
	KindConnection
	// KindBreakerOpen: a circuit breaker held the backend off (ErrBreakerOpen).
	KindBreakerOpen
	// KindInvalidHit: the caller passed a hit that cannot be enforced.
	KindInvalidHit
	// KindCanceled: the caller gave up (Envoy's own timeout); not the
	// backend's fault.
	KindCanceled
	// KindClosed: the limiter was closed (shutdown).
	KindClosed
	// KindMasterDown: one master of a sharded store (a Redis Cluster) of
	// several refused, reset or closed the connection; the others answer. A
	// failure, but not a connection failure of the whole store: the
	// breaker counts it in its failure rate, not in its run of connection
	// errors.
	KindMasterDown
	// KindRestoring: a fallback held the call off while its local
	// admissions wait to be written back after an outage, or while the
	// fleet settles.
	KindRestoring
	// KindOther: anything else the store said (a script error, OOM, LOADING…).
	KindOther
)

// String returns the metric label of k.
func (k ErrKind) String() string {
	switch k {
	case KindNone:
		return "none"
	case KindTimeout:
		return "timeout"
	case KindConnection:
		return "connection"
	case KindBreakerOpen:
		return "breaker_open"
	case KindInvalidHit:
		return "invalid_hit"
	case KindCanceled:
		return "canceled"
	case KindClosed:
		return "closed"
	case KindMasterDown:
		return "master_down"
	case KindRestoring:
		return "restoring"
	}
	return "other"
}

// Classify tells what kind of failure err is. A nil err is KindNone.
func Classify(err error) ErrKind {
	if err == nil {
		return KindNone // before ne is declared: it escapes, and would cost a success an allocation
	}
	var ne net.Error
	var ke KindError
	kind := KindNone
	if errors.As(err, &ke) {
		kind = ke.Kind()
	}
	switch {
	case errors.Is(err, ErrBreakerOpen):
		return KindBreakerOpen
	case errors.Is(err, ErrInvalidHit):
		return KindInvalidHit
	case errors.Is(err, ErrClosed):
		return KindClosed
	case errors.Is(err, context.DeadlineExceeded), kind == KindTimeout, errors.As(err, &ne) && ne.Timeout():
		return KindTimeout
	case errors.Is(err, context.Canceled):
		return KindCanceled
	case kind == KindMasterDown:
		return KindMasterDown
	case errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE),
		errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, net.ErrClosed),
		kind == KindConnection, errors.As(err, &ne):
		return KindConnection
	case kind != KindNone:
		return kind
	}
	return KindOther
}
