package redisstore

import (
	"context"
	"fmt"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/flashgate/flashgate/window"
)

// TestClassifiedRedisErrors: the store marks go-redis's own errors with
// their kind, so window.Classify counts them without knowing Redis.
func TestClassifiedRedisErrors(t *testing.T) {
	for _, c := range []struct {
		err  error
		want window.ErrKind
	}{
		{classified(redis.ErrPoolTimeout), window.KindTimeout},
		{classified(fmt.Errorf("redis decide: %w", redis.ErrClosed)), window.KindConnection},
		{fmt.Errorf("master a: %w: %w", ErrMasterDown, classified(redis.ErrClosed)), window.KindMasterDown},
		{classified(fmt.Errorf("%w: %w", context.DeadlineExceeded, redis.ErrClosed)), window.KindTimeout},
		{clientClosed(classified(redis.ErrClosed)), window.KindClosed},
		{classified(redis.Nil), window.KindOther},
	} {
		if k := window.Classify(c.err); k != c.want {
			t.Errorf("Classify(%v) = %s, want %s", c.err, k, c.want)
		}
	}
}
