package proxytest

import (
	"io"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
)

const (
	nginxConf = "../../../proxy/nginx/flashgate.conf"
	caddyfile = "../../../proxy/caddy/Caddyfile"
)

func TestRenderReplacesOnlyAddresses(t *testing.T) {
	for name, tc := range map[string]struct {
		file   string
		render func([]byte) ([]byte, error)
		want   []string
	}{
		"nginx": {
			file: nginxConf,
			render: func(b []byte) ([]byte, error) {
				return RenderNginx(b, "127.0.0.1:1001", "127.0.0.1:1002", "127.0.0.1:1003")
			},
			want: []string{"listen 127.0.0.1:1001;", "server 127.0.0.1:1002;", "server 127.0.0.1:1003;"},
		},
		"caddy": {
			file: caddyfile,
			render: func(b []byte) ([]byte, error) {
				return RenderCaddy(b, 1001, "127.0.0.1:1004", "127.0.0.1:1002", "127.0.0.1:1003")
			},
			want: []string{":1001 {", "admin 127.0.0.1:1004", "default_bind 127.0.0.1", "forward_auth 127.0.0.1:1002 {", "reverse_proxy 127.0.0.1:1003"},
		},
	} {
		t.Run(name, func(t *testing.T) {
			orig, err := os.ReadFile(tc.file)
			if err != nil {
				t.Fatal(err)
			}
			got, err := tc.render(orig)
			if err != nil {
				t.Fatal(err)
			}
			// Exactly one line per address changed, and into the address.
			origLines, gotLines := strings.Split(string(orig), "\n"), strings.Split(string(got), "\n")
			if len(origLines) != len(gotLines) {
				t.Fatalf("rendering changed the number of lines")
			}
			var changed []string
			for i := range origLines {
				if origLines[i] != gotLines[i] {
					changed = append(changed, gotLines[i])
				}
			}
			if len(changed) != len(tc.want) {
				t.Errorf("%d lines changed, want %d: %q", len(changed), len(tc.want), changed)
			}
			for _, w := range tc.want {
				if !slices.ContainsFunc(changed, func(l string) bool { return strings.Contains(l, w) }) {
					t.Errorf("no changed line holds %q: %q", w, changed)
				}
			}
			// A file without an address it should hold is refused.
			if _, err := tc.render([]byte(strings.ReplaceAll(string(orig), shippedAuthz, "127.0.0.1:9999"))); err == nil {
				t.Errorf("a file without flashgate's address rendered")
			}
		})
	}
}

func TestNginxTestReportsErrors(t *testing.T) {
	if err := NginxTest(t, []byte("server { listen 127.0.0.1:1; location / { return 200; } }\n")); err != nil {
		t.Fatalf("a valid config: %v", err)
	}
	err := NginxTest(t, []byte("server { lisen 127.0.0.1:1; }\n"))
	if err == nil || !strings.Contains(err.Error(), "lisen") {
		t.Fatalf("NginxTest = %v, want nginx's complaint about lisen", err)
	}
}

// TestProxiesStartServeAndStop: each proxy runs the shipped file against
// the stand-in and the upstream, and Stop leaves no process behind.
func TestProxiesStartServeAndStop(t *testing.T) {
	for name, start := range map[string]func(testing.TB, Options) *Proxy{"nginx": StartNginx, "caddy": StartCaddy} {
		t.Run(name, func(t *testing.T) {
			a := StartAuthorizer(t, 1)
			u := StartUpstream(t)
			cfg := nginxConf
			if name == "caddy" {
				cfg = caddyfile
			}
			p := start(t, Options{Config: cfg, Authz: a.Addr(), Upstream: u.Addr()})
			for i, want := range []int{http.StatusOK, http.StatusTooManyRequests} {
				req, _ := http.NewRequest(http.MethodGet, p.URL()+"/x", nil)
				req.Header.Set("x-uid", "u")
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != want {
					t.Errorf("request %d: %d, want %d", i, resp.StatusCode, want)
				}
			}
			if n := u.Count("u"); n != 1 || len(a.Checks()) != 2 {
				t.Errorf("upstream saw %d, authorizer %d checks; want 1 and 2", n, len(a.Checks()))
			}
			// One process, so that stopping or killing it leaves nothing behind.
			if kids := children(t, p.cmd.Process.Pid); len(kids) > 0 {
				t.Errorf("%s runs child processes %v", name, kids)
			}
			p.Stop()
			if !p.Exited() {
				t.Fatalf("%s still running after Stop", name)
			}
			p.Stop() // twice is fine
		})
	}
}

// children returns the pids whose parent is pid (Linux /proc; none
// elsewhere).
func children(t *testing.T, pid int) []string {
	t.Helper()
	if runtime.GOOS != "linux" {
		return nil
	}
	stats, err := filepath.Glob("/proc/[0-9]*/stat")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, st := range stats {
		b, err := os.ReadFile(st)
		if err != nil {
			continue // exited meanwhile
		}
		// pid (comm) state ppid ...: comm may hold spaces, so split after ')'.
		s := string(b)
		f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
		if len(f) > 1 && f[1] == strconv.Itoa(pid) {
			out = append(out, strings.Fields(s)[0])
		}
	}
	return out
}
