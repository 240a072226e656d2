package envoy

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/goccy/go-yaml"
)

// compose is the part of docker-compose.yml the demo depends on.
type compose struct {
	Name     string                    `json:"name"`
	Services map[string]composeService `json:"services"`
}

type composeService struct {
	Image       string            `json:"image"`
	Build       *composeBuild     `json:"build"`
	Command     []string          `json:"command"`
	Environment map[string]string `json:"environment"`
	Volumes     []string          `json:"volumes"`
	Ports       []string          `json:"ports"`
	DependsOn   any               `json:"depends_on"` // a list or a map
	Healthcheck map[string]any    `json:"healthcheck"`
	ReadOnly    bool              `json:"read_only"`
	SecurityOpt []string          `json:"security_opt"`
	CapDrop     []string          `json:"cap_drop"`
}

type composeBuild struct {
	Context    string `json:"context"`
	Dockerfile string `json:"dockerfile"`
}

const repoRoot = ".."

func loadCompose(t *testing.T) compose {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(repoRoot, "docker-compose.yml"))
	if err != nil {
		t.Fatal(err)
	}
	var c compose
	// Strict: a misspelt key of the fields above fails (keys this struct does
	// not model are errors too, so extend it when the file grows).
	if err := yaml.UnmarshalWithOptions(data, &c, yaml.Strict()); err != nil {
		t.Fatalf("docker-compose.yml: %v", err)
	}
	return c
}

func (s composeService) dependsOn() []string {
	switch d := s.DependsOn.(type) {
	case []any:
		var out []string
		for _, v := range d {
			out = append(out, fmt.Sprint(v))
		}
		return out
	case map[string]any:
		var out []string
		for k := range d {
			out = append(out, k)
		}
		return out
	}
	return nil
}

// mounts maps container paths to host paths (relative to the repository).
func (s composeService) mounts(t *testing.T) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, v := range s.Volumes {
		parts := strings.Split(v, ":")
		if len(parts) < 2 || !strings.HasPrefix(parts[0], "./") {
			t.Errorf("volume %q: want ./host/path:/container/path[:ro]", v)
			continue
		}
		if len(parts) == 3 && parts[2] != "ro" {
			t.Errorf("volume %q: configuration mounts are read-only", v)
		}
		out[parts[1]] = filepath.Join(repoRoot, parts[0])
	}
	return out
}

// hostPath resolves a container path through the service's bind mounts.
func (s composeService) hostPath(t *testing.T, containerPath string) (string, bool) {
	t.Helper()
	for cpath, hpath := range s.mounts(t) {
		if containerPath == cpath {
			return hpath, true
		}
		if rel, ok := strings.CutPrefix(containerPath, cpath+"/"); ok {
			return filepath.Join(hpath, rel), true
		}
	}
	return "", false
}

func exists(t *testing.T, path string) {
	t.Helper()
	if _, err := os.Stat(path); err != nil {
		t.Errorf("%v", err)
	}
}

func publishes(s composeService, port string) bool {
	return slices.ContainsFunc(s.Ports, func(p string) bool { return strings.HasSuffix(p, ":"+port) })
}

func TestCompose(t *testing.T) {
	c := loadCompose(t)
	for _, name := range []string{"redis", "flashgate", "envoy", "demo"} {
		if _, ok := c.Services[name]; !ok {
			t.Fatalf("no service %q", name)
		}
	}
	fg, envoy, redis, demo := c.Services["flashgate"], c.Services["envoy"], c.Services["redis"], c.Services["demo"]

	// flashgate: built from this repository's Dockerfile, on Redis.
	if fg.Build == nil {
		t.Fatal("flashgate: no build section")
	}
	exists(t, filepath.Join(repoRoot, fg.Build.Context, fg.Build.Dockerfile))
	exists(t, filepath.Join(repoRoot, fg.Build.Context, "go.mod"))
	if fg.Environment["FLASHGATE_BACKEND"] != "redis" {
		t.Errorf("flashgate: FLASHGATE_BACKEND = %q, want redis", fg.Environment["FLASHGATE_BACKEND"])
	}
	host, port, err := net.SplitHostPort(fg.Environment["FLASHGATE_REDIS_ADDR"])
	if err != nil || host != "redis" || port != "6379" {
		t.Errorf("flashgate: FLASHGATE_REDIS_ADDR = %q, want redis:6379", fg.Environment["FLASHGATE_REDIS_ADDR"])
	}
	if !slices.Contains(fg.dependsOn(), "redis") {
		t.Errorf("flashgate must depend on redis")
	}
	if redis.Healthcheck == nil {
		t.Errorf("redis: want a healthcheck so flashgate starts after it")
	}
	// Both listeners must leave the container's loopback.
	for _, key := range []string{"FLASHGATE_GRPC_ADDR", "FLASHGATE_HTTP_ADDR"} {
		if h, _, err := net.SplitHostPort(fg.Environment[key]); err != nil || h != "0.0.0.0" {
			t.Errorf("flashgate: %s = %q, want 0.0.0.0:PORT (Envoy is another container)", key, fg.Environment[key])
		}
	}
	_, grpcPort, _ := net.SplitHostPort(fg.Environment["FLASHGATE_GRPC_ADDR"])
	// The config file is in a mounted directory of the repository, and it exists.
	cfg := fg.Environment["FLASHGATE_CONFIG"]
	hostCfg, ok := fg.hostPath(t, cfg)
	if !ok {
		t.Errorf("flashgate: FLASHGATE_CONFIG %q is not inside a mounted path", cfg)
	} else {
		exists(t, hostCfg)
	}
	if !fg.ReadOnly || !slices.Contains(fg.CapDrop, "ALL") {
		t.Errorf("flashgate: want read_only and cap_drop ALL, as in k8s/")
	}

	// envoy: the official image, our envoy.yaml, port 8080.
	if !strings.HasPrefix(envoy.Image, "envoyproxy/envoy:") {
		t.Errorf("envoy image %q, want envoyproxy/envoy", envoy.Image)
	}
	if minor := envoyModuleMinor(t); !strings.Contains(envoy.Image, minor) {
		t.Errorf("envoy image %q, want the %s line the protos in go.mod describe", envoy.Image, minor)
	}
	cfgIdx := slices.IndexFunc(envoy.Command, func(a string) bool { return a == "-c" || a == "--config-path" })
	if cfgIdx < 0 || cfgIdx+1 >= len(envoy.Command) {
		t.Fatalf("envoy command %v: want -c/--config-path FILE", envoy.Command)
	}
	hostEnvoy, ok := envoy.hostPath(t, envoy.Command[cfgIdx+1])
	if !ok || filepath.Clean(hostEnvoy) != filepath.Join(repoRoot, "envoy", "envoy.yaml") {
		t.Errorf("envoy loads %s from %q, want ./envoy/envoy.yaml mounted", envoy.Command[cfgIdx+1], hostEnvoy)
	}
	if !publishes(envoy, "8080") {
		t.Errorf("envoy does not publish 8080: %v", envoy.Ports)
	}
	for _, dep := range []string{"flashgate", "demo"} {
		if !slices.Contains(envoy.dependsOn(), dep) {
			t.Errorf("envoy must depend on %s", dep)
		}
	}

	// envoy.yaml's clusters point at compose services and their ports.
	data, err := os.ReadFile("envoy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	bs, err := loadBootstrap(data)
	if err != nil {
		t.Fatal(err)
	}
	demoPort := ""
	for _, a := range demo.Command {
		if v, ok := strings.CutPrefix(a, "-listen=:"); ok {
			demoPort = v
		}
	}
	wantPorts := map[string]string{"flashgate": grpcPort, "demo": demoPort}
	for _, cl := range bs.GetStaticResources().GetClusters() {
		for _, ep := range endpoints(cl) {
			h, p, _ := net.SplitHostPort(ep)
			if _, ok := c.Services[h]; !ok {
				t.Errorf("envoy.yaml cluster %s: host %q is not a compose service", cl.GetName(), h)
			} else if want := wantPorts[h]; want != p {
				t.Errorf("envoy.yaml cluster %s: port %s, but service %s listens on %q", cl.GetName(), p, h, want)
			}
		}
	}
	if l := bs.GetStaticResources().GetListeners()[0]; l.GetAddress().GetSocketAddress().GetPortValue() != 8080 {
		t.Errorf("envoy.yaml listener is not the published 8080")
	}
}

// envoyModuleMinor returns "v1.NN" of go-control-plane's envoy module in go.mod.
func envoyModuleMinor(t *testing.T) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(repoRoot, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`github\.com/envoyproxy/go-control-plane/envoy (v\d+\.\d+)\.`).FindSubmatch(data)
	if m == nil {
		t.Fatal("go.mod does not require github.com/envoyproxy/go-control-plane/envoy")
	}
	return string(m[1])
}

// dockerfile is a parsed Dockerfile: one instruction per logical line.
type dockerfile []struct{ op, args string }

func loadDockerfile(t *testing.T) dockerfile {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(repoRoot, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	var out dockerfile
	var cur string
	for _, line := range strings.Split(string(data), "\n") {
		trimmed := strings.TrimSpace(line)
		if cur == "" && (trimmed == "" || strings.HasPrefix(trimmed, "#")) {
			continue
		}
		if body, ok := strings.CutSuffix(trimmed, `\`); ok {
			cur += body + " "
			continue
		}
		cur += trimmed
		op, args, _ := strings.Cut(cur, " ")
		out = append(out, struct{ op, args string }{strings.ToUpper(op), strings.TrimSpace(args)})
		cur = ""
	}
	return out
}

func TestDockerfile(t *testing.T) {
	df := loadDockerfile(t)
	var froms []string
	var runs, user, entrypoint, expose string
	var copies []string // the final stage's
	for _, in := range df {
		switch in.op {
		case "FROM":
			froms = append(froms, in.args)
			user = "" // USER is per stage
			copies = nil
		case "COPY":
			copies = append(copies, in.args)
		case "RUN":
			if len(froms) == 1 {
				runs += in.args + "\n"
			}
		case "USER":
			user = in.args
		case "ENTRYPOINT":
			entrypoint = in.args
		case "EXPOSE":
			expose = in.args
		}
	}
	if len(froms) < 2 {
		t.Fatalf("want a multi-stage build, got FROM %v", froms)
	}
	goVersion := regexp.MustCompile(`(?m)^go (\d+\.\d+)`).FindStringSubmatch(readFile(t, filepath.Join(repoRoot, "go.mod")))
	if goVersion == nil || !strings.Contains(froms[0], "golang:"+goVersion[1]) {
		t.Errorf("build stage %q, want golang:%v (go.mod)", froms[0], goVersion)
	}
	for _, want := range []string{"CGO_ENABLED=0", "-trimpath", "./cmd/flashgate"} {
		if !strings.Contains(runs, want) {
			t.Errorf("build stage does not run %q", want)
		}
	}
	final := froms[len(froms)-1]
	if !(strings.Contains(final, "distroless/static") && strings.HasSuffix(final, ":nonroot")) && final != "scratch" {
		t.Errorf("final stage %q, want distroless/static:nonroot or scratch", final)
	}
	if uid, _, _ := strings.Cut(user, ":"); user == "" || uid == "0" || uid == "root" {
		t.Errorf("final stage USER %q, want a non-root user", user)
	}
	if !strings.Contains(entrypoint, "flashgate") || !strings.Contains(entrypoint, `"serve"`) {
		t.Errorf("ENTRYPOINT %s, want flashgate serve", entrypoint)
	}
	// Envoy Gateway runs command: /bin/ratelimit; by that name the binary
	// is flashgate ratelimit.
	if !slices.ContainsFunc(copies, func(c string) bool { return strings.HasSuffix(c, "/flashgate /bin/ratelimit") }) {
		t.Errorf("final stage COPY %q: want the binary at /bin/ratelimit too", copies)
	}
	if f := strings.Fields(expose); !slices.Contains(f, "9191") || !slices.Contains(f, "9192") {
		t.Errorf("EXPOSE %q, want 9191 9192", expose)
	}

	// The build context keeps what the build needs and drops the rest.
	ignore := strings.Fields(stripHashComments(readFile(t, filepath.Join(repoRoot, ".dockerignore"))))
	if !slices.Contains(ignore, ".git") {
		t.Errorf(".dockerignore must exclude .git")
	}
	for _, need := range []string{"go.mod", "go.sum", "cmd", "extauthz", "window", "internal", "*.go", "**/*.yaml", "*.yaml"} {
		if slices.Contains(ignore, need) {
			t.Errorf(".dockerignore excludes %s, which the build needs", need)
		}
	}
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

func stripHashComments(s string) string {
	var b strings.Builder
	for _, line := range strings.Split(s, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(line), "#") {
			b.WriteString(line + "\n")
		}
	}
	return b.String()
}
