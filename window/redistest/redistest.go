// Package redistest starts real redis-server processes for tests: a single
// server on a free loopback port, or a Redis Cluster of several masters.
//
// Every server runs with persistence off (--save "" --appendonly no) in a
// directory under t.TempDir() and is killed by t.Cleanup. When redis-server is
// not on PATH, Start and StartCluster fail the test with a one-line hint: Redis
// tests never skip.
//
// Servers and clusters are safe for concurrent use by the goroutines of one
// test; Kill, Stop and Restart must not race with each other.
package redistest

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
)

// startTimeout bounds how long a server may take to answer PING.
const startTimeout = 10 * time.Second

// portAttempts is how many free ports are tried when a bind fails.
const portAttempts = 10

// Server is one redis-server process on a loopback TCP port.
type Server struct {
	t        testing.TB
	dir      string
	args     []string // extra arguments after the defaults
	sentinel string   // for a sentinel: the config file Sentinel rewrites

	// mu guards the fields below.
	mu   sync.Mutex
	port int
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd has been waited for
	log  string        // path of the server's log file
}

// Start runs redis-server on a free loopback port with persistence off,
// waits until it answers PING, and kills it in t.Cleanup. It fails the test
// (never skips) when redis-server is missing or will not start.
func Start(t testing.TB) *Server {
	t.Helper()
	return start(t, t.TempDir(), nil)
}

func start(t testing.TB, dir string, extra []string) *Server {
	t.Helper()
	return startServer(t, &Server{t: t, dir: dir, args: extra})
}

func startServer(t testing.TB, s *Server) *Server {
	t.Helper()
	bin := lookPath(t)
	t.Cleanup(s.Kill)
	var errs []error
	for range portAttempts {
		port, err := freePort(s.clusterEnabled())
		if err != nil {
			errs = append(errs, err)
			continue
		}
		err = s.launch(bin, port)
		if err == nil {
			return s
		}
		errs = append(errs, err)
	}
	t.Fatalf("redistest: could not start redis-server after %d attempts: %v", portAttempts, errors.Join(errs...))
	return nil
}

func lookPath(t testing.TB) string {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Fatalf("redistest: redis-server is not on PATH: install it (Debian: apt-get install redis-server) or run 'make test'")
	}
	return bin
}

// launch starts the process on port and waits for PING. On failure the
// process is killed and the error says why (with the log's tail).
func (s *Server) launch(bin string, port int) error {
	logPath := filepath.Join(s.dir, fmt.Sprintf("redis-%d.log", port))
	var args []string
	if s.sentinel != "" {
		args = append(args, s.sentinel, "--sentinel")
	} else {
		args = append(args, "--save", "", "--appendonly", "no")
	}
	args = append(args,
		"--port", strconv.Itoa(port),
		"--bind", "127.0.0.1",
		"--dir", s.dir,
		"--logfile", logPath,
		"--daemonize", "no",
	)
	if s.clusterEnabled() {
		args = append(args, "--cluster-port", strconv.Itoa(clusterBusPort(port)))
	}
	args = append(args, s.args...)
	cmd := exec.Command(bin, args...)
	cmd.SysProcAttr = sysProcAttr()
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start redis-server: %w", err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()

	s.mu.Lock()
	s.port, s.cmd, s.done, s.log = port, cmd, done, logPath
	s.mu.Unlock()

	if err := waitPing(port, cmd.Process.Pid, done); err != nil {
		s.Kill()
		return fmt.Errorf("redis-server on port %d: %w; log: %s", port, err, tail(logPath))
	}
	return nil
}

func (s *Server) clusterEnabled() bool {
	for _, a := range s.args {
		if a == "--cluster-enabled" {
			return true
		}
	}
	return false
}

// waitPing polls the server until it answers as process pid (not some other
// server that won a race for the port), it exits, or startTimeout.
func waitPing(port, pid int, exited <-chan struct{}) error {
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	deadline := time.Now().Add(startTimeout)
	for {
		select {
		case <-exited:
			return errors.New("exited during start")
		default:
		}
		if err := ping(addr, pid); err == nil {
			return nil
		} else if time.Now().After(deadline) {
			return fmt.Errorf("no PING reply within %s: %w", startTimeout, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// ping asks addr for INFO server over a fresh connection and checks that
// process pid answers.
func ping(addr string, pid int) error {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	if _, err := c.Write([]byte("INFO server\r\n")); err != nil {
		return err
	}
	r := bufio.NewReader(c)
	head, err := r.ReadString('\n')
	if err != nil {
		return err
	}
	if !strings.HasPrefix(head, "$") {
		return fmt.Errorf("INFO answered %q", strings.TrimSpace(head))
	}
	n, err := strconv.Atoi(strings.TrimSpace(head[1:]))
	if err != nil {
		return fmt.Errorf("INFO answered %q", strings.TrimSpace(head))
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(r, body); err != nil {
		return err
	}
	want := "\nprocess_id:" + strconv.Itoa(pid) + "\r"
	if !strings.Contains(string(body), want) {
		return fmt.Errorf("another process answers on %s", addr)
	}
	return nil
}

// freePort returns a loopback port that was free a moment ago; with bus, the
// cluster bus port (port+10000) was free too.
func freePort(bus bool) (int, error) {
	for range 50 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, fmt.Errorf("find a free port: %w", err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		if !bus {
			_ = l.Close()
			return port, nil
		}
		if clusterBusPort(port) > 65535 {
			_ = l.Close()
			continue
		}
		l2, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(clusterBusPort(port))))
		_ = l.Close()
		if err != nil {
			continue
		}
		_ = l2.Close()
		return port, nil
	}
	return 0, errors.New("no free port pair for a cluster node")
}

func clusterBusPort(port int) int { return port + 10000 }

func tail(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return "(no log: " + err.Error() + ")"
	}
	b = bytes.TrimSpace(b)
	if len(b) > 600 {
		b = b[len(b)-600:]
	}
	return strings.ReplaceAll(string(b), "\n", " | ")
}

// Addr returns the server's address, "127.0.0.1:PORT". It stays the same
// across Restart.
func (s *Server) Addr() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port))
}

// Kill sends SIGKILL and waits for the process to exit. It is a no-op when
// the server is not running.
func (s *Server) Kill() {
	s.mu.Lock()
	cmd, done := s.cmd, s.done
	s.cmd = nil
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Kill()
	<-done
}

// Stop shuts the server down gracefully (SHUTDOWN NOSAVE, then SIGTERM,
// then SIGKILL if it lingers) and waits for it to exit.
func (s *Server) Stop() {
	s.mu.Lock()
	cmd, done, port := s.cmd, s.done, s.port
	s.cmd = nil
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	if c, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), time.Second); err == nil {
		_ = c.SetDeadline(time.Now().Add(time.Second))
		_, _ = c.Write([]byte("SHUTDOWN NOSAVE\r\n"))
		_ = c.Close()
	}
	select {
	case <-done:
		return
	case <-time.After(2 * time.Second):
	}
	_ = cmd.Process.Signal(sigterm)
	select {
	case <-done:
	case <-time.After(3 * time.Second):
		_ = cmd.Process.Kill()
		<-done
	}
}

// Restart starts the server again on the same port, after Kill or Stop (it
// kills a running one first), with an empty dataset and script cache, and
// waits until it answers PING. A cluster node keeps its nodes.conf, so it
// rejoins its cluster (with its slots, without its keys). It fails the test
// if the port cannot be bound again within a few seconds, so call it from
// the test's goroutine.
func (s *Server) Restart() {
	s.t.Helper()
	s.Kill()
	bin := lookPath(s.t)
	s.mu.Lock()
	port := s.port
	s.mu.Unlock()
	var err error
	for range 50 {
		if err = s.launch(bin, port); err == nil {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	s.t.Fatalf("redistest: restart on port %d: %v", port, err)
}

// StartSentinel starts a Redis Sentinel on a free loopback port that
// monitors master under masterName (quorum 1), waits until it answers PING
// and reports the master's address, and kills it in t.Cleanup. Clients in
// sentinel mode use its Addr.
func StartSentinel(t testing.TB, master *Server, masterName string) *Server {
	t.Helper()
	dir := t.TempDir()
	conf := filepath.Join(dir, "sentinel.conf")
	host, port, _ := net.SplitHostPort(master.Addr())
	body := fmt.Sprintf("sentinel monitor %s %s %s 1\nsentinel down-after-milliseconds %s 1000\n", masterName, host, port, masterName)
	if err := os.WriteFile(conf, []byte(body), 0o600); err != nil {
		t.Fatalf("redistest: write %s: %v", conf, err)
	}
	s := startServer(t, &Server{t: t, dir: dir, sentinel: conf})
	c := redis.NewSentinelClient(&redis.Options{Addr: s.Addr(), DisableIdentity: true, Protocol: 2})
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	for {
		addr, err := c.GetMasterAddrByName(ctx, masterName).Result()
		if err == nil && len(addr) == 2 && net.JoinHostPort(addr[0], addr[1]) == master.Addr() {
			return s
		}
		if ctx.Err() != nil {
			t.Fatalf("redistest: sentinel %s never reported master %s at %s (last: %v %v)", s.Addr(), masterName, master.Addr(), addr, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Cluster is a Redis Cluster of masters without replicas, every slot
// assigned, all on loopback.
type Cluster struct {
	nodes []*Server
}

// StartCluster starts masters (at least 1) cluster-enabled nodes on free
// ports, assigns the 16384 slots in equal ranges, joins them with CLUSTER
// MEET and waits until every node reports cluster_state:ok and knows every
// other. t.Cleanup kills them all.
func StartCluster(t testing.TB, masters int) *Cluster {
	t.Helper()
	if masters < 1 {
		t.Fatalf("redistest: a cluster needs at least 1 master, got %d", masters)
	}
	c := &Cluster{}
	for i := range masters {
		dir := filepath.Join(t.TempDir(), fmt.Sprintf("node%d", i))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatalf("redistest: %v", err)
		}
		c.nodes = append(c.nodes, start(t, dir, []string{
			"--cluster-enabled", "yes",
			"--cluster-config-file", "nodes.conf",
			"--cluster-node-timeout", "5000",
		}))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*startTimeout)
	defer cancel()
	if err := c.form(ctx); err != nil {
		t.Fatalf("redistest: form a cluster of %d masters: %v", masters, err)
	}
	return c
}

func (c *Cluster) form(ctx context.Context) error {
	clients := make([]*redis.Client, len(c.nodes))
	for i, n := range c.nodes {
		clients[i] = redis.NewClient(&redis.Options{
			Addr: n.Addr(), DisableIdentity: true, Protocol: 2,
			MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
		})
		defer clients[i].Close()
	}
	const slots = 16384
	per := slots / len(c.nodes)
	for i, cl := range clients {
		lo, hi := i*per, (i+1)*per-1
		if i == len(clients)-1 {
			hi = slots - 1
		}
		if err := cl.ClusterAddSlotsRange(ctx, lo, hi).Err(); err != nil {
			return fmt.Errorf("node %s: CLUSTER ADDSLOTSRANGE %d %d: %w", c.nodes[i].Addr(), lo, hi, err)
		}
	}
	for i := 1; i < len(clients); i++ {
		host, port, _ := net.SplitHostPort(c.nodes[i].Addr())
		if err := clients[0].ClusterMeet(ctx, host, port).Err(); err != nil {
			return fmt.Errorf("CLUSTER MEET %s: %w", c.nodes[i].Addr(), err)
		}
	}
	want := "cluster_known_nodes:" + strconv.Itoa(len(c.nodes))
	for i, cl := range clients {
		for {
			info, err := cl.ClusterInfo(ctx).Result()
			if err == nil && strings.Contains(info, "cluster_state:ok") && strings.Contains(info, want+"\r\n") {
				break
			}
			if ctx.Err() != nil {
				return fmt.Errorf("node %s never reported cluster_state:ok with %d nodes (last: %v %q)", c.nodes[i].Addr(), len(c.nodes), err, info)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	return nil
}

// Addrs returns the masters' addresses.
func (c *Cluster) Addrs() []string {
	out := make([]string, len(c.nodes))
	for i, n := range c.nodes {
		out[i] = n.Addr()
	}
	return out
}

// Nodes returns the masters, for fault tests that kill or restart one.
func (c *Cluster) Nodes() []*Server {
	return append([]*Server(nil), c.nodes...)
}

// MoveSlot migrates slot from the master that serves it to master dst
// (an index into Nodes), as redis-cli --cluster reshard does: SETSLOT
// IMPORTING and MIGRATING, MIGRATE of its keys in batches (ASK redirects
// meanwhile), then SETSLOT NODE on every master (MOVED from then on).
// Clients with a slot map of their own learn of it by redirects.
func (c *Cluster) MoveSlot(ctx context.Context, slot int, dst int) error {
	clients := make([]*redis.Client, len(c.nodes))
	ids := make([]string, len(c.nodes))
	src := -1
	for i, n := range c.nodes {
		clients[i] = redis.NewClient(&redis.Options{
			Addr: n.Addr(), DisableIdentity: true, Protocol: 2,
			MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
		})
		defer clients[i].Close()
		id, err := clients[i].Do(ctx, "CLUSTER", "MYID").Text()
		if err != nil {
			return fmt.Errorf("node %s: CLUSTER MYID: %w", n.Addr(), err)
		}
		ids[i] = id
		if n, err := clients[i].ClusterCountKeysInSlot(ctx, slot).Result(); err == nil && n > 0 {
			src = i
		}
	}
	if src < 0 {
		// No keys anywhere: the owner per CLUSTER SLOTS.
		slots, err := clients[0].ClusterSlots(ctx).Result()
		if err != nil {
			return fmt.Errorf("CLUSTER SLOTS: %w", err)
		}
		for _, s := range slots {
			if int(s.Start) <= slot && slot <= int(s.End) && len(s.Nodes) > 0 {
				src = slices.IndexFunc(ids, func(id string) bool { return id == s.Nodes[0].ID })
			}
		}
		if src < 0 {
			return fmt.Errorf("no master serves slot %d", slot)
		}
	}
	if src == dst {
		return nil
	}
	host, port, _ := net.SplitHostPort(c.nodes[dst].Addr())
	if err := clients[dst].Do(ctx, "CLUSTER", "SETSLOT", slot, "IMPORTING", ids[src]).Err(); err != nil {
		return fmt.Errorf("SETSLOT IMPORTING: %w", err)
	}
	if err := clients[src].Do(ctx, "CLUSTER", "SETSLOT", slot, "MIGRATING", ids[dst]).Err(); err != nil {
		return fmt.Errorf("SETSLOT MIGRATING: %w", err)
	}
	for {
		keys, err := clients[src].ClusterGetKeysInSlot(ctx, slot, 100).Result()
		if err != nil {
			return fmt.Errorf("GETKEYSINSLOT: %w", err)
		}
		if len(keys) == 0 {
			break
		}
		args := []any{"MIGRATE", host, port, "", 0, 5000, "KEYS"}
		for _, k := range keys {
			args = append(args, k)
		}
		if err := clients[src].Do(ctx, args...).Err(); err != nil {
			return fmt.Errorf("MIGRATE: %w", err)
		}
	}
	for _, i := range append([]int{dst, src}, otherThan(len(clients), src, dst)...) {
		if err := clients[i].Do(ctx, "CLUSTER", "SETSLOT", slot, "NODE", ids[dst]).Err(); err != nil {
			return fmt.Errorf("node %s: SETSLOT NODE: %w", c.nodes[i].Addr(), err)
		}
	}
	return nil
}

// otherThan returns 0…n-1 without a and b.
func otherThan(n, a, b int) []int {
	var out []int
	for i := range n {
		if i != a && i != b {
			out = append(out, i)
		}
	}
	return out
}
