package k8s

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extauthzv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_authz/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/anypb"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"
)

// objects is every Kubernetes object of a set of manifests, by kind and name.
type objects struct {
	deployments     map[string]*appsv1.Deployment
	services        map[string]*corev1.Service
	configMaps      map[string]*corev1.ConfigMap
	networkPolicies map[string]*networkingv1.NetworkPolicy
	ingresses       map[string]*networkingv1.Ingress
}

var docSep = regexp.MustCompile(`(?m)^---[ \t]*$`)

// splitDocs splits a multi-document YAML file, dropping empty documents.
func splitDocs(data []byte) [][]byte {
	var out [][]byte
	for _, d := range docSep.Split(string(data), -1) {
		if strings.TrimSpace(stripComments(d)) != "" {
			out = append(out, []byte(d))
		}
	}
	return out
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

// decodeStrict decodes one document into the k8s.io/api type of its kind;
// unknown fields, duplicate keys and unknown kinds are errors.
func decodeStrict(doc []byte, into *objects) error {
	var tm struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
	}
	if err := yaml.Unmarshal(doc, &tm); err != nil {
		return err
	}
	js, err := yaml.YAMLToJSONStrict(doc)
	if err != nil {
		return err
	}
	switch tm.APIVersion + " " + tm.Kind {
	case "apps/v1 Deployment":
		var o appsv1.Deployment
		if err := strictJSON(js, &o); err != nil {
			return fmt.Errorf("Deployment: %w", err)
		}
		into.deployments[o.Name] = &o
	case "v1 Service":
		var o corev1.Service
		if err := strictJSON(js, &o); err != nil {
			return fmt.Errorf("Service: %w", err)
		}
		into.services[o.Name] = &o
	case "v1 ConfigMap":
		var o corev1.ConfigMap
		if err := strictJSON(js, &o); err != nil {
			return fmt.Errorf("ConfigMap: %w", err)
		}
		into.configMaps[o.Name] = &o
	case "networking.k8s.io/v1 NetworkPolicy":
		var o networkingv1.NetworkPolicy
		if err := strictJSON(js, &o); err != nil {
			return fmt.Errorf("NetworkPolicy: %w", err)
		}
		into.networkPolicies[o.Name] = &o
	case "networking.k8s.io/v1 Ingress":
		var o networkingv1.Ingress
		if err := strictJSON(js, &o); err != nil {
			return fmt.Errorf("Ingress: %w", err)
		}
		into.ingresses[o.Name] = &o
	default:
		return fmt.Errorf("unexpected object %q %q: add it to decodeStrict", tm.APIVersion, tm.Kind)
	}
	return nil
}

// strictJSON decodes like the API server's strict field validation: field
// names are case-sensitive (encoding/json's are not: readOnlyRootFileSystem
// would pass), unknown and duplicate fields are errors.
func strictJSON(js []byte, into any) error {
	strictErrs, err := kjson.UnmarshalStrict(js, into)
	if err != nil {
		return err
	}
	return errors.Join(strictErrs...)
}

// loadKustomization decodes dir/kustomization.yaml, checks every listed file
// exists, and decodes the listed Kubernetes manifests strictly.
func loadKustomization(t *testing.T, dir string) (listed []string, objs *objects) {
	t.Helper()
	var k struct {
		APIVersion string   `json:"apiVersion"`
		Kind       string   `json:"kind"`
		Resources  []string `json:"resources"`
	}
	data, err := os.ReadFile(filepath.Join(dir, "kustomization.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.UnmarshalStrict(data, &k); err != nil {
		t.Fatalf("%s/kustomization.yaml: %v", dir, err)
	}
	if k.APIVersion != "kustomize.config.k8s.io/v1beta1" || k.Kind != "Kustomization" {
		t.Errorf("%s/kustomization.yaml: apiVersion/kind = %s/%s", dir, k.APIVersion, k.Kind)
	}
	objs = &objects{
		deployments:     map[string]*appsv1.Deployment{},
		services:        map[string]*corev1.Service{},
		configMaps:      map[string]*corev1.ConfigMap{},
		networkPolicies: map[string]*networkingv1.NetworkPolicy{},
		ingresses:       map[string]*networkingv1.Ingress{},
	}
	for _, r := range k.Resources {
		path := filepath.Join(dir, r)
		data, err := os.ReadFile(path)
		if err != nil {
			t.Errorf("%s/kustomization.yaml lists %s: %v", dir, r, err)
			continue
		}
		if !strings.HasSuffix(r, ".yaml") {
			continue
		}
		var generic map[string]any
		for i, doc := range splitDocs(data) {
			if err := yaml.Unmarshal(doc, &generic); err != nil {
				t.Errorf("%s doc %d: %v", path, i, err)
				continue
			}
			if strings.Contains(fmt.Sprint(generic["apiVersion"]), "istio.io") {
				continue // checked by the Istio tests
			}
			if err := decodeStrict(doc, objs); err != nil {
				t.Errorf("%s doc %d: %v", path, i, err)
			}
		}
	}
	return k.Resources, objs
}

func TestKustomizationListsEveryCoreManifest(t *testing.T) {
	for _, dir := range []string{".", "istio", "ingress-nginx"} {
		listed, _ := loadKustomization(t, dir)
		files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		// Install-time and alternative resources are deliberately unlisted.
		unlisted := map[string]bool{
			"kustomization.yaml": true, "mesh-config.yaml": true, "envoyfilter.yaml": true, "authorizationpolicy-http.yaml": true,
			"controller-configmap.yaml": true,
		}
		for _, f := range files {
			base := filepath.Base(f)
			if !unlisted[base] && !slices.Contains(listed, base) {
				t.Errorf("%s/kustomization.yaml does not list %s", dir, base)
			}
		}
	}
}

func TestStrictDecodingRejectsUnknownFields(t *testing.T) {
	data, err := os.ReadFile("deployment.yaml")
	if err != nil {
		t.Fatal(err)
	}
	tests := map[string]struct{ old, new string }{
		"unknown field":    {"readOnlyRootFilesystem: true", "readOnlyRootFileSystem: true"},
		"misplaced field":  {"terminationGracePeriodSeconds: 45", "terminationGracePeriod: 45"},
		"wrong value type": {"replicas: 2", "replicas: two"},
		"unknown kind":     {"kind: Deployment", "kind: Deploymnet"},
		"duplicate key":    {"  replicas: 2\n", "  replicas: 2\n  replicas: 3\n"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if !bytes.Contains(data, []byte(tc.old)) {
				t.Fatalf("deployment.yaml no longer contains %q: update this test", tc.old)
			}
			broken := bytes.Replace(data, []byte(tc.old), []byte(tc.new), 1)
			objs := &objects{deployments: map[string]*appsv1.Deployment{}}
			var failed bool
			for _, doc := range splitDocs(broken) {
				if err := decodeStrict(doc, objs); err != nil {
					failed = true
					t.Log(err)
				}
			}
			if !failed {
				t.Errorf("broken manifest accepted")
			}
		})
	}
}

func container(t *testing.T, spec *corev1.PodSpec, name string) *corev1.Container {
	t.Helper()
	for i := range spec.Containers {
		if spec.Containers[i].Name == name {
			return &spec.Containers[i]
		}
	}
	t.Fatalf("no container %q", name)
	return nil
}

func env(c *corev1.Container, name string) string {
	for _, e := range c.Env {
		if e.Name == name {
			return e.Value
		}
	}
	return ""
}

// portNumber resolves a probe's or Service's port (number or name) against c.
func portNumber(t *testing.T, c *corev1.Container, p intstr.IntOrString) int32 {
	t.Helper()
	if p.Type == intstr.Int {
		return p.IntVal
	}
	for _, cp := range c.Ports {
		if cp.Name == p.StrVal {
			return cp.ContainerPort
		}
	}
	t.Fatalf("container %s has no port named %q", c.Name, p.StrVal)
	return 0
}

// podShapes are the Deployments that carry a flashgate sidecar, with the
// containers that must leave before it.
var podShapes = []struct {
	dir, deployment string
	before          []string // containers whose preStop sleep must end before flashgate's
}{
	{dir: ".", deployment: "flashsale-demo", before: []string{"envoy", "app"}},
	{dir: "istio", deployment: "flashsale-demo-mesh", before: []string{"app"}},
}

func TestFlashgateSidecar(t *testing.T) {
	for _, shape := range podShapes {
		t.Run(shape.deployment, func(t *testing.T) {
			_, objs := loadKustomization(t, shape.dir)
			d := objs.deployments[shape.deployment]
			if d == nil {
				t.Fatalf("no Deployment %s in %s", shape.deployment, shape.dir)
			}
			spec := &d.Spec.Template.Spec
			fg := container(t, spec, "flashgate")

			// The ext_authz gRPC server is loopback only and never a declared port.
			host, port, err := net.SplitHostPort(env(fg, "FLASHGATE_GRPC_ADDR"))
			if err != nil || host != "127.0.0.1" || port != "9191" {
				t.Errorf("FLASHGATE_GRPC_ADDR = %q, want 127.0.0.1:9191", env(fg, "FLASHGATE_GRPC_ADDR"))
			}
			for _, a := range append(slices.Clone(fg.Args), fg.Command...) {
				if strings.Contains(a, "grpc-addr") {
					t.Errorf("flashgate arg %q: set the gRPC address once, in FLASHGATE_GRPC_ADDR", a)
				}
			}
			for _, p := range fg.Ports {
				if p.ContainerPort == 9191 {
					t.Errorf("flashgate declares port 9191: it is loopback only")
				}
			}
			// So is the HTTP front-end, where it is on.
			if a := env(fg, "FLASHGATE_HTTP_AUTHZ_ADDR"); a != "" {
				host, port, err := net.SplitHostPort(a)
				if err != nil || host != "127.0.0.1" {
					t.Errorf("FLASHGATE_HTTP_AUTHZ_ADDR = %q, want 127.0.0.1:PORT", a)
				}
				for _, p := range fg.Ports {
					if strconv.Itoa(int(p.ContainerPort)) == port {
						t.Errorf("flashgate declares port %s: the HTTP front-end is loopback only", port)
					}
				}
			}

			// Probes: kubelet connects to the pod IP, so they cannot use the
			// loopback gRPC port; they use the HTTP port, bound to all addresses.
			_, httpPort, err := net.SplitHostPort(env(fg, "FLASHGATE_HTTP_ADDR"))
			if err != nil {
				t.Fatalf("FLASHGATE_HTTP_ADDR = %q: %v", env(fg, "FLASHGATE_HTTP_ADDR"), err)
			}
			probes := map[string]struct {
				p    *corev1.Probe
				path string
			}{
				"readiness": {fg.ReadinessProbe, "/readyz"},
				"liveness":  {fg.LivenessProbe, "/healthz"},
			}
			for kind, want := range probes {
				if want.p == nil || want.p.HTTPGet == nil {
					t.Errorf("flashgate %s probe: want httpGet %s, got %+v", kind, want.path, want.p)
					continue
				}
				if got := portNumber(t, fg, want.p.HTTPGet.Port); strconv.Itoa(int(got)) != httpPort || want.p.HTTPGet.Path != want.path {
					t.Errorf("flashgate %s probe = %s on %d, want %s on %s", kind, want.p.HTTPGet.Path, got, want.path, httpPort)
				}
				if want.p.HTTPGet.Host != "" {
					t.Errorf("flashgate %s probe sets host %q: kubelet would leave the pod", kind, want.p.HTTPGet.Host)
				}
			}

			// Redis, config and the directory mount.
			if got := env(fg, "FLASHGATE_BACKEND"); got != "redis" {
				t.Errorf("FLASHGATE_BACKEND = %q, want redis", got)
			}
			checkDescriptorsMount(t, spec, fg, "flashgate-descriptors")

			// Hardening of every container and of the pod.
			checkHardening(t, spec)

			// Drain order: flashgate's preStop outlasts the others', and the
			// grace period covers it with room for flashgate's own drain.
			fgSleep := preStopSleep(t, fg)
			for _, name := range shape.before {
				if s := preStopSleep(t, container(t, spec, name)); s >= fgSleep {
					t.Errorf("%s preStop sleeps %ds, flashgate %ds: flashgate must leave last", name, s, fgSleep)
				}
			}
			drain, err := time.ParseDuration(env(fg, "FLASHGATE_DRAIN_TIMEOUT"))
			if err != nil {
				t.Fatalf("FLASHGATE_DRAIN_TIMEOUT: %v", err)
			}
			if g := spec.TerminationGracePeriodSeconds; g == nil || time.Duration(*g)*time.Second < time.Duration(fgSleep)*time.Second+drain+5*time.Second {
				t.Errorf("terminationGracePeriodSeconds = %v, want ≥ flashgate's preStop (%ds) + drain timeout (%v) + 5s", g, fgSleep, drain)
			}
		})
	}
}

// checkDescriptorsMount asserts that fg mounts ConfigMap configMap as a
// directory, read-only, and reads its flashsale.yaml.
func checkDescriptorsMount(t *testing.T, spec *corev1.PodSpec, fg *corev1.Container, configMap string) {
	t.Helper()
	var volume string
	for _, v := range spec.Volumes {
		if v.ConfigMap != nil && v.ConfigMap.Name == configMap {
			volume = v.Name
			if len(v.ConfigMap.Items) > 0 {
				t.Errorf("volume %s selects items: mount the whole ConfigMap", v.Name)
			}
		}
	}
	if volume == "" {
		t.Fatalf("no volume from ConfigMap %s", configMap)
	}
	var mount *corev1.VolumeMount
	for i := range fg.VolumeMounts {
		if fg.VolumeMounts[i].Name == volume {
			mount = &fg.VolumeMounts[i]
		}
	}
	if mount == nil {
		t.Fatalf("flashgate does not mount volume %s", volume)
	}
	if mount.SubPath != "" || mount.SubPathExpr != "" {
		t.Errorf("descriptors mounted with subPath: ConfigMap updates would never reach flashgate")
	}
	if !mount.ReadOnly {
		t.Errorf("descriptors mount must be readOnly")
	}
	if got, want := env(fg, "FLASHGATE_CONFIG"), mount.MountPath+"/flashsale.yaml"; got != want {
		t.Errorf("FLASHGATE_CONFIG = %q, want %q (the file inside the mounted directory)", got, want)
	}
}

func checkHardening(t *testing.T, spec *corev1.PodSpec) {
	t.Helper()
	psc := spec.SecurityContext
	if psc == nil || psc.SeccompProfile == nil || psc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("pod seccompProfile must be RuntimeDefault")
	}
	podNonRoot := psc != nil && psc.RunAsNonRoot != nil && *psc.RunAsNonRoot
	if spec.AutomountServiceAccountToken == nil || *spec.AutomountServiceAccountToken {
		t.Errorf("automountServiceAccountToken must be false: no container talks to the API server")
	}
	for _, c := range spec.Containers {
		sc := c.SecurityContext
		if sc == nil {
			t.Errorf("%s: no securityContext", c.Name)
			continue
		}
		if !podNonRoot && (sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot) {
			t.Errorf("%s: runAsNonRoot not set", c.Name)
		}
		if sc.RunAsUser != nil && *sc.RunAsUser == 0 {
			t.Errorf("%s: runAsUser 0", c.Name)
		}
		if sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
			t.Errorf("%s: readOnlyRootFilesystem not true", c.Name)
		}
		if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
			t.Errorf("%s: allowPrivilegeEscalation not false", c.Name)
		}
		if sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Drop, "ALL") || len(sc.Capabilities.Add) > 0 {
			t.Errorf("%s: capabilities must drop ALL and add none", c.Name)
		}
		if c.Resources.Requests.Cpu().IsZero() || c.Resources.Requests.Memory().IsZero() || c.Resources.Limits.Memory().IsZero() {
			t.Errorf("%s: want cpu and memory requests and a memory limit", c.Name)
		}
		if c.Name == "flashgate" {
			checkGOMEMLIMIT(t, &c)
		}
	}
}

// checkGOMEMLIMIT checks that flashgate's GOMEMLIMIT is a literal 85–90% of
// its memory limit: the Downward API would give the whole limit, leaving no
// room for what the Go runtime does not count.
func checkGOMEMLIMIT(t *testing.T, c *corev1.Container) {
	t.Helper()
	v := env(c, "GOMEMLIMIT")
	units := []struct {
		suffix string
		bytes  int64
	}{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}, {"B", 1}, {"", 1}}
	var got int64
	for _, u := range units {
		if n, ok := strings.CutSuffix(v, u.suffix); ok {
			i, err := strconv.ParseInt(n, 10, 64)
			if err != nil {
				t.Errorf("%s: GOMEMLIMIT %q: %v", c.Name, v, err)
				return
			}
			got = i * u.bytes
			break
		}
	}
	limit := c.Resources.Limits.Memory().Value()
	if got < limit*85/100 || got > limit*90/100 {
		t.Errorf("%s: GOMEMLIMIT %q is %d bytes, want 85–90%% of limits.memory %s (%d)", c.Name, v, got, c.Resources.Limits.Memory(), limit)
	}
}

func preStopSleep(t *testing.T, c *corev1.Container) int64 {
	t.Helper()
	if c.Lifecycle == nil || c.Lifecycle.PreStop == nil || c.Lifecycle.PreStop.Sleep == nil {
		t.Fatalf("%s: want a preStop sleep (exec needs a shell the images do not have)", c.Name)
	}
	return c.Lifecycle.PreStop.Sleep.Seconds
}

func TestCoreWiring(t *testing.T) {
	_, objs := loadKustomization(t, ".")

	// ConfigMaps hold the repository's files byte for byte.
	for _, cm := range []struct{ name, key, file string }{
		{"flashgate-descriptors", "flashsale.yaml", "../descriptors/flashsale.yaml"},
		{"flashgate-envoy", "envoy.yaml", "../envoy/envoy-sidecar.yaml"},
	} {
		want, err := os.ReadFile(cm.file)
		if err != nil {
			t.Fatal(err)
		}
		got := objs.configMaps[cm.name]
		if got == nil {
			t.Errorf("no ConfigMap %s", cm.name)
			continue
		}
		if got.Data[cm.key] != string(want) {
			t.Errorf("ConfigMap %s data %s differs from %s: regenerate it from the file", cm.name, cm.key, cm.file)
		}
	}

	d := objs.deployments["flashsale-demo"]
	if d == nil {
		t.Fatal("no Deployment flashsale-demo")
	}
	spec := &d.Spec.Template.Spec
	podLabels := d.Spec.Template.Labels
	if !selects(d.Spec.Selector.MatchLabels, podLabels) {
		t.Errorf("Deployment selector %v does not select its pods %v", d.Spec.Selector.MatchLabels, podLabels)
	}

	// Envoy mounts its ConfigMap, and the Service targets Envoy's port.
	envoy := container(t, spec, "envoy")
	gomod, err := os.ReadFile("../go.mod")
	if err != nil {
		t.Fatal(err)
	}
	if m := regexp.MustCompile(`go-control-plane/envoy (v\d+\.\d+)\.`).FindSubmatch(gomod); m == nil || !strings.Contains(envoy.Image, string(m[1])) {
		t.Errorf("envoy image %q: want the Envoy line of go-control-plane's envoy module in go.mod (%s)", envoy.Image, m)
	}
	if !slices.Contains(envoy.Args, "/etc/envoy/envoy.yaml") {
		t.Errorf("envoy args %v do not load /etc/envoy/envoy.yaml", envoy.Args)
	}
	var envoyVolume string
	for _, v := range spec.Volumes {
		if v.ConfigMap != nil && v.ConfigMap.Name == "flashgate-envoy" {
			envoyVolume = v.Name
		}
	}
	if !slices.ContainsFunc(envoy.VolumeMounts, func(m corev1.VolumeMount) bool {
		return m.Name == envoyVolume && m.MountPath == "/etc/envoy" && m.SubPath == ""
	}) {
		t.Errorf("envoy does not mount ConfigMap flashgate-envoy at /etc/envoy")
	}
	svc := objs.services["flashsale-demo"]
	if svc == nil || !selects(svc.Spec.Selector, podLabels) {
		t.Fatalf("Service flashsale-demo missing or not selecting the pods")
	}
	if got := portNumber(t, envoy, svc.Spec.Ports[0].TargetPort); got != 8080 {
		t.Errorf("Service flashsale-demo targets %d, want Envoy's 8080", got)
	}

	// The app listens on the address envoy-sidecar.yaml routes to, and
	// outlives Envoy on shutdown.
	app := container(t, spec, "app")
	if a, e := preStopSleep(t, app), preStopSleep(t, envoy); a <= e {
		t.Errorf("app preStop sleeps %ds, envoy %ds: the app must outlive Envoy", a, e)
	}
	if !slices.Contains(app.Args, "-listen=127.0.0.1:8081") {
		t.Errorf("app args %v: want -listen=127.0.0.1:8081 (envoy-sidecar.yaml's app cluster)", app.Args)
	}

	// flashgate reaches Redis through its Service, and the NetworkPolicy lets it.
	fg := container(t, spec, "flashgate")
	host, port, err := net.SplitHostPort(env(fg, "FLASHGATE_REDIS_ADDR"))
	if err != nil {
		t.Fatalf("FLASHGATE_REDIS_ADDR: %v", err)
	}
	rsvc := objs.services[host]
	if rsvc == nil {
		t.Fatalf("FLASHGATE_REDIS_ADDR host %q is not a Service here", host)
	}
	if strconv.Itoa(int(rsvc.Spec.Ports[0].Port)) != port {
		t.Errorf("Redis Service port %d, FLASHGATE_REDIS_ADDR port %s", rsvc.Spec.Ports[0].Port, port)
	}
	rd := objs.deployments["redis"]
	if rd == nil || !selects(rsvc.Spec.Selector, rd.Spec.Template.Labels) {
		t.Fatalf("Redis Deployment missing or not selected by Service %s", host)
	}
	checkHardening(t, &rd.Spec.Template.Spec)
	np := objs.networkPolicies["redis"]
	if np == nil {
		t.Fatal("no NetworkPolicy redis")
	}
	if !selects(np.Spec.PodSelector.MatchLabels, rd.Spec.Template.Labels) {
		t.Errorf("NetworkPolicy redis does not select the Redis pods")
	}
	if len(np.Spec.Ingress) == 0 || len(np.Spec.Ingress[0].From) == 0 ||
		!selects(np.Spec.Ingress[0].From[0].PodSelector.MatchLabels, podLabels) {
		t.Errorf("NetworkPolicy redis does not admit the flashgate pods")
	}
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

// readGeneric decodes a single-document Istio resource into a map and checks
// its apiVersion, kind and top-level keys.
func readGeneric(t *testing.T, path, apiVersion, kind string) map[string]any {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := yaml.UnmarshalStrict(data, &m); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if m["apiVersion"] != apiVersion || m["kind"] != kind {
		t.Errorf("%s: %v/%v, want %s/%s", path, m["apiVersion"], m["kind"], apiVersion, kind)
	}
	for k := range m {
		if !slices.Contains([]string{"apiVersion", "kind", "metadata", "spec"}, k) {
			t.Errorf("%s: unexpected top-level key %q", path, k)
		}
	}
	return m
}

// get walks a generic document: keys for maps, ints for lists.
func get(t *testing.T, v any, path ...any) any {
	t.Helper()
	for _, p := range path {
		switch k := p.(type) {
		case string:
			m, ok := v.(map[string]any)
			if !ok {
				t.Fatalf("at %v: not a map", path)
			}
			v = m[k]
		case int:
			l, ok := v.([]any)
			if !ok || k >= len(l) {
				t.Fatalf("at %v: no list element %d", path, k)
			}
			v = l[k]
		}
	}
	return v
}

func TestIstio(t *testing.T) {
	// The extension provider.
	mesh := readGeneric(t, "istio/mesh-config.yaml", "install.istio.io/v1alpha1", "IstioOperator")
	if n := get(t, mesh, "spec", "meshConfig", "pathNormalization", "normalization"); n != "MERGE_SLASHES" && n != "DECODE_AND_MERGE_SLASHES" {
		t.Errorf("meshConfig.pathNormalization.normalization = %v, want MERGE_SLASHES: Istio's default keeps //, so //api/coupon/ misses a route's prefix", n)
	}
	prov := get(t, mesh, "spec", "meshConfig", "extensionProviders", 0).(map[string]any)
	provName, _ := prov["name"].(string)
	grpc, ok := prov["envoyExtAuthzGrpc"].(map[string]any)
	if !ok || provName == "" {
		t.Fatalf("extensionProviders[0] = %v, want a named envoyExtAuthzGrpc provider", prov)
	}
	for k := range grpc {
		if !slices.Contains([]string{"service", "port", "timeout", "failOpen", "statusOnError", "includeRequestBodyInCheck"}, k) {
			t.Errorf("envoyExtAuthzGrpc: unknown field %q", k)
		}
	}
	if grpc["port"] != float64(9191) {
		t.Errorf("envoyExtAuthzGrpc.port = %v, want 9191", grpc["port"])
	}
	timeout, err := time.ParseDuration(fmt.Sprint(grpc["timeout"]))
	if err != nil || timeout <= 0 || timeout > 250*time.Millisecond {
		t.Errorf("envoyExtAuthzGrpc.timeout = %v, want explicit and short (Istio's default is 600s)", grpc["timeout"])
	}
	if _, ok := grpc["failOpen"].(bool); !ok {
		t.Errorf("envoyExtAuthzGrpc.failOpen must be set explicitly")
	}
	if _, ok := grpc["includeRequestBodyInCheck"]; ok {
		t.Errorf("flashgate never reads the body: drop includeRequestBodyInCheck")
	}
	service, _ := grpc["service"].(string)

	// The pod-local ServiceEntry behind the provider's service name.
	se := readGeneric(t, "istio/serviceentry.yaml", "networking.istio.io/v1", "ServiceEntry")
	if hosts := get(t, se, "spec", "hosts").([]any); !slices.Contains(hosts, any(service)) {
		t.Errorf("ServiceEntry hosts %v lack the provider's service %q", hosts, service)
	}
	if a := get(t, se, "spec", "endpoints", 0, "address"); a != "127.0.0.1" {
		t.Errorf("ServiceEntry endpoint = %v, want 127.0.0.1", a)
	}
	sePort := get(t, se, "spec", "ports", 0).(map[string]any)
	if sePort["number"] != float64(9191) || sePort["protocol"] != "GRPC" {
		t.Errorf("ServiceEntry port = %v, want 9191 GRPC", sePort)
	}
	if r := get(t, se, "spec", "resolution"); r != "STATIC" {
		t.Errorf("ServiceEntry resolution = %v, want STATIC", r)
	}

	// The CUSTOM AuthorizationPolicy uses the provider and selects the mesh app.
	_, objs := loadKustomization(t, "istio")
	app := objs.deployments["flashsale-demo-mesh"]
	if app == nil {
		t.Fatal("no Deployment flashsale-demo-mesh in istio/")
	}
	for _, c := range app.Spec.Template.Spec.Containers {
		if c.Name == "envoy" || strings.Contains(c.Image, "envoyproxy/envoy") {
			t.Errorf("the mesh app runs its own Envoy (%s): istio-proxy is the sidecar", c.Name)
		}
	}
	checkCustomPolicy(t, "istio/authorizationpolicy.yaml", provName, app.Spec.Template.Labels)

	// The EnvoyFilter alternative: inserted before the HCM's router, and its
	// filter config valid against Envoy's protos.
	ef := readGeneric(t, "istio/envoyfilter.yaml", "networking.istio.io/v1alpha3", "EnvoyFilter")
	if !selects(stringMap(get(t, ef, "spec", "workloadSelector", "labels")), app.Spec.Template.Labels) {
		t.Errorf("EnvoyFilter workloadSelector does not select the mesh app")
	}
	patch := get(t, ef, "spec", "configPatches", 0).(map[string]any)
	if patch["applyTo"] != "HTTP_FILTER" || get(t, patch, "patch", "operation") != "INSERT_BEFORE" ||
		get(t, patch, "match", "context") != "SIDECAR_INBOUND" ||
		get(t, patch, "match", "listener", "filterChain", "filter", "name") != "envoy.filters.network.http_connection_manager" ||
		get(t, patch, "match", "listener", "filterChain", "filter", "subFilter", "name") != "envoy.filters.http.router" {
		t.Errorf("EnvoyFilter patch %v: want HTTP_FILTER INSERT_BEFORE the router of the inbound HCM", patch)
	}
	js, err := yaml.Marshal(get(t, patch, "patch", "value"))
	if err != nil {
		t.Fatal(err)
	}
	if js, err = yaml.YAMLToJSON(js); err != nil {
		t.Fatal(err)
	}
	var filter hcmv3.HttpFilter
	if err := (protojson.UnmarshalOptions{DiscardUnknown: false}).Unmarshal(js, &filter); err != nil {
		t.Fatalf("EnvoyFilter value is not an HttpFilter: %v", err)
	}
	if err := validateDeep(&filter); err != nil {
		t.Fatalf("EnvoyFilter value: %v", err)
	}
	var authz extauthzv3.ExtAuthz
	if filter.GetName() != "envoy.filters.http.ext_authz" || filter.GetTypedConfig().UnmarshalTo(&authz) != nil {
		t.Fatalf("EnvoyFilter value is %s (%s), want the ext_authz filter", filter.GetName(), filter.GetTypedConfig().GetTypeUrl())
	}
	if authz.GetTransportApiVersion() != corev3.ApiVersion_V3 {
		t.Errorf("EnvoyFilter ext_authz transport_api_version = %v, want V3", authz.GetTransportApiVersion())
	}
	if d := authz.GetGrpcService().GetTimeout().AsDuration(); d <= 0 || d > 250*time.Millisecond {
		t.Errorf("EnvoyFilter ext_authz timeout = %v, want explicit and short", d)
	}
	wantCluster := fmt.Sprintf("outbound|%d||%s", 9191, service)
	if c := authz.GetGrpcService().GetEnvoyGrpc().GetClusterName(); c != wantCluster {
		t.Errorf("EnvoyFilter ext_authz cluster = %q, want the ServiceEntry's %q", c, wantCluster)
	}
}

// checkCustomPolicy asserts that the AuthorizationPolicy in path is CUSTOM,
// names provider and selects pods labelled podLabels.
func checkCustomPolicy(t *testing.T, path, provider string, podLabels map[string]string) {
	t.Helper()
	ap := readGeneric(t, path, "security.istio.io/v1", "AuthorizationPolicy")
	if a := get(t, ap, "spec", "action"); a != "CUSTOM" {
		t.Errorf("%s: action = %v, want CUSTOM", path, a)
	}
	if n := get(t, ap, "spec", "provider", "name"); n != provider {
		t.Errorf("%s: provider.name = %v, want the mesh config's %q", path, n, provider)
	}
	if !selects(stringMap(get(t, ap, "spec", "selector", "matchLabels")), podLabels) {
		t.Errorf("%s: the selector does not select the mesh app", path)
	}
}

func stringMap(v any) map[string]string {
	out := map[string]string{}
	m, _ := v.(map[string]any)
	for k, v := range m {
		out[k] = fmt.Sprint(v)
	}
	return out
}

// validateDeep runs ValidateAll on m and on the message inside every Any
// reachable from it (protoc-gen-validate checks only an Any's type URL).
// envoy/envoy_test.go has the same walker for the Envoy bootstrap files.
func validateDeep(m proto.Message) error {
	if v, ok := m.(interface{ ValidateAll() error }); ok {
		if err := v.ValidateAll(); err != nil {
			return fmt.Errorf("%s: %w", m.ProtoReflect().Descriptor().FullName(), err)
		}
	}
	var err error
	visit := func(v protoreflect.Message) bool {
		if a, ok := v.Interface().(*anypb.Any); ok {
			var inner proto.Message
			if inner, err = anypb.UnmarshalNew(a, proto.UnmarshalOptions{}); err == nil {
				err = validateDeep(inner)
			}
		} else {
			err = validateDeep(v.Interface())
		}
		return err == nil
	}
	m.ProtoReflect().Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		switch {
		case fd.IsList() && fd.Message() != nil:
			for i := 0; i < v.List().Len() && err == nil; i++ {
				visit(v.List().Get(i).Message())
			}
		case fd.IsMap() && fd.MapValue().Message() != nil:
			v.Map().Range(func(_ protoreflect.MapKey, mv protoreflect.Value) bool { return visit(mv.Message()) })
		case fd.Message() != nil && !fd.IsMap():
			visit(v.Message())
		}
		return err == nil
	})
	return err
}
