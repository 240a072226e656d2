package redisstore

import (
	"errors"
	"fmt"

	"github.com/redis/go-redis/v9"

	"github.com/flashgate/flashgate/window"
)

// ErrMasterDown marks a connection failure of one Redis Cluster master
// among several: the store's other masters still answer, so it is not the
// store's outage. window.Classify counts it as window.KindMasterDown.
var ErrMasterDown error = &kindError{kind: window.KindMasterDown, err: errors.New("redisstore: a Redis Cluster master is unreachable")}

// kindError is an error of go-redis marked with its window.ErrKind.
type kindError struct {
	kind window.ErrKind
	err  error
}

func (e *kindError) Error() string        { return e.err.Error() }
func (e *kindError) Unwrap() error        { return e.err }
func (e *kindError) Kind() window.ErrKind { return e.kind }

// classified returns err marked with its kind when go-redis's own errors
// tell it (a pool timeout, a closed client); else err.
func classified(err error) error {
	var ke window.KindError
	switch {
	case err == nil, errors.As(err, &ke):
		return err
	case errors.Is(err, redis.ErrPoolTimeout):
		return &kindError{kind: window.KindTimeout, err: err}
	case errors.Is(err, redis.ErrClosed):
		return &kindError{kind: window.KindConnection, err: err}
	}
	return err
}

// clientClosed marks err with window.ErrClosed when the client was closed
// (shutdown), for the write-back, which stops on it.
func clientClosed(err error) error {
	if errors.Is(err, redis.ErrClosed) {
		return fmt.Errorf("%w: %w", window.ErrClosed, err)
	}
	return err
}
