package redisstore

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/redis/go-redis/v9"
)

// The followers of a fleet-wide list (bans: Subscriber; overrides:
// Follower) share how they listen to its channel: subscribe, receive with
// a timeout, and on a failure back off before the next receive reconnects.

// subscribeTo subscribes to channel on client; a receive does not watch ctx,
// so ctx's end closes the subscription. stop releases it.
func subscribeTo(ctx context.Context, client redis.UniversalClient, channel string) (ps *redis.PubSub, stop func()) {
	ps = client.Subscribe(ctx, channel)
	unwatch := context.AfterFunc(ctx, func() { _ = ps.Close() })
	return ps, func() { unwatch(); _ = ps.Close() }
}

// received is what a receive came to.
type received uint8

const (
	// recvMessage: a message (a subscription's confirmation, a pong, a
	// message on the channel).
	recvMessage received = iota
	// recvTimeout: nothing within the wait.
	recvTimeout
	// recvLost: the connection failed; the next receive reconnects and
	// subscribes again.
	recvLost
	// recvDone: ctx ended.
	recvDone
)

// receive waits up to wait for ps's next message. A failure but a timeout
// is reported to fail, prefixed by what; receive then sleeps *pause and
// doubles it, within syncBackoffMax (recvLost).
func receive(ctx context.Context, ps *redis.PubSub, wait time.Duration, pause *time.Duration, fail func(error), what string) (any, received) {
	msg, err := ps.ReceiveTimeout(ctx, wait)
	if ctx.Err() != nil {
		return nil, recvDone
	}
	var ne net.Error
	switch {
	case err == nil:
		return msg, recvMessage
	case errors.As(err, &ne) && ne.Timeout():
		return nil, recvTimeout
	}
	fail(fmt.Errorf("%s: subscribe: %w", what, err))
	if !sleep(ctx, *pause) {
		return nil, recvDone
	}
	*pause = min(2**pause, syncBackoffMax)
	return nil, recvLost
}
