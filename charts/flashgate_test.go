package charts

import (
	"bufio"
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"maps"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"helm.sh/helm/v4/pkg/chart/common"
	chartutil "helm.sh/helm/v4/pkg/chart/common/util"
	chart "helm.sh/helm/v4/pkg/chart/v2"
	"helm.sh/helm/v4/pkg/chart/v2/lint"
	"helm.sh/helm/v4/pkg/chart/v2/lint/support"
	"helm.sh/helm/v4/pkg/chart/v2/loader"
	"helm.sh/helm/v4/pkg/engine"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	klabels "k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"

	"github.com/flashgate/flashgate/descriptors"
	"github.com/flashgate/flashgate/rls"
)

const (
	chartDir    = "flashgate"
	release     = "fg"
	namespace   = "shop"
	kubeVersion = "v1.33.0"
)

// serviceMonitor is the part of monitoring.coreos.com/v1 ServiceMonitor the
// chart sets, field names as the CRD spells them: strict decoding into it
// fails on a misspelt or misplaced field.
type serviceMonitor struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		Selector          metav1.LabelSelector `json:"selector"`
		NamespaceSelector *struct {
			Any        bool     `json:"any,omitempty"`
			MatchNames []string `json:"matchNames,omitempty"`
		} `json:"namespaceSelector,omitempty"`
		Endpoints []struct {
			Port          string `json:"port"`
			Path          string `json:"path"`
			Interval      string `json:"interval"`
			ScrapeTimeout string `json:"scrapeTimeout"`
		} `json:"endpoints"`
	} `json:"spec"`
}

// rendered is every object of one rendering, by kind and name, and NOTES.txt.
type rendered struct {
	deployments     map[string]*appsv1.Deployment
	services        map[string]*corev1.Service
	configMaps      map[string]*corev1.ConfigMap
	networkPolicies map[string]*networkingv1.NetworkPolicy
	pdbs            map[string]*policyv1.PodDisruptionBudget
	hpas            map[string]*autoscalingv2.HorizontalPodAutoscaler
	serviceMonitors map[string]*serviceMonitor
	notes           string
}

func newRendered() *rendered {
	return &rendered{
		deployments:     map[string]*appsv1.Deployment{},
		services:        map[string]*corev1.Service{},
		configMaps:      map[string]*corev1.ConfigMap{},
		networkPolicies: map[string]*networkingv1.NetworkPolicy{},
		pdbs:            map[string]*policyv1.PodDisruptionBudget{},
		hpas:            map[string]*autoscalingv2.HorizontalPodAutoscaler{},
		serviceMonitors: map[string]*serviceMonitor{},
	}
}

// strictJSON decodes like the API server's strict field validation:
// case-sensitive field names, unknown and duplicate fields are errors.
func strictJSON(js []byte, into any) error {
	strictErrs, err := kjson.UnmarshalStrict(js, into)
	if err != nil {
		return err
	}
	return errors.Join(strictErrs...)
}

// decodeInto decodes one document strictly into into's map, by name.
func decodeInto[T any](js []byte, m map[string]*T, name func(*T) string) error {
	o := new(T)
	if err := strictJSON(js, o); err != nil {
		return err
	}
	n := name(o)
	if _, dup := m[n]; dup {
		return fmt.Errorf("two objects named %q", n)
	}
	m[n] = o
	return nil
}

// add decodes one YAML document into the k8s.io/api type of its kind.
func (r *rendered) add(doc []byte) error {
	var tm metav1.TypeMeta
	if err := yaml.Unmarshal(doc, &tm); err != nil {
		return fmt.Errorf("type: %w", err)
	}
	js, err := yaml.YAMLToJSONStrict(doc)
	if err != nil {
		return fmt.Errorf("yaml: %w", err)
	}
	switch tm.APIVersion + " " + tm.Kind {
	case "apps/v1 Deployment":
		err = decodeInto(js, r.deployments, func(o *appsv1.Deployment) string { return o.Name })
	case "v1 Service":
		err = decodeInto(js, r.services, func(o *corev1.Service) string { return o.Name })
	case "v1 ConfigMap":
		err = decodeInto(js, r.configMaps, func(o *corev1.ConfigMap) string { return o.Name })
	case "networking.k8s.io/v1 NetworkPolicy":
		err = decodeInto(js, r.networkPolicies, func(o *networkingv1.NetworkPolicy) string { return o.Name })
	case "policy/v1 PodDisruptionBudget":
		err = decodeInto(js, r.pdbs, func(o *policyv1.PodDisruptionBudget) string { return o.Name })
	case "autoscaling/v2 HorizontalPodAutoscaler":
		err = decodeInto(js, r.hpas, func(o *autoscalingv2.HorizontalPodAutoscaler) string { return o.Name })
	case "monitoring.coreos.com/v1 ServiceMonitor":
		err = decodeInto(js, r.serviceMonitors, func(o *serviceMonitor) string { return o.Name })
	default:
		return fmt.Errorf("unexpected object %q %q: add it to rendered.add", tm.APIVersion, tm.Kind)
	}
	if err != nil {
		return fmt.Errorf("%s: %w", tm.Kind, err)
	}
	return nil
}

// render renders the chart with values as `helm template` does and decodes
// every object strictly.
func render(values map[string]any) (*rendered, error) {
	chrt, err := loader.LoadDir(chartDir)
	if err != nil {
		return nil, fmt.Errorf("load chart: %w", err)
	}
	return renderChart(chrt, values)
}

// renderChart renders chrt, a chart loaded or built in memory, as render does.
func renderChart(chrt *chart.Chart, values map[string]any) (*rendered, error) {
	caps := common.DefaultCapabilities.Copy()
	kv, err := common.ParseKubeVersion(kubeVersion)
	if err != nil {
		return nil, fmt.Errorf("kube version: %w", err)
	}
	caps.KubeVersion = *kv
	top, err := chartutil.ToRenderValues(chrt, values,
		common.ReleaseOptions{Name: release, Namespace: namespace, IsInstall: true, Revision: 1}, caps)
	if err != nil {
		return nil, fmt.Errorf("values: %w", err)
	}
	files, err := engine.Render(chrt, top)
	if err != nil {
		return nil, fmt.Errorf("render: %w", err)
	}
	r := newRendered()
	sep := regexp.MustCompile(`(?m)^---[ \t]*$`)
	var errs []error
	for name, content := range files {
		switch {
		case path.Base(name) == "NOTES.txt":
			r.notes = content
			continue
		case !strings.HasSuffix(name, ".yaml"):
			errs = append(errs, fmt.Errorf("%s: unexpected file", name))
			continue
		}
		for i, doc := range sep.Split(content, -1) {
			if strings.TrimSpace(stripComments(doc)) == "" {
				continue
			}
			if err := r.add([]byte(doc)); err != nil {
				errs = append(errs, fmt.Errorf("%s doc %d: %w", name, i, err))
			}
		}
	}
	return r, errors.Join(errs...)
}

func stripComments(s string) string {
	var b strings.Builder
	for _, line := range strings.Split(s, "\n") {
		if t := strings.TrimSpace(line); t != "" && !strings.HasPrefix(t, "#") {
			b.WriteString(line + "\n")
		}
	}
	return b.String()
}

// readValues reads a values file of examples/.
func readValues(t *testing.T, file string) map[string]any {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(chartDir, "examples", file))
	if err != nil {
		t.Fatal(err)
	}
	var v map[string]any
	if err := yaml.UnmarshalStrict(data, &v); err != nil {
		t.Fatalf("examples/%s: %v", file, err)
	}
	return v
}

// buildFlashgate builds the flashgate binary into a temporary directory,
// in the product's module (this directory is a module of its own).
func buildFlashgate(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "flashgate")
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/flashgate")
	cmd.Dir = ".."
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// serveFlags reads the flags of `flashgate serve --help`: name → whether
// the flag takes a value (false: a bool).
func serveFlags(t *testing.T, bin string) map[string]bool {
	t.Helper()
	out, err := exec.Command(bin, "serve", "--help").Output()
	if err != nil {
		t.Fatalf("flashgate serve --help: %v", err)
	}
	// "  -h, --help   help", "      --backend string   where…"
	line := regexp.MustCompile(`^\s+(?:-\w, )?--([a-z0-9-]+)(?: ([a-zA-Z]+))?\s{2,}`)
	flags := map[string]bool{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		if m := line.FindStringSubmatch(sc.Text()); m != nil {
			flags[m[1]] = m[2] != ""
		}
	}
	// The parse must have found the flags the chart relies on, with the
	// right kinds, or every check below would be vacuous.
	for name, valued := range map[string]bool{"grpc-addr": true, "redis-addr": true, "shadow": false, "rls-response-headers": false} {
		if got, ok := flags[name]; !ok || got != valued {
			t.Fatalf("serve --help: flag %s not parsed (got %v, %v from %d flags)", name, got, ok, len(flags))
		}
	}
	return flags
}

// args parses a container's args, every one --name=value, checking each
// names a serve flag once and that a bool flag's value is a bool.
func args(t *testing.T, c *corev1.Container, flags map[string]bool) map[string]string {
	t.Helper()
	if len(c.Command) > 0 {
		t.Errorf("%s sets command %v: the image's ENTRYPOINT is flashgate serve", c.Name, c.Command)
	}
	out := map[string]string{}
	for _, a := range c.Args {
		name, value, ok := strings.Cut(strings.TrimPrefix(a, "--"), "=")
		if !strings.HasPrefix(a, "--") || !ok {
			t.Errorf("arg %q: want --flag=value", a)
			continue
		}
		valued, known := flags[name]
		switch {
		case !known:
			t.Errorf("arg %q: flashgate serve has no flag --%s", a, name)
		case !valued && value != "true" && value != "false":
			t.Errorf("arg %q: --%s is a bool", a, name)
		}
		if _, dup := out[name]; dup {
			t.Errorf("--%s given twice", name)
		}
		out[name] = value
	}
	for _, e := range c.Env {
		if flag, ok := strings.CutPrefix(e.Name, "FLASHGATE_"); ok {
			name := strings.ReplaceAll(strings.ToLower(flag), "_", "-")
			if _, known := flags[name]; !known {
				t.Errorf("env %s: flashgate serve has no flag --%s", e.Name, name)
			}
			if _, dup := out[name]; dup {
				t.Errorf("--%s set by an arg and by %s", name, e.Name)
			}
		}
	}
	return out
}

// containerPort resolves a named or numbered port of c; 0 if it has none.
func containerPort(c *corev1.Container, p intstr.IntOrString) int32 {
	for _, cp := range c.Ports {
		if (p.Type == intstr.String && cp.Name == p.StrVal) || (p.Type == intstr.Int && cp.ContainerPort == p.IntVal) {
			return cp.ContainerPort
		}
	}
	return 0
}

// listenPort returns the port of a listen address whose host must be one
// of wantHosts.
func listenPort(t *testing.T, flag, addr string, wantHosts ...string) int32 {
	t.Helper()
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		t.Errorf("--%s=%s: %v", flag, addr, err)
		return 0
	}
	if !slices.Contains(wantHosts, host) {
		t.Errorf("--%s=%s: host %q, want one of %q", flag, addr, host, wantHosts)
	}
	n, err := strconv.Atoi(port)
	if err != nil {
		t.Errorf("--%s=%s: %v", flag, addr, err)
	}
	return int32(n)
}

func selects(selector, labels map[string]string) bool {
	if len(selector) == 0 {
		return false
	}
	for k, v := range selector {
		if labels[k] != v {
			return false
		}
	}
	return true
}

func flashgateContainer(t *testing.T, spec *corev1.PodSpec) *corev1.Container {
	t.Helper()
	for i := range spec.Containers {
		if spec.Containers[i].Name == "flashgate" {
			return &spec.Containers[i]
		}
	}
	t.Fatalf("no container flashgate in %v", spec.Containers)
	return nil
}

// envoyGatewaySelector is examples/redis.yaml's envoySelector: the labels
// Envoy Gateway gives the Envoy proxies it runs.
var envoyGatewaySelector = map[string]string{
	"app.kubernetes.io/name":       "envoy",
	"app.kubernetes.io/component":  "proxy",
	"app.kubernetes.io/managed-by": "envoy-gateway",
}

// valueSet is one rendering of the chart and what it must produce.
type valueSet struct {
	file      string // examples/FILE; "" for the defaults
	sidecar   bool
	redis     string // the Redis address flashgate must use: "chart" for the chart's, "" for memory
	rls       bool
	httpAuthz bool
	hpa       bool
	tls       string            // "", "tls" or "mtls": the gRPC port's
	envoy     map[string]string // the networkPolicy.envoySelector in force
}

func TestChart(t *testing.T) {
	bin := buildFlashgate(t)
	flags := serveFlags(t, bin)
	chartFlags := map[string]bool{} // every flag some value set renders
	defaultEnvoy := map[string]string{"flashgate/client": "true"}
	sets := map[string]valueSet{
		"defaults":   {envoy: defaultEnvoy},
		"redis":      {file: "redis.yaml", redis: "chart", envoy: envoyGatewaySelector},
		"rls":        {file: "rls.yaml", redis: "redis-master.redis.svc:6379", rls: true, tls: "mtls", envoy: defaultEnvoy},
		"hpa":        {file: "hpa.yaml", redis: "redis-0.redis:6379,redis-1.redis:6379,redis-2.redis:6379", hpa: true, envoy: defaultEnvoy},
		"http-authz": {file: "http-authz.yaml", redis: "chart", httpAuthz: true, envoy: map[string]string{"app.kubernetes.io/name": "ingress-nginx"}},
		"sidecar":    {file: "sidecar.yaml", sidecar: true, redis: "chart", httpAuthz: true},
	}
	files, err := filepath.Glob(filepath.Join(chartDir, "examples", "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		if !slices.ContainsFunc(slices.Collect(maps.Values(sets)), func(s valueSet) bool { return s.file == filepath.Base(f) }) {
			t.Errorf("examples/%s is not rendered by TestChart: add it", filepath.Base(f))
		}
	}
	for name, set := range sets {
		t.Run(name, func(t *testing.T) {
			var values map[string]any
			if set.file != "" {
				values = readValues(t, set.file)
			}
			r, err := render(values)
			if err != nil {
				t.Fatal(err)
			}
			var spec *corev1.PodSpec
			if set.sidecar {
				spec = checkSidecar(t, r, set, flags)
			} else {
				spec = checkCentral(t, r, set, flags)
			}
			checkRedis(t, r, set)
			checkServeStarts(t, bin, r, spec, set)
			for _, a := range flashgateContainer(t, spec).Args {
				name, _, _ := strings.Cut(strings.TrimPrefix(a, "--"), "=")
				if extra, _ := values["extraArgs"].(map[string]any); extra[name] == nil {
					chartFlags[name] = true
				}
			}
		})
	}

	// extraArgs may not set again a flag the chart sets: pflag would take
	// the last one silently (or, for --redis-addr, both).
	for name := range chartFlags {
		_, err := render(map[string]any{"extraArgs": map[string]any{name: "x"}})
		if err == nil || !strings.Contains(err.Error(), "set by the chart") {
			t.Errorf("extraArgs.%s: render error %v, want the chart to refuse it", name, err)
		}
	}

	// extraArgs names a flag of serve's: the chart's list is serve's flags,
	// and each of them renders but those the chart sets itself.
	listed := chartServeFlags(t)
	for name := range flags {
		if name != "help" && !listed[name] {
			t.Errorf("flashgate serve has flag --%s, %s does not list it: add it", name, serveFlagsFile)
		}
	}
	for name := range listed {
		if _, ok := flags[name]; !ok || name == "help" {
			t.Errorf("%s lists --%s, which flashgate serve does not have: remove it", serveFlagsFile, name)
		}
		_, err := render(map[string]any{"extraArgs": map[string]any{name: "1"}})
		if err != nil && !strings.Contains(err.Error(), "set by the chart") {
			t.Errorf("extraArgs.%s: %v", name, err)
		}
	}
}

// serveFlagsFile lists serve's flags for the chart's extraArgs check.
const serveFlagsFile = chartDir + "/files/serve-flags.txt"

// chartServeFlags reads serveFlagsFile: one flag name a line, # comments.
func chartServeFlags(t *testing.T) map[string]bool {
	t.Helper()
	data, err := os.ReadFile(serveFlagsFile)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, line := range strings.Split(string(data), "\n") {
		if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, "#") {
			if out[line] {
				t.Errorf("%s lists %s twice", serveFlagsFile, line)
			}
			out[line] = true
		}
	}
	return out
}

// checkContainer checks the flashgate container and its pod: flags,
// listeners, probes, config mounts, hardening, drain.
func checkContainer(t *testing.T, r *rendered, spec *corev1.PodSpec, fg *corev1.Container, set valueSet, flags map[string]bool) {
	a := args(t, fg, flags)

	// Listeners: loopback as a sidecar, every address of the pod as a
	// central service; the metrics port always on the pod IP.
	hosts := []string{"", "0.0.0.0", "::"}
	if set.sidecar {
		hosts = []string{"127.0.0.1"}
	}
	grpcPort := listenPort(t, "grpc-addr", a["grpc-addr"], hosts...)
	metricsPort := listenPort(t, "http-addr", a["http-addr"], "", "0.0.0.0", "::")
	if set.sidecar {
		if p := containerPort(fg, intstr.FromInt32(grpcPort)); p != 0 {
			t.Errorf("the sidecar declares its loopback gRPC port %d", p)
		}
	} else if p := containerPort(fg, intstr.FromString("grpc")); p != grpcPort {
		t.Errorf("port grpc = %d, --grpc-addr listens on %d", p, grpcPort)
	}
	if p := containerPort(fg, intstr.FromString("http-metrics")); p != metricsPort {
		t.Errorf("port http-metrics = %d, --http-addr listens on %d", p, metricsPort)
	}
	if authz, on := a["http-authz-addr"]; on != set.httpAuthz {
		t.Errorf("--http-authz-addr set: %v, want %v", on, set.httpAuthz)
	} else if on {
		p := listenPort(t, "http-authz-addr", authz, hosts...)
		if !set.sidecar && containerPort(fg, intstr.FromString("http-authz")) != p {
			t.Errorf("port http-authz does not match --http-authz-addr=%s", authz)
		}
	}

	// Probes: HTTP on the metrics port, which kubelet reaches on the pod IP.
	for kind, want := range map[string]struct {
		p    *corev1.Probe
		path string
	}{
		"startup":   {fg.StartupProbe, "/healthz"},
		"readiness": {fg.ReadinessProbe, "/readyz"},
		"liveness":  {fg.LivenessProbe, "/healthz"},
	} {
		if want.p == nil || want.p.HTTPGet == nil {
			t.Errorf("%s probe: want httpGet %s, got %+v", kind, want.path, want.p)
			continue
		}
		if got := containerPort(fg, want.p.HTTPGet.Port); got != metricsPort || want.p.HTTPGet.Path != want.path || want.p.HTTPGet.Host != "" {
			t.Errorf("%s probe = %s on %d (host %q), want %s on --http-addr's %d", kind, want.p.HTTPGet.Path, got, want.p.HTTPGet.Host, want.path, metricsPort)
		}
	}

	// The backend.
	switch {
	case set.redis == "":
		if a["backend"] != "memory" || a["redis-addr"] != "" {
			t.Errorf("--backend=%s --redis-addr=%s, want memory", a["backend"], a["redis-addr"])
		}
	case set.redis == "chart":
		if a["backend"] != "redis" || a["redis-addr"] != release+"-flashgate-redis."+namespace+".svc:6379" {
			t.Errorf("--backend=%s --redis-addr=%s, want the chart's Redis", a["backend"], a["redis-addr"])
		}
	default:
		if a["backend"] != "redis" || a["redis-addr"] != set.redis {
			t.Errorf("--backend=%s --redis-addr=%s, want redis %s", a["backend"], a["redis-addr"], set.redis)
		}
	}

	// The descriptors file and the RLS directory: mounted as directories
	// from the rendered ConfigMaps, and valid by flashgate's own loaders.
	if file, ok := a["config"]; ok {
		cm, key := mountedConfigMap(t, r, spec, fg, path.Dir(file))
		data, ok := cm.Data[path.Base(file)]
		if !ok {
			t.Fatalf("--config=%s: ConfigMap %s has no key %s (keys %v, mounted key %s)", file, cm.Name, path.Base(file), slices.Collect(maps.Keys(cm.Data)), key)
		}
		if _, err := descriptors.ParseConfig(file, []byte(data)); err != nil {
			t.Errorf("ConfigMap %s: %v", cm.Name, err)
		}
		if set.file == "" && data != string(descriptors.ExampleYAML()) {
			t.Errorf("the default descriptors differ from descriptors/flashsale.yaml: copy it to charts/flashgate/files/flashsale.yaml")
		}
	}
	if dir, ok := a["rls-config"]; ok != set.rls {
		t.Errorf("--rls-config set: %v, want %v", ok, set.rls)
	} else if ok {
		cm, _ := mountedConfigMap(t, r, spec, fg, dir)
		var files []rls.File
		for _, k := range slices.Sorted(maps.Keys(cm.Data)) {
			files = append(files, rls.File{Name: path.Join(dir, k), Data: []byte(cm.Data[k])})
		}
		if len(files) == 0 {
			t.Errorf("ConfigMap %s is empty", cm.Name)
		}
		if _, err := rls.ParseFiles(files); err != nil {
			t.Errorf("ConfigMap %s: %v", cm.Name, err)
		}
	}

	// TLS on the gRPC port: the files of one Secret, mounted whole.
	wantTLS := map[string]string{}
	switch set.tls {
	case "mtls":
		wantTLS["grpc-tls-client-ca"] = "ca.crt"
		fallthrough
	case "tls":
		wantTLS["grpc-tls-cert"], wantTLS["grpc-tls-key"] = "tls.crt", "tls.key"
	}
	var tlsVolumes []string
	for _, flag := range []string{"grpc-tls-cert", "grpc-tls-key", "grpc-tls-client-ca"} {
		file, ok := a[flag]
		if ok != (wantTLS[flag] != "") {
			t.Errorf("--%s set: %v, want %v", flag, ok, wantTLS[flag] != "")
			continue
		}
		if !ok {
			continue
		}
		v := mountedVolume(t, spec, fg, path.Dir(file))
		if v.Secret == nil || len(v.Secret.Items) > 0 || path.Base(file) != wantTLS[flag] {
			t.Errorf("--%s=%s: want %s of a whole Secret", flag, file, wantTLS[flag])
		}
		tlsVolumes = append(tlsVolumes, v.Name)
	}
	if len(slices.Compact(tlsVolumes)) > 1 {
		t.Errorf("the TLS files come from volumes %v: mount one Secret, so they change together", tlsVolumes)
	}

	checkHardening(t, spec, fg)

	// Every example enforces: one in shadow mode would admit everything
	// while it looks like a working setup.
	if v, ok := a["shadow"]; ok && v != "false" {
		t.Errorf("--shadow=%s: the example enforces nothing", v)
	}

	checkGOMEMLIMIT(t, fg)

	// Drain: the grace period covers the preStop sleep and the drain.
	if fg.Lifecycle == nil || fg.Lifecycle.PreStop == nil || fg.Lifecycle.PreStop.Sleep == nil {
		t.Fatalf("flashgate has no preStop sleep")
	}
	drain, err := time.ParseDuration(a["drain-timeout"])
	if err != nil {
		t.Fatalf("--drain-timeout: %v", err)
	}
	if !set.sidecar {
		sleep := time.Duration(fg.Lifecycle.PreStop.Sleep.Seconds) * time.Second
		if g := spec.TerminationGracePeriodSeconds; g == nil || time.Duration(*g)*time.Second < sleep+drain+5*time.Second {
			t.Errorf("terminationGracePeriodSeconds = %v, want ≥ preStop %v + drain %v + 5s", g, sleep, drain)
		}
	}
}

// mountedConfigMap returns the rendered ConfigMap mounted, whole and
// read-only, at dir, and the volume's name.
func mountedConfigMap(t *testing.T, r *rendered, spec *corev1.PodSpec, fg *corev1.Container, dir string) (*corev1.ConfigMap, string) {
	t.Helper()
	v := mountedVolume(t, spec, fg, dir)
	if v.ConfigMap == nil || len(v.ConfigMap.Items) > 0 {
		t.Fatalf("volume %s: want a whole ConfigMap", v.Name)
	}
	cm := r.configMaps[v.ConfigMap.Name]
	if cm == nil {
		t.Fatalf("volume %s: ConfigMap %s is not rendered", v.Name, v.ConfigMap.Name)
	}
	return cm, v.Name
}

// mountedVolume returns the volume flashgate mounts, read-only and without
// subPath, at dir.
func mountedVolume(t *testing.T, spec *corev1.PodSpec, fg *corev1.Container, dir string) *corev1.Volume {
	t.Helper()
	var mount *corev1.VolumeMount
	for i := range fg.VolumeMounts {
		if fg.VolumeMounts[i].MountPath == dir {
			mount = &fg.VolumeMounts[i]
		}
	}
	if mount == nil {
		t.Fatalf("flashgate mounts nothing at %s", dir)
	}
	if mount.SubPath != "" || mount.SubPathExpr != "" || !mount.ReadOnly {
		t.Errorf("mount %s: want read-only and no subPath (kubelet's updates never reach a subPath)", dir)
	}
	for i := range spec.Volumes {
		if spec.Volumes[i].Name == mount.Name {
			return &spec.Volumes[i]
		}
	}
	t.Fatalf("no volume %s", mount.Name)
	return nil
}

func checkHardening(t *testing.T, spec *corev1.PodSpec, fg *corev1.Container) {
	t.Helper()
	if psc := spec.SecurityContext; psc == nil || psc.SeccompProfile == nil || psc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("pod seccompProfile must be RuntimeDefault")
	}
	sc := fg.SecurityContext
	switch {
	case sc == nil:
		t.Fatalf("flashgate has no securityContext")
	case sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot || sc.RunAsUser == nil || *sc.RunAsUser == 0:
		t.Errorf("flashgate must run as a non-root user")
	case sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem:
		t.Errorf("flashgate: readOnlyRootFilesystem not true")
	case sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation:
		t.Errorf("flashgate: allowPrivilegeEscalation not false")
	case sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Drop, "ALL") || len(sc.Capabilities.Add) > 0:
		t.Errorf("flashgate: capabilities must drop ALL and add none")
	}
	if fg.Resources.Requests.Cpu().IsZero() || fg.Resources.Requests.Memory().IsZero() || fg.Resources.Limits.Memory().IsZero() {
		t.Errorf("flashgate: want cpu and memory requests and a memory limit")
	}
	if !fg.Resources.Limits.Cpu().IsZero() {
		t.Errorf("flashgate: a CPU limit throttles checks past their deadline")
	}
}

func checkCentral(t *testing.T, r *rendered, set valueSet, flags map[string]bool) *corev1.PodSpec {
	name := release + "-flashgate"
	d := r.deployments[name]
	if d == nil {
		t.Fatalf("no Deployment %s (have %v)", name, slices.Collect(maps.Keys(r.deployments)))
	}
	spec := &d.Spec.Template.Spec
	pods := d.Spec.Template.Labels
	if d.Spec.Selector == nil || !selects(d.Spec.Selector.MatchLabels, pods) {
		t.Errorf("Deployment selector does not select its pods")
	}
	if spec.AutomountServiceAccountToken == nil || *spec.AutomountServiceAccountToken {
		t.Errorf("automountServiceAccountToken must be false: flashgate never talks to the API server")
	}
	fg := flashgateContainer(t, spec)
	checkContainer(t, r, spec, fg, set, flags)

	// The Service targets named ports the container has, and its pods.
	svc := r.services[name]
	if svc == nil {
		t.Fatalf("no Service %s", name)
	}
	if !selects(svc.Spec.Selector, pods) {
		t.Errorf("Service %s does not select the flashgate pods", name)
	}
	var svcPorts []string
	for _, p := range svc.Spec.Ports {
		svcPorts = append(svcPorts, p.Name)
		if p.TargetPort.Type != intstr.String || containerPort(fg, p.TargetPort) == 0 {
			t.Errorf("Service port %s targets %q: not a named port of flashgate", p.Name, p.TargetPort.String())
		}
	}
	want := []string{"grpc", "http-metrics"}
	if set.httpAuthz {
		want = append(want, "http-authz")
	}
	slices.Sort(svcPorts)
	slices.Sort(want)
	if !slices.Equal(svcPorts, want) {
		t.Errorf("Service ports %v, want %v", svcPorts, want)
	}

	// Only the Envoy pods reach the check ports.
	np := r.networkPolicies[name]
	if np == nil {
		t.Fatalf("no NetworkPolicy %s", name)
	}
	if !selects(np.Spec.PodSelector.MatchLabels, pods) {
		t.Errorf("NetworkPolicy %s does not select the flashgate pods", name)
	}
	checkPorts := map[int32]bool{}
	for _, rule := range np.Spec.Ingress {
		envoyOnly := len(rule.From) > 0
		for _, peer := range rule.From {
			if peer.PodSelector == nil || !maps.Equal(peer.PodSelector.MatchLabels, set.envoy) || peer.IPBlock != nil {
				envoyOnly = false
			}
		}
		for _, p := range rule.Ports {
			if p.Port == nil {
				t.Errorf("NetworkPolicy rule admits every port")
				continue
			}
			n := containerPort(fg, *p.Port)
			if n == 0 {
				t.Errorf("NetworkPolicy port %s is no port of flashgate", p.Port.String())
			}
			isCheck := p.Port.StrVal == "grpc" || p.Port.StrVal == "http-authz" || n == containerPort(fg, intstr.FromString("grpc"))
			if isCheck && !envoyOnly {
				t.Errorf("NetworkPolicy admits port %s from %v: only the Envoy pods %v may", p.Port.String(), rule.From, set.envoy)
			}
			if isCheck {
				checkPorts[n] = true
			}
		}
	}
	if !checkPorts[containerPort(fg, intstr.FromString("grpc"))] {
		t.Errorf("NetworkPolicy does not admit the Envoy pods to the gRPC port")
	}
	if set.httpAuthz && !checkPorts[containerPort(fg, intstr.FromString("http-authz"))] {
		t.Errorf("NetworkPolicy does not admit the Envoy pods to the HTTP front-end")
	}

	// Disruption budget, autoscaler.
	pdb := r.pdbs[name]
	if pdb == nil || pdb.Spec.Selector == nil || !selects(pdb.Spec.Selector.MatchLabels, pods) {
		t.Errorf("no PodDisruptionBudget %s selecting the flashgate pods", name)
	} else if pdb.Spec.MaxUnavailable == nil || pdb.Spec.MaxUnavailable.IntValue() < 1 {
		t.Errorf("PodDisruptionBudget maxUnavailable = %v: a node drain could never evict", pdb.Spec.MaxUnavailable)
	}
	hpa := r.hpas[name]
	if (hpa != nil) != set.hpa {
		t.Fatalf("HorizontalPodAutoscaler rendered: %v, want %v", hpa != nil, set.hpa)
	}
	if set.hpa {
		ref := hpa.Spec.ScaleTargetRef
		if ref.APIVersion != "apps/v1" || ref.Kind != "Deployment" || ref.Name != d.Name {
			t.Errorf("HorizontalPodAutoscaler scales %+v, want Deployment %s", ref, d.Name)
		}
		if d.Spec.Replicas != nil {
			t.Errorf("Deployment sets replicas under an autoscaler: every upgrade would reset them")
		}
		if hpa.Spec.MinReplicas == nil || *hpa.Spec.MinReplicas < 2 || hpa.Spec.MaxReplicas < *hpa.Spec.MinReplicas {
			t.Errorf("HorizontalPodAutoscaler replicas %v..%d", hpa.Spec.MinReplicas, hpa.Spec.MaxReplicas)
		}
	} else if d.Spec.Replicas == nil || (set.redis == "" && *d.Spec.Replicas != 1) {
		t.Errorf("Deployment replicas = %v (one only on the memory backend)", d.Spec.Replicas)
	}

	// The ServiceMonitor scrapes a port the Service has.
	for smName, sm := range r.serviceMonitors {
		if !selects(sm.Spec.Selector.MatchLabels, svc.Labels) {
			t.Errorf("ServiceMonitor %s does not select Service %s", smName, svc.Name)
		}
		for _, other := range r.services {
			if other != svc && selects(sm.Spec.Selector.MatchLabels, other.Labels) {
				t.Errorf("ServiceMonitor %s also selects Service %s", smName, other.Name)
			}
		}
		if len(sm.Spec.Endpoints) == 0 {
			t.Errorf("ServiceMonitor %s has no endpoints", smName)
		}
		for _, ep := range sm.Spec.Endpoints {
			if !slices.Contains(svcPorts, ep.Port) || ep.Path != "/metrics" {
				t.Errorf("ServiceMonitor %s scrapes %s%s: not the Service's metrics port", smName, ep.Port, ep.Path)
			}
			iv, err1 := time.ParseDuration(ep.Interval)
			st, err2 := time.ParseDuration(ep.ScrapeTimeout)
			if err1 != nil || err2 != nil || st > iv {
				t.Errorf("ServiceMonitor %s: interval %q, scrapeTimeout %q", smName, ep.Interval, ep.ScrapeTimeout)
			}
		}
	}
	if set.file == "redis.yaml" && len(r.serviceMonitors) != 1 {
		t.Errorf("%d ServiceMonitors, want 1", len(r.serviceMonitors))
	}
	return spec
}

// checkSidecar checks the pod spec fragment NOTES prints, as the pod it is
// pasted into would get it.
func checkSidecar(t *testing.T, r *rendered, set valueSet, flags map[string]bool) *corev1.PodSpec {
	central := release + "-flashgate"
	if r.deployments[central] != nil || r.services[central] != nil || r.networkPolicies[central] != nil ||
		len(r.pdbs)+len(r.hpas)+len(r.serviceMonitors) > 0 {
		t.Errorf("sidecar mode renders the central service's objects")
	}
	const begin, end = "# --- flashgate sidecar: pod spec fragment ---", "# --- end ---"
	_, rest, ok1 := strings.Cut(r.notes, begin)
	fragment, _, ok2 := strings.Cut(rest, end)
	if !ok1 || !ok2 {
		t.Fatalf("NOTES has no pod spec fragment:\n%s", r.notes)
	}
	js, err := yaml.YAMLToJSONStrict([]byte(fragment))
	if err != nil {
		t.Fatalf("NOTES fragment: %v\n%s", err, fragment)
	}
	var spec corev1.PodSpec
	if err := strictJSON(js, &spec); err != nil {
		t.Fatalf("NOTES fragment is no pod spec: %v\n%s", err, fragment)
	}
	// The pod it is pasted into brings the pod-level hardening.
	spec.SecurityContext = &corev1.PodSecurityContext{SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}}
	fg := flashgateContainer(t, &spec)
	checkContainer(t, r, &spec, fg, set, flags)
	return &spec
}

// checkRedis checks the chart's Redis, where it is on: flashgate's address
// names its Service, which selects it, and only flashgate reaches it.
func checkRedis(t *testing.T, r *rendered, set valueSet) {
	name := release + "-flashgate-redis"
	rd, svc, np := r.deployments[name], r.services[name], r.networkPolicies[name]
	if set.redis != "chart" {
		if rd != nil || svc != nil || np != nil {
			t.Errorf("the chart's Redis is rendered with redis.enabled off")
		}
		return
	}
	if rd == nil || svc == nil || np == nil {
		t.Fatalf("redis.enabled: Deployment %v, Service %v, NetworkPolicy %v", rd != nil, svc != nil, np != nil)
	}
	pods := rd.Spec.Template.Labels
	if !selects(svc.Spec.Selector, pods) || len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].Port != 6379 {
		t.Errorf("Service %s does not serve the Redis pods on 6379", name)
	}
	rc := &rd.Spec.Template.Spec.Containers[0]
	if containerPort(rc, svc.Spec.Ports[0].TargetPort) != 6379 {
		t.Errorf("Service %s targets %s, not Redis's 6379", name, svc.Spec.Ports[0].TargetPort.String())
	}
	if !slices.Contains(rc.Args, "noeviction") {
		t.Errorf("Redis must not evict: an evicted window admits more than its limit")
	}
	checkHardening(t, &rd.Spec.Template.Spec, &corev1.Container{SecurityContext: withUser(rc.SecurityContext, rd.Spec.Template.Spec.SecurityContext), Resources: rc.Resources})
	if !selects(np.Spec.PodSelector.MatchLabels, pods) {
		t.Errorf("NetworkPolicy %s does not select the Redis pods", name)
	}
	var clients map[string]string
	if set.sidecar {
		clients = map[string]string{"app.kubernetes.io/name": "flashsale-demo"}
	} else {
		clients = r.deployments[release+"-flashgate"].Spec.Template.Labels
	}
	if len(np.Spec.Ingress) != 1 || len(np.Spec.Ingress[0].From) != 1 || np.Spec.Ingress[0].From[0].PodSelector == nil ||
		!selects(np.Spec.Ingress[0].From[0].PodSelector.MatchLabels, clients) {
		t.Errorf("NetworkPolicy %s does not admit exactly flashgate's pods %v", name, clients)
	}
}

// withUser is the container security context with the pod's user filled in.
func withUser(c *corev1.SecurityContext, p *corev1.PodSecurityContext) *corev1.SecurityContext {
	if c == nil {
		return nil
	}
	out := c.DeepCopy()
	if out.RunAsUser == nil && p != nil {
		out.RunAsUser = p.RunAsUser
	}
	return out
}

// TestChartRefusesValueSets: value sets that would run a broken or unsafe
// service fail to render, with a message that says what to set.
func TestChartRefusesValueSets(t *testing.T) {
	tests := map[string]struct {
		values map[string]any
		want   string
	}{
		"memory backend, two replicas": {map[string]any{"replicaCount": 2}, "memory backend counts per pod"},
		"memory backend, autoscaled":   {map[string]any{"autoscaling": map[string]any{"enabled": true}}, "memory backend counts per pod"},
		"two Redis": {map[string]any{"redis": map[string]any{"enabled": true, "address": "r:6379"}},
			"not both"},
		"RLS without files": {map[string]any{"rls": map[string]any{"enabled": true}}, "rls.enabled needs rls.files"},
		"RLS file not yaml": {map[string]any{"rls": map[string]any{"enabled": true, "files": map[string]any{"api.conf": "domain: a"}}},
			"*.yaml and *.yml files only"},
		"extraArgs overrides a chart flag": {map[string]any{"extraArgs": map[string]any{"grpc-addr": "127.0.0.1:9191"}}, "set by the chart"},
		"extraArgs with dashes":            {map[string]any{"extraArgs": map[string]any{"--shadow": true}}, "without dashes"},
		"extraArgs misspelt":               {map[string]any{"extraArgs": map[string]any{"shadw": true}}, "flashgate serve has no flag --shadw"},
		"extraArgs help":                   {map[string]any{"extraArgs": map[string]any{"help": true}}, "flashgate serve has no flag --help"},
		"misspelt value":                   {map[string]any{"replicas": 2}, "replicas"},
		"misspelt nested value":            {map[string]any{"redis": map[string]any{"adress": "r:6379"}}, "adress"},
		"unknown failure mode":             {map[string]any{"failureMode": "open"}, "failureMode"},
		"bad duration":                     {map[string]any{"drainTimeout": "10"}, "drainTimeout"},
		"mTLS without TLS":                 {map[string]any{"grpcTLS": map[string]any{"clientCA": true}}, "grpcTLS.clientCA needs grpcTLS.secretName"},
		"sidecar Redis open": {map[string]any{"sidecar": map[string]any{"enabled": true}, "redis": map[string]any{"enabled": true}},
			"sidecar.podSelector is empty"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			_, err := render(tc.values)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("render: %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

// TestStrictDecodingRejects: the decoding the checks above rely on fails
// on what the API server would refuse.
func TestStrictDecodingRejects(t *testing.T) {
	good := "apiVersion: v1\nkind: Service\nmetadata: {name: s}\nspec:\n  ports:\n    - {name: grpc, port: 9191, targetPort: grpc}\n"
	if err := newRendered().add([]byte(good)); err != nil {
		t.Fatalf("good Service: %v", err)
	}
	sm := "apiVersion: monitoring.coreos.com/v1\nkind: ServiceMonitor\nmetadata: {name: m}\nspec:\n  endpoints:\n    - {port: http-metrics, path: /metrics}\n"
	if err := newRendered().add([]byte(sm)); err != nil {
		t.Fatalf("good ServiceMonitor: %v", err)
	}
	tests := map[string]struct{ doc, old, new string }{
		"unknown field":                {good, "targetPort", "targetport"},
		"duplicate key":                {good, "metadata: {name: s}", "metadata: {name: s, name: t}"},
		"wrong type":                   {good, "port: 9191", "port: grpc9191"},
		"unknown kind":                 {good, "kind: Service", "kind: Servise"},
		"ServiceMonitor unknown field": {sm, "path: /metrics", "metricsPath: /metrics"},
		"ServiceMonitor misplaced":     {sm, "spec:\n  endpoints", "spec:\n  endpoint"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if !strings.Contains(tc.doc, tc.old) {
				t.Fatalf("test document lacks %q", tc.old)
			}
			if err := newRendered().add([]byte(strings.Replace(tc.doc, tc.old, tc.new, 1))); err == nil {
				t.Errorf("accepted")
			}
		})
	}
}

// TestChartLint runs Helm's linter (helm lint) with every value set.
func TestChartLint(t *testing.T) {
	kv, err := common.ParseKubeVersion(kubeVersion)
	if err != nil {
		t.Fatal(err)
	}
	files, err := filepath.Glob(filepath.Join(chartDir, "examples", "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range append([]string{""}, files...) {
		var values map[string]any
		if f != "" {
			values = readValues(t, filepath.Base(f))
		}
		res := lint.RunAll(chartDir, values, namespace, lint.WithKubeVersion(kv))
		for _, m := range res.Messages {
			if m.Severity >= support.WarningSev {
				t.Errorf("helm lint (%s): %s", filepath.Base(f), m)
			}
		}
	}
}

// checkServeStarts runs the real `flashgate serve` with the container's
// args, its listen addresses moved to free loopback ports and its mounts to a
// temporary directory holding the ConfigMaps' files: serve must accept the
// flags together (some are refused in combination) and load the files, and
// answer /healthz; on the memory backend, /readyz too. Redis is never
// reached (health stays NOT_SERVING while serve retries it), which is all
// the probes need.
func checkServeStarts(t *testing.T, bin string, r *rendered, spec *corev1.PodSpec, set valueSet) {
	fg := flashgateContainer(t, spec)
	root := t.TempDir()
	mounts := map[string]string{} // mount path → where its files are
	for _, m := range fg.VolumeMounts {
		for _, v := range spec.Volumes {
			if v.Name != m.Name {
				continue
			}
			var files map[string]string
			switch {
			case v.ConfigMap != nil && r.configMaps[v.ConfigMap.Name] != nil:
				files = r.configMaps[v.ConfigMap.Name].Data
			case v.Secret != nil: // the TLS Secret, as cert-manager writes it
				files = selfSignedTLS(t)
			default:
				continue
			}
			dir := filepath.Join(root, m.MountPath)
			if err := os.MkdirAll(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			for k, data := range files {
				if err := os.WriteFile(filepath.Join(dir, k), []byte(data), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			mounts[m.MountPath] = dir
		}
	}
	var metrics string
	var cmdArgs []string
	for _, a := range fg.Args {
		name, value, _ := strings.Cut(strings.TrimPrefix(a, "--"), "=")
		switch {
		case strings.HasSuffix(name, "-addr") && name != "redis-addr":
			value = freeAddr(t)
			if name == "http-addr" {
				metrics = value
			}
		default:
			for mp, dir := range mounts {
				if value == mp || strings.HasPrefix(value, mp+"/") {
					value = dir + strings.TrimPrefix(value, mp)
				}
			}
		}
		cmdArgs = append(cmdArgs, "--"+name+"="+value)
	}
	if metrics == "" {
		t.Fatalf("no --http-addr: nothing to probe")
	}
	cmd := exec.Command(bin, append([]string{"serve"}, cmdArgs...)...)
	cmd.Env = []string{"HOME=" + root, "PATH=" + os.Getenv("PATH")}
	for _, e := range fg.Env {
		if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
			cmd.Env = append(cmd.Env, e.Name+"=from-a-secret")
		} else if e.ValueFrom == nil {
			cmd.Env = append(cmd.Env, e.Name+"="+e.Value)
		}
	}
	var logs syncBuffer
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer func() {
		_ = cmd.Process.Kill()
		<-exited
	}()
	want := map[string]int{"/healthz": 200}
	if set.redis == "" {
		want["/readyz"] = 200
	}
	client := &http.Client{Timeout: time.Second}
	deadline := time.Now().Add(15 * time.Second)
	for p, code := range want {
		for {
			resp, err := client.Get("http://" + metrics + p)
			if err == nil {
				_ = resp.Body.Close()
				if resp.StatusCode == code {
					break
				}
			}
			select {
			case err := <-exited:
				exited <- err
				t.Fatalf("flashgate serve %s exited: %v\n%s", strings.Join(cmdArgs, " "), err, logs.String())
			case <-time.After(50 * time.Millisecond):
			}
			if time.Now().After(deadline) {
				t.Fatalf("flashgate serve %s: %s never answered %d\n%s", strings.Join(cmdArgs, " "), p, code, logs.String())
			}
		}
	}
}

// selfSignedTLS returns the files of a kubernetes.io/tls Secret with a CA
// bundle: a self-signed certificate, its key, and itself as ca.crt.
func selfSignedTLS(t *testing.T) map[string]string {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "flashgate"},
		DNSNames:              []string{"flashgate"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	cert := string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
	return map[string]string{
		"tls.crt": cert,
		"tls.key": string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER})),
		"ca.crt":  cert,
	}
}

// freeAddr returns a loopback address with a port free a moment ago.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	return addr
}

// syncBuffer is a bytes.Buffer safe for a process's two output streams.
type syncBuffer struct {
	mu sync.Mutex // guards b
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestSidecarFromParentChart: a chart that depends on this one puts the
// sidecar into its own pods with the two named templates, as _sidecar.tpl
// documents, and gets the container and the volumes of this chart's
// ConfigMaps.
func TestSidecarFromParentChart(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join(chartDir, "templates", "_sidecar.tpl"))
	if err != nil {
		t.Fatal(err)
	}
	const includeContainer = `include "flashgate.sidecar.container" .Subcharts.flashgate`
	const includeVolumes = `include "flashgate.sidecar.volumes" .Subcharts.flashgate`
	for _, s := range []string{includeContainer, includeVolumes} {
		if !bytes.Contains(doc, []byte(s)) {
			t.Errorf("_sidecar.tpl no longer documents {{ %s }}: update this test", s)
		}
	}
	fgChart, err := loader.LoadDir(chartDir)
	if err != nil {
		t.Fatal(err)
	}
	app := `apiVersion: apps/v1
kind: Deployment
metadata:
  name: shop
spec:
  selector:
    matchLabels: {app: shop}
  template:
    metadata:
      labels: {app: shop}
    spec:
      containers:
        - name: envoy
          image: envoyproxy/envoy:distroless-v1.40-latest
        - {{ ` + includeContainer + ` | indent 10 | trim }}
      volumes:
        {{- ` + includeVolumes + ` | trim | nindent 8 }}
`
	parent := &chart.Chart{
		Metadata:  &chart.Metadata{APIVersion: chart.APIVersionV2, Name: "shop", Version: "1.0.0"},
		Templates: []*common.File{{Name: "templates/shop.yaml", Data: []byte(app)}},
		Values:    map[string]any{},
	}
	parent.AddDependency(fgChart)
	r, err := renderChart(parent, map[string]any{"flashgate": map[string]any{
		"sidecar": map[string]any{"enabled": true, "podSelector": map[string]any{"app": "shop"}},
		"redis":   map[string]any{"enabled": true},
	}})
	if err != nil {
		t.Fatal(err)
	}
	d := r.deployments["shop"]
	if d == nil {
		t.Fatalf("no Deployment shop (have %v)", slices.Collect(maps.Keys(r.deployments)))
	}
	spec := &d.Spec.Template.Spec
	fg := flashgateContainer(t, spec)
	if !slices.Contains(fg.Args, "--grpc-addr=127.0.0.1:9191") {
		t.Errorf("the sidecar's args %v: want --grpc-addr=127.0.0.1:9191", fg.Args)
	}
	cm, _ := mountedConfigMap(t, r, spec, fg, "/etc/flashgate/descriptors")
	if _, err := descriptors.ParseConfig(cm.Name, []byte(cm.Data["descriptors.yaml"])); err != nil {
		t.Error(err)
	}
	np := r.networkPolicies[release+"-flashgate-redis"]
	if np == nil || len(np.Spec.Ingress) != 1 || len(np.Spec.Ingress[0].From) != 1 || np.Spec.Ingress[0].From[0].PodSelector == nil ||
		!selects(np.Spec.Ingress[0].From[0].PodSelector.MatchLabels, d.Spec.Template.Labels) {
		t.Errorf("the Redis NetworkPolicy does not admit the parent chart's pods")
	}
}

// peerPod is a pod that may open a connection to flashgate's pods.
type peerPod struct {
	namespace string
	labels    map[string]string
}

// admits reports whether np, a policy of namespace ns, admits a connection
// from pod to the container port named port of the pods it selects, by
// NetworkPolicy's rules: a peer with a podSelector alone means pods of the
// policy's namespace; with a namespaceSelector too, pods of the namespaces
// it selects (labelled kubernetes.io/metadata.name, as the API server
// labels every namespace); a rule without from admits every source, one
// without ports every port.
func admits(t *testing.T, np *networkingv1.NetworkPolicy, ns string, fg *corev1.Container, pod peerPod, port string) bool {
	t.Helper()
	matches := func(sel *metav1.LabelSelector, labels map[string]string) bool {
		s, err := metav1.LabelSelectorAsSelector(sel)
		if err != nil {
			t.Fatalf("NetworkPolicy %s: %v", np.Name, err)
		}
		return s.Matches(klabels.Set(labels))
	}
	nsLabels := map[string]string{"kubernetes.io/metadata.name": pod.namespace}
	want := containerPort(fg, intstr.FromString(port))
	if want == 0 {
		t.Fatalf("flashgate has no port %s", port)
	}
	for _, rule := range np.Spec.Ingress {
		portOK := len(rule.Ports) == 0
		for _, p := range rule.Ports {
			if p.Port == nil || containerPort(fg, *p.Port) == want {
				portOK = true
			}
		}
		fromOK := len(rule.From) == 0
		for _, peer := range rule.From {
			switch {
			case peer.IPBlock != nil:
				continue
			case peer.NamespaceSelector == nil && pod.namespace != ns:
				continue
			case peer.NamespaceSelector != nil && !matches(peer.NamespaceSelector, nsLabels):
				continue
			case peer.PodSelector != nil && !matches(peer.PodSelector, pod.labels):
				continue
			}
			fromOK = true
		}
		if portOK && fromOK {
			return true
		}
	}
	return false
}

// TestNetworkPolicyAdmitsEnvoyGatewayProxies: with examples/redis.yaml
// (flashgate behind Envoy Gateway), the policy lets Envoy Gateway's proxies,
// labelled as Envoy Gateway labels them, reach the gRPC port, and nothing
// else; a selector that matched no proxy would turn rate limiting off
// silently (the rate limit filter fails open by default).
func TestNetworkPolicyAdmitsEnvoyGatewayProxies(t *testing.T) {
	r, err := render(readValues(t, "redis.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	name := release + "-flashgate"
	np, d := r.networkPolicies[name], r.deployments[name]
	if np == nil || d == nil {
		t.Fatalf("NetworkPolicy %v, Deployment %v", np != nil, d != nil)
	}
	fg := flashgateContainer(t, &d.Spec.Template.Spec)
	// The labels of a proxy pod of Envoy Gateway's Deployment, every one
	// as Envoy Gateway sets it (the pod-template-hash as the ReplicaSet adds it).
	proxy := map[string]string{
		"app.kubernetes.io/name":                         "envoy",
		"app.kubernetes.io/component":                    "proxy",
		"app.kubernetes.io/managed-by":                   "envoy-gateway",
		"gateway.envoyproxy.io/owning-gateway-name":      "eg",
		"gateway.envoyproxy.io/owning-gateway-namespace": "default",
		"pod-template-hash":                              "5d8f7c9b6d",
	}
	without := func(key string) map[string]string {
		m := maps.Clone(proxy)
		delete(m, key)
		return m
	}
	tests := map[string]struct {
		pod  peerPod
		want bool
	}{
		"Envoy Gateway's proxy":              {peerPod{"envoy-gateway-system", proxy}, true},
		"a proxy in another namespace":       {peerPod{namespace, proxy}, false},
		"the controller's old selector":      {peerPod{"envoy-gateway-system", map[string]string{"app.kubernetes.io/name": "envoy-gateway"}}, false},
		"no name label":                      {peerPod{"envoy-gateway-system", without("app.kubernetes.io/name")}, false},
		"no component label":                 {peerPod{"envoy-gateway-system", without("app.kubernetes.io/component")}, false},
		"an Envoy Envoy Gateway did not run": {peerPod{"envoy-gateway-system", without("app.kubernetes.io/managed-by")}, false},
		"an unlabelled pod":                  {peerPod{"envoy-gateway-system", nil}, false},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if got := admits(t, np, namespace, fg, tc.pod, "grpc"); got != tc.want {
				t.Errorf("gRPC port: admitted %v, want %v", got, tc.want)
			}
		})
	}
	// The metrics port is for the monitoring namespace, not the proxies.
	if admits(t, np, namespace, fg, peerPod{"envoy-gateway-system", proxy}, "http-metrics") {
		t.Errorf("the proxies reach the metrics port")
	}
	if !admits(t, np, namespace, fg, peerPod{"monitoring", nil}, "http-metrics") {
		t.Errorf("Prometheus in monitoring does not reach the metrics port")
	}
}

// checkGOMEMLIMIT checks that GOMEMLIMIT is 90% of the container's memory
// limit, in bytes: the rest is the margin for what the Go runtime does not
// count (checkServeStarts runs serve with it, so Go parses it too).
func checkGOMEMLIMIT(t *testing.T, fg *corev1.Container) {
	t.Helper()
	limit := fg.Resources.Limits.Memory().Value()
	want := strconv.FormatInt(limit*9/10, 10)
	var got []string
	for _, e := range fg.Env {
		if e.Name == "GOMEMLIMIT" {
			if e.ValueFrom != nil {
				t.Errorf("GOMEMLIMIT from %v: the Downward API gives the whole limit, no headroom", e.ValueFrom)
			}
			got = append(got, e.Value)
		}
	}
	if len(got) != 1 || got[0] != want {
		t.Errorf("GOMEMLIMIT = %q, want [%s] (90%% of limits.memory %s)", got, want, fg.Resources.Limits.Memory())
	}
}

// TestGOMEMLIMIT: GOMEMLIMIT is 90% of the memory limit however the limit
// is written, absent without one, and a limit the chart cannot compute
// fails the rendering.
func TestGOMEMLIMIT(t *testing.T) {
	tests := map[string]struct {
		limit any    // resources.limits.memory; nil: none
		want  string // GOMEMLIMIT; "" absent
		err   string
	}{
		"Mi":         {limit: "256Mi", want: "241591910"},
		"Gi":         {limit: "2Gi", want: "1932735283"},
		"M":          {limit: "500M", want: "450000000"},
		"k":          {limit: "300000k", want: "270000000"},
		"bytes":      {limit: "268435456", want: "241591910"},
		"a number":   {limit: 268435456, want: "241591910"},
		"no limit":   {limit: nil, want: ""},
		"a fraction": {limit: "1.5Gi", err: `resources.limits.memory "1.5Gi"`},
		"MB":         {limit: "256MB", err: `resources.limits.memory "256MB"`},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			limits := map[string]any{"memory": tc.limit} // nil removes the default, as in Helm
			r, err := render(map[string]any{"resources": map[string]any{"requests": map[string]any{"cpu": "200m", "memory": "64Mi"}, "limits": limits}})
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("render: %v, want an error containing %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			fg := flashgateContainer(t, &r.deployments[release+"-flashgate"].Spec.Template.Spec)
			var got string
			for _, e := range fg.Env {
				if e.Name == "GOMEMLIMIT" {
					got = e.Value
				}
			}
			if got != tc.want {
				t.Errorf("GOMEMLIMIT = %q, want %q", got, tc.want)
			}
		})
	}
}
