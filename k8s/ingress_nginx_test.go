package k8s

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"sigs.k8s.io/yaml"

	"github.com/flashgate/flashgate/descriptors"
	"github.com/flashgate/flashgate/internal/testing/proxytest"
)

const ingressAnnotation = "nginx.ingress.kubernetes.io/"

// TestIngressNginxWiring: the Ingress's auth-url is flashgate-authz's
// Service, which reaches the HTTP front-end's port; only the controller may
// call it; the descriptors trust one X-Forwarded-For hop; the snippets need
// exactly the controller settings shipped beside them.
func TestIngressNginxWiring(t *testing.T) {
	_, objs := loadKustomization(t, "ingress-nginx")
	ing := objs.ingresses["flashsale"]
	if ing == nil {
		t.Fatal("no Ingress flashsale")
	}
	if ing.Spec.IngressClassName == nil || *ing.Spec.IngressClassName != "nginx" {
		t.Errorf("ingressClassName = %v, want nginx", ing.Spec.IngressClassName)
	}
	ann := func(k string) string { return ing.Annotations[ingressAnnotation+k] }
	for _, k := range []string{"auth-method", "auth-keepalive", "auth-cache-key", "auth-signin", "enable-global-auth"} {
		if _, ok := ing.Annotations[ingressAnnotation+k]; ok {
			t.Errorf("annotation %s is set: see ingress.yaml's header", k)
		}
	}

	// auth-url → Service flashgate-authz → the container's HTTP front-end.
	u, err := url.Parse(ann("auth-url"))
	if err != nil || u.Scheme != "http" {
		t.Fatalf("auth-url %q: want an http URL", ann("auth-url"))
	}
	host, port, err := net.SplitHostPort(u.Host)
	if err != nil {
		t.Fatalf("auth-url %q: %v", ann("auth-url"), err)
	}
	svcName, _, _ := strings.Cut(host, ".")
	if host != svcName+".default.svc.cluster.local" {
		t.Errorf("auth-url host %q: want SERVICE.default.svc.cluster.local (the controller resolves it from its own namespace)", host)
	}
	svc := objs.services[svcName]
	if svc == nil {
		t.Fatalf("auth-url names Service %q, not in ingress-nginx/", svcName)
	}
	d := objs.deployments["flashgate-authz"]
	if d == nil || !selects(svc.Spec.Selector, d.Spec.Template.Labels) {
		t.Fatalf("Service %s does not select Deployment flashgate-authz", svcName)
	}
	spec := &d.Spec.Template.Spec
	fg := container(t, spec, "flashgate")
	var sp *corev1.ServicePort
	for i := range svc.Spec.Ports {
		if strconv.Itoa(int(svc.Spec.Ports[i].Port)) == port {
			sp = &svc.Spec.Ports[i]
		}
	}
	if sp == nil {
		t.Fatalf("Service %s has no port %s", svcName, port)
	}
	_, authzPort, err := net.SplitHostPort(env(fg, "FLASHGATE_HTTP_AUTHZ_ADDR"))
	if err != nil || strconv.Itoa(int(portNumber(t, fg, sp.TargetPort))) != authzPort {
		t.Errorf("Service port %s targets %v, flashgate's FLASHGATE_HTTP_AUTHZ_ADDR is %q", port, sp.TargetPort, env(fg, "FLASHGATE_HTTP_AUTHZ_ADDR"))
	}
	if h, _, _ := net.SplitHostPort(env(fg, "FLASHGATE_GRPC_ADDR")); h != "127.0.0.1" {
		t.Errorf("FLASHGATE_GRPC_ADDR = %q: nothing uses it here, keep it on loopback", env(fg, "FLASHGATE_GRPC_ADDR"))
	}
	if env(fg, "FLASHGATE_BACKEND") != "redis" || d.Spec.Template.Labels["flashgate/redis-client"] != "true" {
		t.Errorf("flashgate-authz: want the redis backend and the flashgate/redis-client label k8s/networkpolicy.yaml admits")
	}
	checkDescriptorsMount(t, spec, fg, "flashgate-descriptors-ingress")
	checkHardening(t, spec)

	// Only the controller reaches the check port.
	np := objs.networkPolicies["flashgate-authz"]
	if np == nil || !selects(np.Spec.PodSelector.MatchLabels, d.Spec.Template.Labels) {
		t.Fatal("no NetworkPolicy flashgate-authz selecting its pods")
	}
	for _, rule := range np.Spec.Ingress {
		for _, p := range rule.Ports {
			if p.Port == nil || p.Port.String() != authzPort {
				continue
			}
			if len(rule.From) != 1 || rule.From[0].NamespaceSelector == nil || rule.From[0].PodSelector == nil ||
				rule.From[0].PodSelector.MatchLabels["app.kubernetes.io/component"] != "controller" {
				t.Errorf("NetworkPolicy admits port %s from %+v: want only the controller's pods in its namespace", authzPort, rule.From)
			}
		}
	}

	// The descriptors trust the controller's X-Forwarded-For.
	cm := objs.configMaps["flashgate-descriptors-ingress"]
	if cm == nil {
		t.Fatal("no ConfigMap flashgate-descriptors-ingress")
	}
	cfg, err := descriptors.ParseConfig("flashsale.yaml", []byte(cm.Data["flashsale.yaml"]))
	if err != nil {
		t.Fatalf("descriptors: %v", err)
	}
	if cfg.ClientIP.TrustedHops != 1 {
		t.Errorf("descriptors client_ip.trusted_hops = %d, want 1: flashgate's peer is the controller", cfg.ClientIP.TrustedHops)
	}
	example, err := descriptors.ExampleConfig()
	if err != nil {
		t.Fatal(err)
	}
	if got, want := ruleNames(cfg), ruleNames(example); got != want {
		t.Errorf("descriptors rules %s, want the example's %s", got, want)
	}

	// The controller settings the snippets need.
	data, err := os.ReadFile(filepath.Join("ingress-nginx", "controller-configmap.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var ctl corev1.ConfigMap
	js, err := yaml.YAMLToJSONStrict(data)
	if err != nil {
		t.Fatal(err)
	}
	if err := strictJSON(js, &ctl); err != nil {
		t.Fatalf("controller-configmap.yaml: %v", err)
	}
	if ctl.Data["allow-snippet-annotations"] != "true" || ctl.Data["annotations-risk-level"] != "Critical" {
		t.Errorf("controller-configmap.yaml data %v: want allow-snippet-annotations \"true\" and annotations-risk-level Critical", ctl.Data)
	}
}

func ruleNames(c *descriptors.Config) string {
	var names []string
	for _, r := range c.Rules {
		names = append(names, r.Name)
	}
	return strings.Join(names, ",")
}

// ingressServer renders what ingress-nginx's template (controller v1.x,
// rootfs/etc/nginx/template/nginx.tmpl) makes of ing for a path / with
// auth-url: the check's internal location with auth-snippet, the app's
// location with auth_request, auth-response-headers and
// configuration-snippet, and server-snippet. The controller's Lua, TLS and
// logging parts are left out. Addresses are those proxytest renders:
// listener 8080, auth-url's host as an upstream on 127.0.0.1:9193, the app
// on 127.0.0.1:8081.
func ingressServer(ing *networkingv1.Ingress) []byte {
	ann := func(k string) string { return ing.Annotations[ingressAnnotation+k] }
	var copies strings.Builder
	for i, h := range strings.Split(ann("auth-response-headers"), ",") {
		h = strings.TrimSpace(h)
		v := strings.ToLower(strings.ReplaceAll(h, "-", "_"))
		fmt.Fprintf(&copies, "        auth_request_set $authHeader%d $upstream_http_%s;\n        proxy_set_header '%s' $authHeader%d;\n", i, v, h, i)
	}
	return fmt.Appendf(nil, `upstream flashgate_authz {
    server 127.0.0.1:9193;
}
upstream upstream_balancer {
    server 127.0.0.1:8081;
}
server {
    listen 8080;
    server_name _;
%[1]s
    location = /_external-auth-Lw-Prefix {
        internal;
        access_log off;
        set $proxy_upstream_name "default-flashsale-app-80";
        proxy_intercept_errors off;
        proxy_pass_request_body off;
        proxy_set_header Content-Length "";
        proxy_set_header X-Forwarded-Proto "";
        proxy_set_header X-Request-ID $request_id;
        proxy_set_header Host flashgate-authz.default.svc.cluster.local;
        proxy_set_header X-Original-URL $scheme://$http_host$request_uri;
        proxy_set_header X-Original-Method $request_method;
        proxy_set_header X-Sent-From "nginx-ingress-controller";
        proxy_set_header X-Real-IP $remote_addr;
        proxy_set_header X-Forwarded-For $remote_addr;
        proxy_set_header X-Auth-Request-Redirect $request_uri;
        proxy_buffering off;
        proxy_ssl_server_name on;
        proxy_pass_request_headers on;
%[2]s
        proxy_http_version 1.1;
        set $target http://flashgate_authz/;
        proxy_pass $target;
    }
    location / {
        set $proxy_upstream_name "default-flashsale-app-80";
        auth_request /_external-auth-Lw-Prefix;
        auth_request_set $auth_cookie $upstream_http_set_cookie;
        add_header Set-Cookie $auth_cookie;
%[3]s%[4]s
        proxy_set_header X-Original-URI $request_uri;
        proxy_pass http://upstream_balancer;
    }
}
`, indent(ann("server-snippet"), 4), indent(ann("auth-snippet"), 8), copies.String(), indent(ann("configuration-snippet"), 8))
}

func indent(s string, n int) string {
	pad := strings.Repeat(" ", n)
	return pad + strings.ReplaceAll(strings.TrimRight(s, "\n"), "\n", "\n"+pad)
}

// TestIngressNginxSnippets runs the Ingress's annotations, rendered as
// ingress-nginx renders them, through nginx -t, then in a real nginx between
// a stand-in for flashgate's HTTP front-end and an upstream: admissions
// carry the fields to the client and the app, a denial is a 429 with
// Retry-After, the fields and a problem body, the check sees the URI in
// normal form and the 403 marker, and a missing flashgate is a 503.
func TestIngressNginxSnippets(t *testing.T) {
	_, objs := loadKustomization(t, "ingress-nginx")
	ing := objs.ingresses["flashsale"]
	if ing == nil {
		t.Fatal("no Ingress flashsale")
	}
	conf := ingressServer(ing)
	if err := proxytest.NginxTest(t, conf); err != nil {
		t.Fatalf("%v\n%s", err, conf)
	}
	path := filepath.Join(t.TempDir(), "ingress.conf")
	if err := os.WriteFile(path, conf, 0o600); err != nil {
		t.Fatal(err)
	}
	const limit = 2
	authz := proxytest.StartAuthorizer(t, limit)
	up := proxytest.StartUpstream(t)
	p := proxytest.StartNginx(t, proxytest.Options{Config: path, Authz: authz.Addr(), Upstream: up.Addr()})

	get := func(target string) (*http.Response, string) {
		t.Helper()
		req, err := http.NewRequest(http.MethodGet, p.URL()+target, nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("x-uid", "alice")
		req.Header.Set("X-Original-URI", "/spoofed")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp, string(body)
	}
	for i := 1; i <= limit; i++ {
		resp, body := get("/api/%63oupon/x")
		if resp.StatusCode != http.StatusOK || resp.Header.Get(proxytest.UpstreamHeader) != "1" {
			t.Fatalf("request %d: %d %q, want 200 from the app", i, resp.StatusCode, body)
		}
		if resp.Header.Get("RateLimit") == "" || resp.Header.Get("RateLimit-Policy") == "" || resp.Header.Get("X-RateLimit-Remaining") == "" {
			t.Errorf("request %d: fields missing on the admission: %v", i, resp.Header)
		}
	}
	if got := up.Requests()[0].Header.Get("RateLimit"); got == "" {
		t.Errorf("auth-response-headers: the app got no RateLimit request header")
	}
	c := authz.Checks()[0]
	if c.URI != "/api/coupon/x" || c.Header.Get("X-Flashgate-Deny-Status") != "403" || c.Header.Get("X-Forwarded-Host") == "" {
		t.Errorf("the check: %s with headers %v, want /api/coupon/x, X-Flashgate-Deny-Status: 403, X-Forwarded-Host", c.URI, c.Header)
	}

	resp, body := get("/api/coupon/x")
	var problem struct {
		Status   int      `json:"status"`
		Violated []string `json:"violated-policies"`
	}
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") != strconv.Itoa(proxytest.AuthzRetryAfter) ||
		resp.Header.Get("RateLimit") == "" || resp.Header.Get("Content-Type") != "application/problem+json" ||
		json.Unmarshal([]byte(body), &problem) != nil || problem.Status != 429 ||
		len(problem.Violated) != 1 || problem.Violated[0] != proxytest.AuthzPolicy {
		t.Errorf("denial: %d %v %q, want 429 with Retry-After, the fields and a problem naming %s", resp.StatusCode, resp.Header, body, proxytest.AuthzPolicy)
	}
	if n := up.Count("alice"); n != limit {
		t.Errorf("the app saw %d requests, want %d", n, limit)
	}

	authz.Close()
	if resp, body := get("/api/coupon/x"); resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") != "1" {
		t.Errorf("flashgate down: %d %v %q, want 503 with Retry-After: 1", resp.StatusCode, resp.Header, body)
	}
}
