package window

import (
	"context"
	"errors"
	"io"
	"net"
	"syscall"

	"github.com/redis/go-redis/v9"
)

// ErrBreakerOpen is returned by a limiter that holds its backend off (a
// circuit breaker, or a fallback still writing back); Classify counts it as
// KindBreakerOpen.
var ErrBreakerOpen = errors.New("window: circuit breaker open")

// ErrClosed is returned by a limiter after it was closed (shutdown).
var ErrClosed = errors.New("window: the limiter is closed")

// ErrMasterDown marks a connection failure of one Redis Cluster master
// among several: the store's other masters still answer, so it is not the
// store's outage. Classify counts it as KindMasterDown.
var ErrMasterDown = errors.New("window: a Redis Cluster master is unreachable")

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
	// KindMasterDown: one Redis Cluster master of several refused, reset
	// or closed the connection (ErrMasterDown); the others answer. A
	// failure, but not a connection failure of the whole store: the
	// breaker counts it in its failure rate, not in its run of connection
	// errors.
	KindMasterDown
	// KindOther: anything else Redis said (a script error, OOM, LOADING…).
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
	}
	return "other"
}

// Classify tells what kind of failure err is. A nil err is KindNone.
func Classify(err error) ErrKind {
	if err == nil {
		return KindNone // before ne is declared: it escapes, and would cost a success an allocation
	}
	var ne net.Error
	switch {
	case errors.Is(err, ErrBreakerOpen):
		return KindBreakerOpen
	case errors.Is(err, ErrInvalidHit):
		return KindInvalidHit
	case errors.Is(err, ErrClosed):
		return KindClosed
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, redis.ErrPoolTimeout),
		errors.As(err, &ne) && ne.Timeout():
		return KindTimeout
	case errors.Is(err, context.Canceled):
		return KindCanceled
	case errors.Is(err, ErrMasterDown):
		return KindMasterDown
	case errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE),
		errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, net.ErrClosed),
		errors.Is(err, redis.ErrClosed), errors.As(err, &ne):
		return KindConnection
	}
	return KindOther
}
