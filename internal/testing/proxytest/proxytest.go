package proxytest

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// startTimeout bounds how long a proxy may take to listen.
const startTimeout = 15 * time.Second

// stopTimeout bounds a graceful stop before the process is killed.
const stopTimeout = 10 * time.Second

// attempts is how many sets of free ports a start tries when a port it was
// given was taken in between.
const attempts = 5

// Options say which shipped configuration to run and where the parties it
// talks to are.
type Options struct {
	// Config is the path of the shipped file: an http-context include for
	// nginx, a Caddyfile for Caddy.
	Config string
	// Authz is flashgate's HTTP front-end, host:port.
	Authz string
	// Upstream is the app, host:port.
	Upstream string
}

// Proxy is one running nginx or caddy process. Its methods are safe for
// concurrent use; Stop may be called more than once.
type Proxy struct {
	t      testing.TB
	name   string // nginx or caddy
	addr   string // the listener, 127.0.0.1:PORT
	dir    string
	errLog string // nginx's error log file; "" for caddy, which logs to its output
	out    string // the file of the process's stdout and stderr
	cmd    *exec.Cmd
	done   chan struct{} // closed once cmd has been waited for
	stop   sync.Once
}

// Name is "nginx" or "caddy".
func (p *Proxy) Name() string { return p.name }

// Addr is the proxy's listener, 127.0.0.1:PORT.
func (p *Proxy) Addr() string { return p.addr }

// URL is "http://" + Addr.
func (p *Proxy) URL() string { return "http://" + p.addr }

// ErrorLog returns what the proxy logged so far: nginx's error log (at
// level info), caddy's log lines (JSON, on stderr).
func (p *Proxy) ErrorLog() string {
	if p.errLog == "" {
		return p.output()
	}
	return readLog(p.errLog)
}

// output returns what the process wrote to stdout and stderr so far.
func (p *Proxy) output() string { return readLog(p.out) }

func readLog(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	return string(b)
}

// Stop shuts the proxy down gracefully (nginx SIGQUIT, caddy SIGINT: open
// requests finish), kills it if it lingers, and waits for it to exit.
func (p *Proxy) Stop() {
	p.stop.Do(func() {
		sig := os.Signal(syscall.SIGQUIT)
		if p.name == "caddy" {
			sig = os.Interrupt
		}
		_ = p.cmd.Process.Signal(sig)
		select {
		case <-p.done:
		case <-time.After(stopTimeout):
			_ = p.cmd.Process.Kill()
			<-p.done
		}
	})
}

// Exited reports whether the process has exited.
func (p *Proxy) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// StartNginx runs nginx with o.Config rendered for a free loopback port,
// waits until it listens, and stops it in t.Cleanup (its error log is shown
// when the test failed).
func StartNginx(t testing.TB, o Options) *Proxy {
	t.Helper()
	bin := binary(t, "nginx", "nginx")
	shipped := readConfig(t, o.Config)
	return start(t, "nginx", func(dir string, ports []int) (*exec.Cmd, string, error) {
		listen := loopback(ports[0])
		site, err := RenderNginx(shipped, listen, o.Authz, o.Upstream)
		if err != nil {
			return nil, "", fmt.Errorf("%s: %w", o.Config, err)
		}
		conf, err := writeNginx(dir, site)
		if err != nil {
			return nil, "", err
		}
		return exec.Command(bin, "-p", dir+"/", "-c", conf, "-e", "stderr"), listen, nil
	}, 1)
}

// StartCaddy runs caddy with o.Config rendered for free loopback ports (its
// listener and its admin endpoint), waits until it listens, and stops it in
// t.Cleanup (its log is shown when the test failed).
func StartCaddy(t testing.TB, o Options) *Proxy {
	t.Helper()
	bin := binary(t, "caddy", "caddy")
	shipped := readConfig(t, o.Config)
	return start(t, "caddy", func(dir string, ports []int) (*exec.Cmd, string, error) {
		rendered, err := RenderCaddy(shipped, ports[0], loopback(ports[1]), o.Authz, o.Upstream)
		if err != nil {
			return nil, "", fmt.Errorf("%s: %w", o.Config, err)
		}
		path := filepath.Join(dir, "Caddyfile")
		if err := os.WriteFile(path, rendered, 0o600); err != nil {
			return nil, "", err
		}
		cmd := exec.Command(bin, "run", "--config", path, "--adapter", "caddyfile")
		// Caddy keeps its autosaved config, locks and certificates under
		// these: keep them in the test's directory.
		cmd.Env = append(os.Environ(),
			"HOME="+dir, "XDG_CONFIG_HOME="+filepath.Join(dir, "config"), "XDG_DATA_HOME="+filepath.Join(dir, "data"))
		return cmd, loopback(ports[0]), nil
	}, 2)
}

// NginxTest runs nginx -t on httpConf, the contents of an http block (a
// shipped file or a rendered snippet), in a directory of its own; the error
// carries nginx's output.
func NginxTest(t testing.TB, httpConf []byte) error {
	t.Helper()
	bin := binary(t, "nginx", "nginx")
	dir := t.TempDir()
	conf, err := writeNginx(dir, httpConf)
	if err != nil {
		t.Fatalf("proxytest: %v", err)
	}
	out, err := exec.Command(bin, "-t", "-p", dir+"/", "-c", conf, "-e", "stderr").CombinedOutput()
	if err != nil {
		return fmt.Errorf("nginx -t: %w: %s", err, bytes.TrimSpace(out))
	}
	return nil
}

// writeNginx writes dir/nginx.conf, which includes site (written as
// dir/site.conf) in its http block, with every path nginx writes under dir,
// and returns its path.
func writeNginx(dir string, site []byte) (string, error) {
	tmp := filepath.Join(dir, "tmp")
	if err := os.MkdirAll(tmp, 0o700); err != nil {
		return "", fmt.Errorf("proxytest: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "site.conf"), site, 0o600); err != nil {
		return "", fmt.Errorf("proxytest: %w", err)
	}
	main := fmt.Sprintf(`daemon off;
master_process off;
pid %[1]s/nginx.pid;
error_log %[1]s/error.log info;
events {
    worker_connections 1024;
}
http {
    access_log %[1]s/access.log;
    client_body_temp_path %[2]s/client_body;
    proxy_temp_path %[2]s/proxy;
    fastcgi_temp_path %[2]s/fastcgi;
    uwsgi_temp_path %[2]s/uwsgi;
    scgi_temp_path %[2]s/scgi;
    include %[1]s/site.conf;
}
`, dir, tmp)
	path := filepath.Join(dir, "nginx.conf")
	if err := os.WriteFile(path, []byte(main), 0o600); err != nil {
		return "", fmt.Errorf("proxytest: %w", err)
	}
	return path, nil
}

// launcher builds the command for one attempt: dir is the attempt's
// directory, ports the free ports picked for it; it returns the command and
// the address the proxy will listen on.
type launcher func(dir string, ports []int) (cmd *exec.Cmd, listen string, err error)

func start(t testing.TB, name string, build launcher, nports int) *Proxy {
	t.Helper()
	var errs []error
	for range attempts {
		ports, err := freePorts(nports)
		if err != nil {
			t.Fatalf("proxytest: %v", err)
		}
		dir := t.TempDir()
		cmd, listen, err := build(dir, ports)
		if err != nil {
			t.Fatalf("proxytest: %v", err)
		}
		p := &Proxy{t: t, name: name, addr: listen, dir: dir, cmd: cmd, out: filepath.Join(dir, "output.log"), done: make(chan struct{})}
		if name == "nginx" {
			p.errLog = filepath.Join(dir, "error.log")
		}
		err = p.launch()
		if err == nil {
			t.Cleanup(p.cleanup)
			return p
		}
		errs = append(errs, err)
		if !strings.Contains(strings.ToLower(err.Error()), "address already in use") {
			break
		}
	}
	t.Fatalf("proxytest: could not start %s: %v", name, errors.Join(errs...))
	return nil
}

// launch starts the process and waits until its listener accepts
// connections while it runs.
func (p *Proxy) launch() error {
	out, err := os.Create(p.out)
	if err != nil {
		return fmt.Errorf("proxytest: %w", err)
	}
	defer out.Close() // the process holds its own descriptor
	p.cmd.Stdout, p.cmd.Stderr = out, out
	p.cmd.Dir = p.dir
	p.cmd.SysProcAttr = sysProcAttr()
	if err := p.cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", p.name, err)
	}
	go func() { _ = p.cmd.Wait(); close(p.done) }()
	deadline := time.Now().Add(startTimeout)
	for {
		if p.Exited() {
			return fmt.Errorf("%s exited during start: %s", p.name, p.logTail())
		}
		if c, err := net.DialTimeout("tcp", p.addr, time.Second); err == nil {
			_ = c.Close()
			if !p.Exited() {
				return nil
			}
		}
		if time.Now().After(deadline) {
			_ = p.cmd.Process.Kill()
			<-p.done
			return fmt.Errorf("%s not listening on %s within %s: %s", p.name, p.addr, startTimeout, p.logTail())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (p *Proxy) cleanup() {
	p.Stop()
	if p.t.Failed() {
		p.t.Logf("%s on %s logged:\n%s", p.name, p.addr, tail(p.logs(), 32<<10))
	}
}

func (p *Proxy) logTail() string { return tail(p.logs(), 2000) }

// logs returns the process's output and, for nginx, its error log.
func (p *Proxy) logs() string {
	if p.errLog == "" {
		return p.output()
	}
	return p.output() + "\n" + p.ErrorLog()
}

func tail(s string, n int) string {
	s = strings.TrimSpace(s)
	if len(s) > n {
		s = "…" + s[len(s)-n:]
	}
	return s
}

func readConfig(t testing.TB, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("proxytest: %v", err)
	}
	return b
}

func loopback(port int) string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(port)) }

// freePorts returns n distinct loopback ports that were free a moment ago
// (all held open until each is picked).
func freePorts(n int) ([]int, error) {
	ports := make([]int, n)
	for i := range ports {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("find a free port: %w", err)
		}
		defer l.Close()
		ports[i] = l.Addr().(*net.TCPAddr).Port
	}
	return ports, nil
}
