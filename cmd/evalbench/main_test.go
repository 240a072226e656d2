package main

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/flashgate/flashgate/window/redistest"
)

// TestRatelimitKind: -kind ratelimit sends ratelimit's INCRBY and EXPIRE per
// request and no script: one counter per fresh key, with a lifetime of the
// window, and one call counted per request.
func TestRatelimitKind(t *testing.T) {
	r := redistest.Start(t)
	var out bytes.Buffer
	if err := run(context.Background(), []string{"-addr", r.Addr(), "-kind", "ratelimit", "-n", "10", "-P", "4", "-window", "2000"}, &out); err != nil {
		t.Fatal(err)
	}
	if got := strings.TrimSpace(out.String()); got != "requests 10 calls 10" {
		t.Errorf("output %q, want requests 10 calls 10", got)
	}
	rdb := redis.NewClient(&redis.Options{Addr: r.Addr(), Protocol: 2})
	defer rdb.Close()
	ctx := context.Background()
	for _, k := range []string{"flashsale_uid_rl:0_1700000000", "flashsale_uid_rl:9_1700000000"} {
		if v, err := rdb.Get(ctx, k).Result(); err != nil || v != "1" {
			t.Errorf("%s = %q, %v: want 1", k, v, err)
		}
		if ttl, err := rdb.TTL(ctx, k).Result(); err != nil || ttl <= 0 || ttl.Seconds() > 2 {
			t.Errorf("%s TTL %s, %v: want up to 2s", k, ttl, err)
		}
	}
	if n, err := rdb.DBSize(ctx).Result(); err != nil || n != 10 {
		t.Errorf("%d keys, %v: want 10", n, err)
	}
	if err := run(context.Background(), []string{"-addr", r.Addr(), "-kind", "ratelimit", "-per", "2"}, &out); err == nil {
		t.Error("-kind ratelimit -per 2 accepted")
	}
}
