package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/flashgate/flashgate/internal/checkreq"
	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
)

// envoyShaped adds to s what Envoy's ext_authz filter really sends for a
// browser's request behind a load balancer: the pseudo-headers and
// x-request-id (checkreq.Build adds those), x-forwarded-*, tracing
// headers, a user agent, a 1 KB cookie, about twenty headers in all, and a
// per-route context_extensions entry. x-forwarded-for and
// x-envoy-external-address follow each user's IP.
func envoyShaped(s checkreq.Spec) checkreq.Spec {
	h := map[string]string{
		"user-agent":               "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0.0.0 Safari/537.36",
		"accept":                   "application/json, text/plain, */*",
		"accept-encoding":          "gzip, deflate, br, zstd",
		"accept-language":          "en-US,en;q=0.9,de;q=0.8",
		"content-type":             "application/json",
		"content-length":           "27",
		"origin":                   "https://shop.example",
		"referer":                  "https://shop.example/flash-sale/midnight",
		"cookie":                   "session=" + strings.Repeat("a1b2c3d4", 126),
		"x-forwarded-for":          "",
		"x-forwarded-proto":        "https",
		"x-forwarded-host":         "shop.example",
		"x-envoy-external-address": "",
		"x-b3-traceid":             "80f198ee56343ba864fe8b2a57d3eff7",
		"x-b3-spanid":              "e457b5a2e4d86bd1",
		"x-b3-sampled":             "0",
		"traceparent":              "00-80f198ee56343ba864fe8b2a57d3eff7-e457b5a2e4d86bd1-00",
		"sec-fetch-site":           "same-origin",
	}
	for k, v := range s.Headers {
		h[k] = v
	}
	s.Headers = h
	s.Host = "shop.example"
	s.Scheme = "https"
	s.ID = checkreq.NewID()
	s.ContextExtensions = map[string]string{"route": "coupon", "tenant": "shop"}
	return s
}

// costProbe reads the CPU time of the server under test (/proc/PID/stat)
// and Redis's CPU time and script calls (INFO) around a run, summed over
// every Redis given (a Cluster's masters).
type costProbe struct {
	pids  []int
	rdbs  []*redis.Client
	stats [2]costStats
}

type costStats struct {
	server   time.Duration
	redis    float64 // s
	scripts  int64
	commands int64
	conns    int64 // total_connections_received
}

func newCostProbe(ctx context.Context, o benchOptions) (*costProbe, error) {
	p := &costProbe{pids: o.serverPIDs}
	if o.redisAddr == "" {
		return p, nil
	}
	for _, addr := range strings.Split(o.redisAddr, ",") {
		rdb := redis.NewClient(&redis.Options{
			Addr: addr, DisableIdentity: true, Protocol: 2, MaxRetries: -1,
			DialTimeout: 2 * time.Second, ReadTimeout: 2 * time.Second,
			MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
		})
		p.rdbs = append(p.rdbs, rdb)
		if err := rdb.Ping(ctx).Err(); err != nil {
			p.close()
			return nil, fmt.Errorf("--redis-addr %s: %w", addr, err)
		}
	}
	return p, nil
}

func (p *costProbe) close() {
	for _, rdb := range p.rdbs {
		rdb.Close()
	}
}

func (p *costProbe) before(ctx context.Context) error { return p.read(ctx, &p.stats[0]) }
func (p *costProbe) after(ctx context.Context) error  { return p.read(ctx, &p.stats[1]) }

func (p *costProbe) read(ctx context.Context, s *costStats) error {
	var server time.Duration
	for _, pid := range p.pids {
		cpu, err := procCPU(pid)
		if err != nil {
			return fmt.Errorf("--server-pid %d: %w", pid, err)
		}
		server += cpu
	}
	*s = costStats{server: server}
	for _, rdb := range p.rdbs {
		info, err := rdb.Info(ctx, "cpu", "stats", "commandstats").Result()
		if err != nil {
			return fmt.Errorf("--redis-addr %s: INFO: %w", rdb.Options().Addr, err)
		}
		c := parseRedisCost(info)
		s.redis += c.cpu
		s.scripts += c.scripts
		s.commands += c.commands
		s.conns += c.conns
	}
	return nil
}

// report fills r's cost fields from the two readings.
func (p *costProbe) report(r *benchResult) {
	n := float64(max(r.Requests, 1))
	if len(p.pids) > 0 {
		r.ServerCPUS = (p.stats[1].server - p.stats[0].server).Seconds()
		r.ServerCPUPerCheck = r.ServerCPUS * 1e6 / n
	}
	if len(p.rdbs) > 0 {
		r.RedisCPUS = p.stats[1].redis - p.stats[0].redis
		r.RedisCPUPerCheck = r.RedisCPUS * 1e6 / n
		r.ScriptCalls = p.stats[1].scripts - p.stats[0].scripts
		r.ScriptCallsPerCheck = float64(r.ScriptCalls) / n
		// Less the probe's own INFO on each (the first counts itself).
		r.RedisCommands = p.stats[1].commands - p.stats[0].commands - int64(len(p.rdbs))
		r.RedisCommandsPerCheck = float64(r.RedisCommands) / n
	}
}

// redisCost is what parseRedisCost reads out of INFO.
type redisCost struct {
	cpu                      float64 // used_cpu_sys + used_cpu_user, s
	scripts, commands, conns int64
}

// parseRedisCost reads used_cpu_sys + used_cpu_user (s), the calls of
// EVALSHA and EVAL, total_commands_processed and
// total_connections_received out of INFO cpu, stats and commandstats.
func parseRedisCost(info string) (c redisCost) {
	sc := bufio.NewScanner(strings.NewReader(info))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if v, ok := strings.CutPrefix(line, "used_cpu_sys:"); ok {
			f, _ := strconv.ParseFloat(v, 64)
			c.cpu += f
		} else if v, ok := strings.CutPrefix(line, "used_cpu_user:"); ok {
			f, _ := strconv.ParseFloat(v, 64)
			c.cpu += f
		} else if rest, ok := strings.CutPrefix(line, "cmdstat_evalsha:calls="); ok {
			c.scripts += leadingInt(rest)
		} else if rest, ok := strings.CutPrefix(line, "cmdstat_eval:calls="); ok {
			c.scripts += leadingInt(rest)
		} else if rest, ok := strings.CutPrefix(line, "total_commands_processed:"); ok {
			c.commands = leadingInt(rest)
		} else if rest, ok := strings.CutPrefix(line, "total_connections_received:"); ok {
			c.conns = leadingInt(rest)
		}
	}
	return c
}

func leadingInt(s string) int64 {
	end := strings.IndexByte(s, ',')
	if end < 0 {
		end = len(s)
	}
	n, _ := strconv.ParseInt(s[:end], 10, 64)
	return n
}

// clockTicks is USER_HZ, the unit of /proc/PID/stat's times: 100 on every
// Linux architecture Go supports.
const clockTicks = 100

// procCPU returns the user + system CPU time of process pid from
// /proc/PID/stat (Linux).
func procCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, fmt.Errorf("read its CPU time: %w", err)
	}
	// The command name (field 2) is in parentheses and may hold spaces:
	// count fields after its closing one. utime and stime are fields 14, 15.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, errors.New("read its CPU time: /proc stat without a command name")
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 13 {
		return 0, errors.New("read its CPU time: /proc stat too short")
	}
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, fmt.Errorf("read its CPU time: %w", err)
	}
	return time.Duration(ut+st) * time.Second / clockTicks, nil
}
