package redisstore

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"
)

// RestartListener is told that Redis restarted or failed over: a new
// connection of the client [NewClient] built with it (ClientConfig.Restarts)
// found a run id other than the one its connections found before. Such a
// Redis may have come back empty. Failure mode local's fallback implements
// it, so that a sidecar none of whose calls met the outage still holds its
// checks off the returned Redis while the fleet writes back; so does the
// fleet heartbeat, which keeps its members counted across the restart.
type RestartListener interface {
	// Restarted is called once per new run id, before the connection that
	// found it fails with [ErrRestarted]; no other new connection passes
	// until it has returned.
	Restarted()
}

// ErrRestarted is the error of a command whose new connection found Redis
// restarted or failed over (see [RestartListener]). The command is not
// sent, nor retried on another connection: the caller takes its failure
// mode. [window.Classify] counts it as a connection error: Redis was
// down, and failure mode local holds its return as after one.
var ErrRestarted = errors.New("redis restarted or failed over")

// restartedError is ErrRestarted with the run ids. It has no Unwrap, so
// that go-redis, which unwraps a failed connection's error once, returns
// it whole.
type restartedError struct{ was, now string }

func (e *restartedError) Error() string {
	if e.was == "" {
		return fmt.Sprintf("%v: run id %s, found while this connection was set up", ErrRestarted, e.now)
	}
	return fmt.Sprintf("%v: run id %s, was %s", ErrRestarted, e.now, e.was)
}

// Is makes it ErrRestarted, and a closed connection (the connection is
// closed unused), which window.Classify counts as a connection error and
// go-redis does not retry.
func (e *restartedError) Is(target error) bool {
	return target == ErrRestarted || target == net.ErrClosed
}

// runIDWatch compares the run id of every new connection (INFO server,
// one round trip per connection, none per command) with the one its
// connections found before, and tells to when it changed.
type runIDWatch struct {
	to RestartListener

	// mu guards known and noticed. It is held while a connection's run id
	// is compared and, on a change, while to is told.
	mu      sync.Mutex
	known   string // the run id connections found last; "" before the first
	noticed uint64 // the restarts found so far
}

// onConnect is go-redis's OnConnect hook. A connection that finds a new
// run id fails, and so does one whose INFO was sent before another found
// it: those were made for calls sent before the restart was known. A
// connection to a sentinel (the Sentinel client's own) passes, as does one
// whose INFO Redis refuses (an ACL without it, a renamed command): its run
// id is unknown.
func (w *runIDWatch) onConnect(ctx context.Context, cn *redis.Conn) error {
	w.mu.Lock()
	noticed := w.noticed
	w.mu.Unlock()
	info, err := cn.Info(ctx, "server").Result()
	if err != nil {
		if _, refused := errors.AsType[redis.Error](err); refused {
			return nil
		}
		return fmt.Errorf("redis run id on connect: %w", err)
	}
	if infoValue(info, "redis_mode") == "sentinel" {
		return nil
	}
	id := infoValue(info, "run_id")
	if id == "" {
		return nil
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	was := w.known
	w.known = id
	switch {
	case was != "" && was != id:
		w.noticed++
		w.to.Restarted()
	case w.noticed != noticed:
		was = ""
	default:
		return nil
	}
	return &restartedError{was: was, now: id}
}

// infoValue returns field's value in an INFO reply, or "".
func infoValue(info, field string) string {
	for line := range strings.Lines(info) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), field+":"); ok {
			return v
		}
	}
	return ""
}
