package redisstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"

	"github.com/redis/go-redis/v9"
)

// script is a Lua script run by its SHA-1 (EVALSHA). After NOSCRIPT (Redis
// restarted, failed over, or SCRIPT FLUSH) one caller loads it again (SCRIPT
// LOAD) for every caller that met NOSCRIPT meanwhile, and they run EVALSHA
// again; where the load failed or missed the key's node (a Cluster node
// down, a Ring shard), EVAL, which caches it on exactly that node.
//
// It is go-redis's Script.Run with the load shared, and pipelined where a
// decision makes one call per key: Script.Run sends EVAL with the body from
// every caller that meets NOSCRIPT, and the decision script is about 25 KB,
// so every check of a burst after a restart would send (and make Redis
// hash) a copy; TestRedisNoScriptReloadsOnce holds the one SCRIPT LOAD.
type script struct {
	body, hash string
	// crossSlot: the body is crossSlotLua's, and calls are mapped by
	// clusterCall.
	crossSlot bool
	// loading (capacity 1) is held by the one caller reloading the script;
	// loads counts the loads that succeeded.
	loading chan struct{}
	loads   atomic.Uint64
}

func newScript(body string) *script {
	return &script{body: body, hash: redis.NewScript(body).Hash(), loading: make(chan struct{}, 1)}
}

// newCrossSlotScript returns crossSlotLua's variant of body.
func newCrossSlotScript(body string) (*script, error) {
	cross, err := crossSlotLua(body)
	if err != nil {
		return nil, err
	}
	s := newScript(cross)
	s.crossSlot = true
	return s, nil
}

// scriptCall is the keys and arguments of one script call.
type scriptCall struct {
	keys []string
	args []any
}

// reload loads the script once for all the callers that met NOSCRIPT
// together: seen is s.loads as the caller read it before its EVALSHA; if a
// load completed since, the caller just tries again.
func (s *script) reload(ctx context.Context, c Client, seen uint64) error {
	select {
	case s.loading <- struct{}{}:
	case <-ctx.Done():
		return fmt.Errorf("script load after NOSCRIPT: %w", ctx.Err())
	}
	defer func() { <-s.loading }()
	if s.loads.Load() != seen {
		return nil
	}
	if err := c.ScriptLoad(ctx, s.body).Err(); err != nil {
		return fmt.Errorf("script load after NOSCRIPT: %w", err)
	}
	s.loads.Add(1)
	return nil
}

// eval runs the script once.
func (s *script) eval(ctx context.Context, c Client, keys []string, args []any) ([]any, error) {
	if s.crossSlot {
		keys, args = clusterCall(keys, args)
	}
	seen := s.loads.Load()
	res, err := c.EvalSha(ctx, s.hash, keys, args...).Slice()
	if !isNoScript(err) {
		return res, err
	}
	if s.reload(ctx, c, seen) == nil {
		res, err = c.EvalSha(ctx, s.hash, keys, args...).Slice()
		if !isNoScript(err) {
			return res, err
		}
	}
	if ctx.Err() != nil {
		return nil, fmt.Errorf("script after NOSCRIPT: %w", ctx.Err())
	}
	return c.Eval(ctx, s.body, keys, args...).Slice()
}

// evalEach runs the script once per call, all pipelined, and returns each
// call's command, its reply or error to be read.
func (s *script) evalEach(ctx context.Context, c Client, calls []scriptCall) []*redis.Cmd {
	if s.crossSlot {
		mapped := make([]scriptCall, len(calls))
		for i, call := range calls {
			mapped[i].keys, mapped[i].args = clusterCall(call.keys, call.args)
		}
		calls = mapped
	}
	seen := s.loads.Load()
	cmds := make([]*redis.Cmd, len(calls))
	pipe := c.Pipeline()
	for i, call := range calls {
		cmds[i] = pipe.EvalSha(ctx, s.hash, call.keys, call.args...)
	}
	_, _ = pipe.Exec(ctx) // errors are read per command
	for pass := 0; pass < 2; pass++ {
		var retry redis.Pipeliner
		loaded := pass == 0 && slices.ContainsFunc(cmds, func(c *redis.Cmd) bool { return isNoScript(c.Err()) }) &&
			s.reload(ctx, c, seen) == nil
		for i, cmd := range cmds {
			if !isNoScript(cmd.Err()) {
				continue
			}
			if retry == nil {
				retry = c.Pipeline()
			}
			if loaded {
				cmds[i] = retry.EvalSha(ctx, s.hash, calls[i].keys, calls[i].args...)
			} else {
				cmds[i] = retry.Eval(ctx, s.body, calls[i].keys, calls[i].args...)
			}
		}
		if retry == nil {
			break
		}
		_, _ = retry.Exec(ctx)
	}
	return cmds
}

func isNoScript(err error) bool {
	return err != nil && (errors.Is(err, redis.ErrNoScript) || redis.HasErrorPrefix(err, "NOSCRIPT"))
}
