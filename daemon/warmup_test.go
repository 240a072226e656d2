package daemon

import (
	"context"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashgate/flashgate/enforce"
	"github.com/flashgate/flashgate/internal/testing/logtest"
	"github.com/flashgate/flashgate/window"
	"github.com/flashgate/flashgate/window/redisstore"
	"github.com/flashgate/flashgate/window/redistest"
)

// servingFlag records what waitBackend sets.
type servingFlag struct {
	mu      sync.Mutex
	serving bool
}

func (s *servingFlag) SetServing(v bool) { s.mu.Lock(); s.serving = v; s.mu.Unlock() }
func (s *servingFlag) get() bool         { s.mu.Lock(); defer s.mu.Unlock(); return s.serving }

// checkConns returns the ids of the connections of the checks' pool
// (named flashgate) that Redis holds, sorted.
func checkConns(t *testing.T, admin *redis.Client) []string {
	t.Helper()
	list, err := admin.ClientList(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for line := range strings.SplitSeq(strings.TrimSpace(list), "\n") {
		if !strings.Contains(" "+line+" ", " name="+redisstore.ClientName+" ") {
			continue
		}
		for f := range strings.FieldsSeq(line) {
			if id, ok := strings.CutPrefix(f, "id="); ok {
				ids = append(ids, id)
			}
		}
	}
	slices.Sort(ids)
	return ids
}

// TestWarmBackendOutlivesIdleCut: once warm, a Redis backend keeps the
// floor of its checks' connections through a quiet spell longer than an
// idle cut-off between it and Redis (here Redis's own timeout): the floor
// is still open after it, so that the first checks after the spell find
// them ready.
func TestWarmBackendOutlivesIdleCut(t *testing.T) {
	rs := redistest.Start(t)
	admin := redis.NewClient(&redis.Options{Addr: rs.Addr(), Protocol: 2})
	defer admin.Close()
	ctx := context.Background()
	const cut = 2 // s: Redis closes a connection idle this long
	if err := admin.ConfigSet(ctx, "timeout", "2").Err(); err != nil {
		t.Fatal(err)
	}
	keys, err := window.NewKeys("warm")
	if err != nil {
		t.Fatal(err)
	}
	o := &Options{
		Backend: BackendRedis, Redis: redisstore.ClientConfig{Addrs: []string{rs.Addr()}, Timeout: time.Second},
		RedisTimeout: time.Second, RedisAutoPipeline: true, Keys: keys,
		FleetSize: 1, BreakerFailures: -1, FailureMode: enforce.FailureLocal, Ban: window.DefaultBan,
		LocalCacheSize: 1 << 20, Clock: redisstore.ClockRedis,
	}
	log := slog.New(slog.NewTextHandler(&logtest.Buffer{}, nil))
	b, err := newBackend(o, "warm", log)
	if err != nil {
		t.Fatal(err)
	}
	defer b.close()
	wctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	srv := &servingFlag{}
	wg.Go(func() { b.run(wctx, log) }) // the fleet bans' subscriber, which the warm-up waits for
	wg.Go(func() { waitBackend(wctx, srv, b, &warmup{keepEvery: 100 * time.Millisecond}, "local", log) })
	defer func() { cancel(); wg.Wait() }()
	waitFor(t, eventually, "SERVING", srv.get)
	var before []string
	waitFor(t, eventually, "the floor of idle connections", func() bool {
		before = checkConns(t, admin)
		return len(before) >= redisstore.DefaultMinIdleConns
	})
	// The quiet spell: no check for well over the cut.
	time.Sleep(5 * cut * time.Second / 2)
	// Redis has cut every connection idle past its timeout; the floor is
	// still open. (A keep-warm round on a loaded machine may dial one anew
	// while another is out, leaving the oldest idle to be cut: the ids may
	// change, the floor may not.)
	after := checkConns(t, admin)
	if len(after) < redisstore.DefaultMinIdleConns {
		t.Errorf("the checks' connections after a quiet spell of 2.5 × Redis's timeout: %v (before it: %v), want at least the floor of %d open", after, before, redisstore.DefaultMinIdleConns)
	} else if !slices.Equal(after, before) {
		t.Logf("the checks' connections changed over the quiet spell: %v, then %v", before, after)
	}
}
