package rls

import (
	"fmt"
	"math"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/flashgate/flashgate/enforce"
	"github.com/flashgate/flashgate/window"
	"github.com/flashgate/flashgate/window/memory"
	"github.com/flashgate/flashgate/window/redisstore"
	"github.com/flashgate/flashgate/window/redistest"
)

const (
	ok   = rlsv3.RateLimitResponse_OK
	over = rlsv3.RateLimitResponse_OVER_LIMIT
)

// desc builds a request descriptor from key, value pairs.
func desc(kv ...string) *ratelimitv3.RateLimitDescriptor {
	d := &ratelimitv3.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

// withLimit adds a per-descriptor limit override.
func withLimit(d *ratelimitv3.RateLimitDescriptor, n uint32, unit typev3.RateLimitUnit) *ratelimitv3.RateLimitDescriptor {
	d.Limit = &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: n, Unit: unit}
	return d
}

// withAddend sets a per-descriptor hits_addend.
func withAddend(d *ratelimitv3.RateLimitDescriptor, n uint64) *ratelimitv3.RateLimitDescriptor {
	d.HitsAddend = wrapperspb.UInt64(n)
	return d
}

// addend sets the request's hits_addend.
func addend(r *rlsv3.RateLimitRequest, n uint32) *rlsv3.RateLimitRequest {
	r.HitsAddend = n
	return r
}

func request(domain string, ds ...*ratelimitv3.RateLimitDescriptor) *rlsv3.RateLimitRequest {
	return &rlsv3.RateLimitRequest{Domain: domain, Descriptors: ds}
}

// st is an expected descriptor status: its code, its limit (0: none), and
// its remaining count (-1: not checked).
type st struct {
	code  rlsv3.RateLimitResponse_Code
	limit uint32
	rem   int64
}

// step is one request and the answer ratelimit documents for it; times
// repeats it (0 means once).
type step struct {
	req   *rlsv3.RateLimitRequest
	times int
	code  rlsv3.RateLimitResponse_Code
	sts   []st
}

// conformance is the table of ratelimit-shaped configs (testdata/good) and
// the outcomes ratelimit documents, every window a minute or longer so that
// no count depends on the speed of the machine.
var conformance = map[string][]step{
	"value-less key: a bucket per value": {
		{req: request("basic", desc("remote_address", "1.1.1.1")), times: 3, code: ok, sts: []st{{ok, 3, -1}}},
		{req: request("basic", desc("remote_address", "1.1.1.1")), code: over, sts: []st{{over, 3, 0}}},
		{req: request("basic", desc("remote_address", "2.2.2.2")), code: ok, sts: []st{{ok, 3, 2}}},
	},
	"exact value wins over the value-less key": {
		{req: request("basic", desc("remote_address", "10.0.0.1")), times: 5, code: ok, sts: []st{{ok, 5, -1}}},
		{req: request("basic", desc("remote_address", "10.0.0.1")), code: over, sts: []st{{over, 5, 0}}},
	},
	"requests_per_unit 0 blocks, and records nothing": {
		{req: request("basic", desc("remote_address", "50.0.0.5")), code: over, sts: []st{{over, 0, 0}}},
		// all or nothing: the blocked descriptor refused the request, so
		// the other one was not counted either
		{req: request("basic", desc("remote_address", "50.0.0.5"), desc("remote_address", "3.3.3.3")), times: 4, code: over, sts: []st{{over, 0, 0}, {ok, 0, 0}}},
		{req: request("basic", desc("remote_address", "3.3.3.3")), code: ok, sts: []st{{ok, 3, 2}}},
	},
	"remaining counts down": {
		{req: request("basic", desc("remote_address", "4.4.4.4")), code: ok, sts: []st{{ok, 3, 2}}},
		{req: request("basic", desc("remote_address", "4.4.4.4")), code: ok, sts: []st{{ok, 3, 1}}},
		{req: request("basic", desc("remote_address", "4.4.4.4")), code: ok, sts: []st{{ok, 3, 0}}},
		{req: request("basic", desc("remote_address", "4.4.4.4")), code: over, sts: []st{{over, 3, 0}}},
	},
	"nested descriptors": {
		{req: request("basic", desc("message_type", "marketing", "to_number", "2061111111")), times: 2, code: ok, sts: []st{{ok, 2, -1}}},
		{req: request("basic", desc("message_type", "marketing", "to_number", "2061111111")), code: over, sts: []st{{over, 2, 0}}},
		{req: request("basic", desc("message_type", "marketing", "to_number", "2062222222")), code: ok, sts: []st{{ok, 2, 1}}},
		// the placeholder level alone has no limit
		{req: request("basic", desc("message_type", "marketing")), times: 3, code: ok, sts: []st{{ok, 0, 0}}},
	},
	"depth must match the config": {
		{req: request("basic", desc("key", "value")), times: 5, code: ok, sts: []st{{ok, 0, 0}}},
		{req: request("basic", desc("key", "value", "subkey", "x", "extra", "y")), times: 5, code: ok, sts: []st{{ok, 0, 0}}},
		{req: request("basic", desc("key", "value", "subkey", "x")), times: 4, code: ok, sts: []st{{ok, 4, -1}}},
		{req: request("basic", desc("key", "value", "subkey", "x")), code: over, sts: []st{{over, 4, 0}}},
	},
	"no rule: OK without a limit": {
		{req: request("basic", desc("whitelisted", "x")), times: 5, code: ok, sts: []st{{ok, 0, 0}}},
		{req: request("basic", desc("nothing", "here")), times: 5, code: ok, sts: []st{{ok, 0, 0}}},
	},
	"unknown domain: OK": {
		{req: request("nope", desc("remote_address", "1.1.1.1"), withLimit(desc("a", "b"), 0, typev3.RateLimitUnit_MINUTE)), times: 5, code: ok, sts: []st{{ok, 0, 0}, {ok, 0, 0}}},
	},
	"several descriptors: over if any is over": {
		{req: request("basic", desc("remote_address", "5.5.5.5"), desc("message_type", "marketing", "to_number", "1")), times: 2, code: ok, sts: []st{{ok, 3, -1}, {ok, 2, -1}}},
		{req: request("basic", desc("remote_address", "5.5.5.5"), desc("message_type", "marketing", "to_number", "1")), code: over, sts: []st{{ok, 3, -1}, {over, 2, 0}}},
		// the denied request was recorded nowhere: the address has one left
		{req: request("basic", desc("remote_address", "5.5.5.5")), code: ok, sts: []st{{ok, 3, 0}}},
		{req: request("basic", desc("remote_address", "5.5.5.5")), code: over, sts: []st{{over, 3, 0}}},
	},
	"each descriptor's status is its own window's": {
		{req: request("basic", desc("remote_address", "6.6.6.6"), desc("message_type", "marketing", "to_number", "6")), code: ok, sts: []st{{ok, 3, 2}, {ok, 2, 1}}},
		{req: request("basic", desc("remote_address", "6.6.6.6"), desc("message_type", "marketing", "to_number", "6")), code: ok, sts: []st{{ok, 3, 1}, {ok, 2, 0}}},
		// denied on the number: the address, not counted, still has one left
		{req: request("basic", desc("remote_address", "6.6.6.6"), desc("message_type", "marketing", "to_number", "6")), code: over, sts: []st{{ok, 3, 1}, {over, 2, 0}}},
	},
	"wildcard: a bucket per value": {
		{req: request("wildcard", desc("path", "/api/a")), times: 2, code: ok, sts: []st{{ok, 2, -1}}},
		{req: request("wildcard", desc("path", "/api/a")), code: over, sts: []st{{over, 2, 0}}},
		{req: request("wildcard", desc("path", "/api/b")), code: ok, sts: []st{{ok, 2, 1}}},
	},
	"exact value wins over a wildcard, a wildcard over the key": {
		{req: request("wildcard", desc("path", "/api/special")), times: 5, code: ok, sts: []st{{ok, 5, -1}}},
		{req: request("wildcard", desc("path", "/other")), code: ok, sts: []st{{ok, 1, 0}}},
		{req: request("wildcard", desc("path", "/other")), code: over, sts: []st{{over, 1, 0}}},
	},
	"share_threshold: every matching value in one bucket": {
		{req: request("wildcard", desc("files", "files/a")), code: ok, sts: []st{{ok, 3, 2}}},
		{req: request("wildcard", desc("files", "files/b")), code: ok, sts: []st{{ok, 3, 1}}},
		{req: request("wildcard", desc("files", "files/c")), code: ok, sts: []st{{ok, 3, 0}}},
		{req: request("wildcard", desc("files", "files/d")), code: over, sts: []st{{over, 3, 0}}},
	},
	"unlimited": {
		{req: request("unlimited", desc("ldap", "x")), times: 10, code: ok, sts: []st{{ok, 0, math.MaxUint32}}},
		{req: request("unlimited", desc("azure", "x")), times: 2, code: ok, sts: []st{{ok, 2, -1}}},
		{req: request("unlimited", desc("azure", "x"), desc("ldap", "x")), code: over, sts: []st{{over, 2, 0}, {ok, 0, math.MaxUint32}}},
	},
	"shadow_mode: over, yet OK": {
		{req: request("shadow", desc("service", "auth", "user", "user-a")), times: 5, code: ok, sts: []st{{ok, 2, -1}}},
		{req: request("shadow", desc("service", "auth", "user", "user-b")), times: 2, code: ok, sts: []st{{ok, 2, -1}}},
		{req: request("shadow", desc("service", "auth", "user", "user-b")), code: over, sts: []st{{over, 2, 0}}},
	},
	"replaces": {
		// (key_1, user) alone: 2
		{req: request("replaces", desc("key_1", "value_1", "user", "bkthomps")), code: ok, sts: []st{{ok, 2, 1}}},
		// both: the replaced limit is neither checked nor counted
		{req: request("replaces", desc("key_1", "value_1", "user", "bkthomps"), desc("key_2", "value_2", "user", "bkthomps")), times: 3, code: ok, sts: []st{{ok, 0, 0}, {ok, 4, -1}}},
		{req: request("replaces", desc("key_1", "value_1", "user", "bkthomps")), code: ok, sts: []st{{ok, 2, 0}}},
		{req: request("replaces", desc("key_2", "value_2", "user", "bkthomps")), code: ok, sts: []st{{ok, 4, 0}}},
		{req: request("replaces", desc("key_2", "value_2", "user", "bkthomps")), code: over, sts: []st{{over, 4, 0}}},
	},
	"units and unit_multiplier": {
		{req: request("units", desc("per", "hour")), times: 2, code: ok, sts: []st{{ok, 2, -1}}},
		{req: request("units", desc("per", "hour")), code: over, sts: []st{{over, 2, 0}}},
		{req: request("units", desc("per", "week")), times: 2, code: ok, sts: []st{{ok, 2, -1}}},
		{req: request("units", desc("per", "week")), code: over, sts: []st{{over, 2, 0}}},
		{req: request("units", desc("per", "five_minutes")), times: 2, code: ok, sts: []st{{ok, 2, -1}}},
		{req: request("units", desc("per", "five_minutes")), code: over, sts: []st{{over, 2, 0}}},
	},
	"hits_addend: the request's, all or nothing": {
		{req: addend(request("basic", desc("remote_address", "8.8.8.8")), 2), code: ok, sts: []st{{ok, 3, 1}}},
		// 2 more do not fit in the 1 left: refused, nothing recorded
		{req: addend(request("basic", desc("remote_address", "8.8.8.8")), 2), code: over, sts: []st{{over, 3, 0}}},
		{req: addend(request("basic", desc("remote_address", "8.8.8.8")), 0), code: ok, sts: []st{{ok, 3, 0}}},
		// more than the limit never fits
		{req: addend(request("basic", desc("remote_address", "8.8.4.4")), 4), code: over, sts: []st{{over, 3, 0}}},
	},
	"hits_addend: a descriptor's own wins over the request's": {
		{req: addend(request("basic", withAddend(desc("remote_address", "9.9.9.9"), 3), desc("remote_address", "9.9.4.4")), 2), code: ok, sts: []st{{ok, 3, 0}, {ok, 3, -1}}},
		{req: request("basic", desc("remote_address", "9.9.4.4")), code: ok, sts: []st{{ok, 3, 0}}},
		{req: request("basic", desc("remote_address", "9.9.9.9")), code: over, sts: []st{{over, 3, 0}}},
	},
	"replaces leaves an unlimited rule unlimited": {
		{req: request("replaces", desc("vip", "x"), desc("vip_cap", "x")), code: ok, sts: []st{{ok, 0, math.MaxUint32}, {ok, 1, 0}}},
	},
	"hits_addend beyond any window: refused, nothing recorded": {
		{req: request("basic", withAddend(withLimit(desc("remote_address", "1.2.3.4"), window.MaxRequests, typev3.RateLimitUnit_MINUTE), 2*window.MaxRequests)),
			code: over, sts: []st{{over, window.MaxRequests, 0}}},
		{req: request("basic", withLimit(desc("remote_address", "1.2.3.4"), window.MaxRequests, typev3.RateLimitUnit_MINUTE)),
			code: ok, sts: []st{{ok, window.MaxRequests, window.MaxRequests - 1}}},
	},
	"a descriptor without entries: no limit, even with an override": {
		{req: request("basic", withLimit(desc(), 0, typev3.RateLimitUnit_MINUTE), desc("remote_address", "1.2.3.5")), code: ok, sts: []st{{ok, 0, 0}, {ok, 3, 2}}},
	},
	"flashgate's {requests, window}": {
		{req: request("flashgate", desc("api_key", "k1")), code: ok, sts: []st{{ok, 2, 1}}},
		{req: request("flashgate", desc("api_key", "k1")), code: ok, sts: []st{{ok, 2, 0}}},
		{req: request("flashgate", desc("api_key", "k1")), code: over, sts: []st{{over, 2, 0}}},
		{req: request("flashgate", desc("tenant", "t", "user", "u")), times: 2, code: ok, sts: []st{{ok, 2, -1}}},
		{req: request("flashgate", desc("tenant", "t", "user", "u")), code: over, sts: []st{{over, 2, 0}}},
	},
	"request limit override": {
		// overrides the config's 3 a minute
		{req: request("basic", withLimit(desc("remote_address", "6.6.6.6"), 1, typev3.RateLimitUnit_MINUTE)), code: ok, sts: []st{{ok, 1, 0}}},
		{req: request("basic", withLimit(desc("remote_address", "6.6.6.6"), 1, typev3.RateLimitUnit_MINUTE)), code: over, sts: []st{{over, 1, 0}}},
		// applies where the config has no rule too
		{req: request("basic", withLimit(desc("anything", "x"), 1, typev3.RateLimitUnit_HOUR)), code: ok, sts: []st{{ok, 1, 0}}},
		{req: request("basic", withLimit(desc("anything", "x"), 1, typev3.RateLimitUnit_HOUR)), code: over, sts: []st{{over, 1, 0}}},
		// one flashgate cannot enforce (a year) falls back to the config
		{req: request("basic", withLimit(desc("remote_address", "7.7.7.7"), 1, typev3.RateLimitUnit_YEAR)), code: ok, sts: []st{{ok, 3, 2}}},
	},
}

// backend builds a fresh limiter for one case: keys of its own.
type backend struct {
	name string
	new  func(t *testing.T) window.Limiter
}

func backends(t *testing.T) []backend {
	_, red := startRedis(t, 2*time.Second)
	return []backend{
		{"memory", func(t *testing.T) window.Limiter {
			m, err := memory.New(memory.Options{})
			if err != nil {
				t.Fatal(err)
			}
			return m
		}},
		{"redis", func(*testing.T) window.Limiter { return red }},
	}
}

// startRedis starts a redis-server and a Redis limiter on it with the
// client timeout given; both end with the test.
func startRedis(t *testing.T, timeout time.Duration) (*redistest.Server, *redisstore.Redis) {
	t.Helper()
	rs := redistest.Start(t)
	client, err := redisstore.NewClient(redisstore.ClientConfig{Addrs: []string{rs.Addr()}, Timeout: timeout})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Close() })
	red, err := redisstore.New(client, redisstore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(red.Close)
	return rs, red
}

func TestConformance(t *testing.T) {
	cfg, err := LoadDir("testdata/good")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			for name, calls := range conformance {
				n++
				keys, err := window.NewKeys(fmt.Sprintf("c%d", n)) // a key space per case
				if err != nil {
					t.Fatal(err)
				}
				t.Run(name, func(t *testing.T) {
					core, err := enforce.New(enforce.Options{Limiter: b.new(t), Registerer: prometheus.NewRegistry()})
					if err != nil {
						t.Fatal(err)
					}
					s, err := NewServer(cfg, Options{Core: core, Keys: keys})
					if err != nil {
						t.Fatal(err)
					}
					run(t, s, calls)
				})
			}
		})
	}
}

func checkResponse(t *testing.T, what string, resp *rlsv3.RateLimitResponse, c step) {
	t.Helper()
	if resp.GetOverallCode() != c.code {
		t.Fatalf("%s: overall %s, want %s; statuses %v", what, resp.GetOverallCode(), c.code, resp.GetStatuses())
	}
	if len(resp.GetStatuses()) != len(c.sts) {
		t.Fatalf("%s: %d statuses, want %d", what, len(resp.GetStatuses()), len(c.sts))
	}
	for i, w := range c.sts {
		got := resp.GetStatuses()[i]
		if got.GetCode() != w.code || got.GetCurrentLimit().GetRequestsPerUnit() != w.limit ||
			w.rem >= 0 && int64(got.GetLimitRemaining()) != w.rem {
			t.Fatalf("%s: status %d = {%s limit %d remaining %d}, want {%s limit %d remaining %d}", what, i,
				got.GetCode(), got.GetCurrentLimit().GetRequestsPerUnit(), got.GetLimitRemaining(), w.code, w.limit, w.rem)
		}
		if w.limit > 0 && (got.GetCurrentLimit() == nil) {
			t.Fatalf("%s: status %d has no current_limit", what, i)
		}
		// A limit's reset: whole seconds, at least 1, at most its window
		// (a week, the longest here).
		if d := got.GetDurationUntilReset(); got.GetCurrentLimit() != nil && (d.GetNanos() != 0 || d.GetSeconds() < 1 || d.GetSeconds() > 7*24*3600) {
			t.Fatalf("%s: status %d duration_until_reset %v, want whole seconds from 1 to a week", what, i, d.AsDuration())
		}
	}
}
