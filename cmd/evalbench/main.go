package main

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
)

func main() {
	if err := run(context.Background(), os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "evalbench:", err)
		os.Exit(1)
	}
}

type config struct {
	addr, kind, script string
	conns, depth, per  int
	keys               int
	n, keyRange        int64
	limit, windowMS    int64
	step               int64
	cpu                bool
}

func run(ctx context.Context, args []string, stdout io.Writer) error {
	var c config
	fs := flag.NewFlagSet("evalbench", flag.ContinueOnError)
	fs.StringVar(&c.addr, "addr", "127.0.0.1:6379", "Redis address")
	fs.StringVar(&c.kind, "kind", "flashgate", "flashgate (window/redisstore/redis.lua's arguments), textbook (../shared/reference's), empty (flashgate's arguments to `return 1`) or ratelimit (no script: envoyproxy/ratelimit's INCRBY and EXPIRE of a fixed window's counter per request, pipelined)")
	fs.StringVar(&c.script, "script", "", "the script's path (default: window/redisstore/redis.lua for flashgate, ../shared/reference/sliding_window.lua for textbook)")
	fs.IntVar(&c.conns, "c", 1, "connections")
	fs.IntVar(&c.depth, "P", 1, "script calls in flight per connection")
	fs.IntVar(&c.per, "per", 1, "requests per call (flashgate only)")
	fs.IntVar(&c.keys, "keys", 1, "keys per request, <key>:0 … <key>:K-1, key j limited to -limit + j (flashgate only: its several-keys path)")
	fs.Int64Var(&c.n, "n", 10000, "requests in all")
	fs.Int64Var(&c.keyRange, "range", 0, "keys: rl:<random below range>; 0: a fresh key per request")
	fs.Int64Var(&c.limit, "limit", 5, "the limit")
	fs.Int64Var(&c.windowMS, "window", 1000, "the window in ms")
	fs.Int64Var(&c.step, "step", 0, "flashgate only: request i passes now = a fixed instant + i*step µs and hits rl:<i mod range> (0: Redis TIME, random keys)")
	fs.BoolVar(&c.cpu, "cpu", false, "print Redis's CPU per request (INFO cpu over the run)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if c.conns < 1 || c.depth < 1 || c.per < 1 || c.keys < 1 || c.n < 1 || c.limit < 1 || c.windowMS < 1 {
		return errors.New("-c, -P, -per, -keys, -n, -limit and -window must be at least 1")
	}
	if c.kind == "ratelimit" && c.per > 1 {
		return errors.New("-per above 1 needs a script: -kind ratelimit sends two commands per request")
	}
	if c.keys > 1 && c.kind != "flashgate" {
		return errors.New("-keys above 1 needs -kind flashgate (the textbook script takes one key)")
	}
	if c.step < 0 || c.step > 0 && (c.kind != "flashgate" || c.keyRange < 1) {
		return errors.New("-step needs -kind flashgate and -range of at least 1")
	}
	src, err := c.source()
	if err != nil {
		return err
	}
	admin, err := dial(ctx, c.addr)
	if err != nil {
		return err
	}
	defer admin.close()
	var sha string
	if c.kind != "ratelimit" {
		if sha, err = admin.do("SCRIPT", "LOAD", src); err != nil {
			return fmt.Errorf("script load: %w", err)
		}
	}
	var before float64
	if c.cpu {
		if before, err = admin.cpu(); err != nil {
			return err
		}
	}
	var (
		next  atomic.Int64 // requests handed out
		calls atomic.Int64
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
	)
	conns := make([]*conn, c.conns) // all dialled before the first call goes out
	for i := range conns {
		cn, err := dial(ctx, c.addr)
		if err != nil {
			return err
		}
		defer cn.close()
		conns[i] = cn
	}
	for _, cn := range conns {
		wg.Go(func() {
			if err := c.drive(cn, sha, &next, &calls); err != nil {
				mu.Lock()
				first = firstErr(first, err)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if first != nil {
		return first
	}
	reqs := min(next.Load(), c.n)
	fmt.Fprintf(stdout, "requests %d calls %d", reqs, calls.Load())
	if c.cpu {
		after, err := admin.cpu()
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, " redis-cpu-us-per-request %.2f", (after-before)/float64(reqs)*1e6)
	}
	fmt.Fprintln(stdout)
	return nil
}

func firstErr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

func (c *config) source() (string, error) {
	path := c.script
	switch c.kind {
	case "empty":
		return "return 1", nil
	case "ratelimit":
		return "", nil
	case "flashgate":
		if path == "" {
			path = "window/redisstore/redis.lua"
		}
	case "textbook":
		if path == "" {
			path = "../shared/reference/sliding_window.lua"
		}
	default:
		return "", fmt.Errorf("-kind %q: want flashgate, textbook, empty or ratelimit", c.kind)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("the script: %w", err)
	}
	return string(b), nil
}

// drive sends calls on one connection until n requests are handed out.
func (c *config) drive(cn *conn, sha string, next, calls *atomic.Int64) error {
	specs := make([]string, c.keys)
	for j := range specs {
		specs[j] = c.spec(c.limit + int64(j))
	}
	per := int64(c.per)
	if c.kind != "flashgate" {
		per = 1
	}
	rng := rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64()))
	key := func(i int64) string {
		switch {
		case c.step > 0:
			i %= c.keyRange
		case c.keyRange > 0:
			i = rng.Int64N(c.keyRange)
		}
		return "rl:" + strconv.FormatInt(i, 10)
	}
	// now: "" for Redis TIME, else a fixed instant (2023-11-14) plus i steps.
	now := func(i int64) string {
		if c.step == 0 {
			return ""
		}
		return strconv.FormatInt(1_700_000_000_000_000+i*c.step, 10)
	}
	// ratelimit's key: the descriptor and the fixed window's start, in s.
	window := strconv.FormatInt(max(c.windowMS/1000, 1), 10)
	for {
		sent := 0
		for range c.depth {
			from := next.Add(per) - per
			if from >= c.n {
				break
			}
			if c.kind == "ratelimit" {
				k := "flashsale_uid_" + key(from) + "_1700000000"
				cn.write("INCRBY", k, "1")
				cn.write("EXPIRE", k, window)
				sent += 2
				continue
			}
			m := min(per, c.n-from)
			args := []string{"EVALSHA", sha, strconv.FormatInt(m*int64(len(specs)), 10)}
			var argv []string
			for i := from; i < from+m; i++ {
				k := key(i)
				member := "m:" + strconv.FormatInt(i, 10)
				switch c.kind {
				case "textbook":
					args = append(args, k)
					argv = append(argv, "0", strconv.FormatInt(c.windowMS, 10), strconv.FormatInt(c.limit, 10), member)
				default:
					argv = append(argv, member, now(i), strconv.Itoa(len(specs)))
					for j, s := range specs {
						if len(specs) == 1 {
							args = append(args, k)
						} else {
							args = append(args, k+":"+strconv.Itoa(j))
						}
						argv = append(argv, s)
					}
				}
			}
			cn.write(append(args, argv...)...)
			sent++
		}
		if sent == 0 {
			return nil
		}
		if err := cn.w.Flush(); err != nil {
			return fmt.Errorf("write: %w", err)
		}
		for range sent {
			if _, err := cn.reply(); err != nil {
				return err
			}
		}
		if c.kind == "ratelimit" {
			sent /= 2 // a request's two commands
		}
		calls.Add(int64(sent))
	}
}

// spec is a hit spec of limit as window's appendHitArgs writes it: limit,
// window (µs), cost 1, not shadow, exact, little-endian as struct
// '<I4I8I4BI4', then the lifetime in ms in decimal.
func (c *config) spec(limit int64) string {
	b := binary.LittleEndian.AppendUint32(nil, uint32(limit))
	b = binary.LittleEndian.AppendUint64(b, uint64(c.windowMS*1000))
	b = binary.LittleEndian.AppendUint32(b, 1)
	b = append(b, 0)
	b = binary.LittleEndian.AppendUint32(b, 0)
	return string(strconv.AppendInt(b, c.windowMS, 10))
}

// conn is one RESP connection.
type conn struct {
	c net.Conn
	r *bufio.Reader
	w *bufio.Writer
}

func dial(ctx context.Context, addr string) (*conn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", addr, err)
	}
	return &conn{c: c, r: bufio.NewReaderSize(c, 1<<16), w: bufio.NewWriterSize(c, 1<<16)}, nil
}

func (c *conn) close() { _ = c.c.Close() }

func (c *conn) write(args ...string) {
	fmt.Fprintf(c.w, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(c.w, "$%d\r\n%s\r\n", len(a), a)
	}
}

// do sends one command and returns its reply if it is a string or integer.
func (c *conn) do(args ...string) (string, error) {
	c.write(args...)
	if err := c.w.Flush(); err != nil {
		return "", err
	}
	return c.reply()
}

func (c *conn) line() (string, error) {
	l, err := c.r.ReadString('\n')
	if err != nil {
		return "", fmt.Errorf("read: %w", err)
	}
	return strings.TrimSuffix(l, "\r\n"), nil
}

// reply reads one reply of any shape and returns it if it is a status,
// integer or bulk string ("" for an array, whose elements it reads); an
// error reply is an error.
func (c *conn) reply() (string, error) {
	l, err := c.line()
	if err != nil {
		return "", err
	}
	if l == "" {
		return "", errors.New("empty reply line")
	}
	switch l[0] {
	case '-':
		return "", fmt.Errorf("redis: %s", l[1:])
	case '+', ':':
		return l[1:], nil
	case '$', '*':
		n, err := strconv.Atoi(l[1:])
		if err != nil {
			return "", fmt.Errorf("reply %q", l)
		}
		if l[0] == '*' {
			for range max(n, 0) {
				if _, err := c.reply(); err != nil {
					return "", err
				}
			}
			return "", nil
		}
		if n < 0 {
			return "", nil
		}
		b := make([]byte, n+2)
		if _, err := io.ReadFull(c.r, b); err != nil {
			return "", fmt.Errorf("read: %w", err)
		}
		return string(b[:n]), nil
	}
	return "", fmt.Errorf("unexpected reply %q", l)
}

// cpu returns Redis's CPU seconds (used_cpu_sys + used_cpu_user).
func (c *conn) cpu() (float64, error) {
	info, err := c.do("INFO", "cpu")
	if err != nil {
		return 0, fmt.Errorf("info cpu: %w", err)
	}
	var s float64
	for l := range strings.SplitSeq(info, "\r\n") {
		k, v, ok := strings.Cut(l, ":")
		if ok && (k == "used_cpu_sys" || k == "used_cpu_user") {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				return 0, fmt.Errorf("info cpu %s: %w", k, err)
			}
			s += f
		}
	}
	return s, nil
}
