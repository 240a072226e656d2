package k8s

import (
	"encoding/json"
	"net"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// extAuthzHTTPProvider mirrors Istio's
// MeshConfig.ExtensionProvider.EnvoyExternalAuthorizationHttpProvider
// (istio/api mesh/v1alpha1/config.proto) field for field, so that strict
// decoding rejects a misspelt or unknown field as istiod would.
type extAuthzHTTPProvider struct {
	Service                         string            `json:"service"`
	Port                            uint32            `json:"port"`
	Timeout                         string            `json:"timeout"`
	PathPrefix                      string            `json:"pathPrefix"`
	FailOpen                        *bool             `json:"failOpen"`
	ClearRouteCache                 bool              `json:"clearRouteCache"`
	StatusOnError                   string            `json:"statusOnError"`
	IncludeHeadersInCheck           []string          `json:"includeHeadersInCheck"` // deprecated upstream
	IncludeRequestHeadersInCheck    []string          `json:"includeRequestHeadersInCheck"`
	IncludeAdditionalHeadersInCheck map[string]string `json:"includeAdditionalHeadersInCheck"`
	IncludeRequestBodyInCheck       *struct {
		MaxRequestBytes     uint32 `json:"maxRequestBytes"`
		AllowPartialMessage bool   `json:"allowPartialMessage"`
		PackAsBytes         bool   `json:"packAsBytes"`
	} `json:"includeRequestBodyInCheck"`
	HeadersToUpstreamOnAllow   []string `json:"headersToUpstreamOnAllow"`
	HeadersToDownstreamOnDeny  []string `json:"headersToDownstreamOnDeny"`
	HeadersToDownstreamOnAllow []string `json:"headersToDownstreamOnAllow"`
}

// TestIstioHTTPProvider: the envoyExtAuthzHttp provider calls the pod's
// flashgate HTTP front-end through the ServiceEntry, with the app's path
// prefix, sends the headers the rules read (and none a client could spoof
// the checked request with), and lets the rate-limit headers reach the
// client; authorizationpolicy-http.yaml uses it.
func TestIstioHTTPProvider(t *testing.T) {
	mesh := readGeneric(t, "istio/mesh-config.yaml", "install.istio.io/v1alpha1", "IstioOperator")
	var name string
	var raw any
	for _, p := range get(t, mesh, "spec", "meshConfig", "extensionProviders").([]any) {
		if m, _ := p.(map[string]any); m["envoyExtAuthzHttp"] != nil {
			name, _ = m["name"].(string)
			raw = m["envoyExtAuthzHttp"]
		}
	}
	if raw == nil || name == "" {
		t.Fatal("mesh-config.yaml: no named envoyExtAuthzHttp provider")
	}
	js, err := json.Marshal(raw)
	if err != nil {
		t.Fatal(err)
	}
	var prov extAuthzHTTPProvider
	if err := strictJSON(js, &prov); err != nil {
		t.Fatalf("envoyExtAuthzHttp: %v", err)
	}

	// The pod-local ServiceEntry serves the provider's host and port over HTTP.
	se := readGeneric(t, "istio/serviceentry.yaml", "networking.istio.io/v1", "ServiceEntry")
	if hosts := get(t, se, "spec", "hosts").([]any); !slices.Contains(hosts, any(prov.Service)) {
		t.Errorf("ServiceEntry hosts %v lack the provider's service %q", hosts, prov.Service)
	}
	var sePort map[string]any
	for _, p := range get(t, se, "spec", "ports").([]any) {
		if m := p.(map[string]any); m["number"] == float64(prov.Port) {
			sePort = m
		}
	}
	if sePort == nil || sePort["protocol"] != "HTTP" {
		t.Errorf("ServiceEntry port for %d = %v, want protocol HTTP", prov.Port, sePort)
	}

	// The flashgate container listens there, on loopback, with the prefix.
	_, objs := loadKustomization(t, "istio")
	app := objs.deployments["flashsale-demo-mesh"]
	if app == nil {
		t.Fatal("no Deployment flashsale-demo-mesh in istio/")
	}
	fg := container(t, &app.Spec.Template.Spec, "flashgate")
	if got, want := env(fg, "FLASHGATE_HTTP_AUTHZ_ADDR"), net.JoinHostPort("127.0.0.1", strconv.Itoa(int(prov.Port))); got != want {
		t.Errorf("FLASHGATE_HTTP_AUTHZ_ADDR = %q, want %q (the provider's port on loopback)", got, want)
	}
	if got := env(fg, "FLASHGATE_HTTP_AUTHZ_PATH_PREFIX"); got != prov.PathPrefix {
		t.Errorf("FLASHGATE_HTTP_AUTHZ_PATH_PREFIX = %q, provider pathPrefix %q: flashgate would never match its path rules", got, prov.PathPrefix)
	}

	// Failure and timing, as for the gRPC provider.
	if d, err := time.ParseDuration(prov.Timeout); err != nil || d <= 0 || d > 250*time.Millisecond {
		t.Errorf("timeout = %q, want explicit and short (Istio's default is 600s)", prov.Timeout)
	}
	if prov.FailOpen == nil || *prov.FailOpen {
		t.Errorf("failOpen must be set, and false")
	}
	if prov.StatusOnError != "503" {
		t.Errorf("statusOnError = %q, want 503", prov.StatusOnError)
	}
	if prov.IncludeRequestBodyInCheck != nil || len(prov.IncludeHeadersInCheck) > 0 {
		t.Errorf("drop includeRequestBodyInCheck (flashgate never reads it) and the deprecated includeHeadersInCheck")
	}

	// Headers in and out.
	for _, h := range []string{"x-uid", "x-device-fp", "x-forwarded-for"} {
		if !istioMatchesAny(prov.IncludeRequestHeadersInCheck, h) {
			t.Errorf("includeRequestHeadersInCheck does not send %s", h)
		}
	}
	for _, h := range []string{
		"x-original-uri", "x-original-method", "x-forwarded-method", "x-forwarded-uri",
		"x-forwarded-host", "x-forwarded-proto", "x-flashgate-deny-status",
	} {
		if istioMatchesAny(prov.IncludeRequestHeadersInCheck, h) {
			t.Errorf("includeRequestHeadersInCheck sends a client's %s", h)
		}
		if _, ok := prov.IncludeAdditionalHeadersInCheck[h]; ok {
			t.Errorf("includeAdditionalHeadersInCheck sets %s", h)
		}
	}
	fields := []string{"ratelimit", "ratelimit-policy", "x-ratelimit-limit", "x-ratelimit-remaining", "x-ratelimit-reset"}
	for _, h := range append([]string{"retry-after", "content-type"}, fields...) {
		if !istioMatchesAny(prov.HeadersToDownstreamOnDeny, h) {
			t.Errorf("headersToDownstreamOnDeny drops %s", h)
		}
	}
	for _, h := range fields {
		if !istioMatchesAny(prov.HeadersToDownstreamOnAllow, h) {
			t.Errorf("headersToDownstreamOnAllow drops %s", h)
		}
	}
	for _, h := range []string{"content-type", "content-length"} {
		if istioMatchesAny(prov.HeadersToDownstreamOnAllow, h) {
			t.Errorf("headersToDownstreamOnAllow would replace the app's %s", h)
		}
	}

	// The alternative policy names this provider and selects the mesh app.
	checkCustomPolicy(t, "istio/authorizationpolicy-http.yaml", name, app.Spec.Template.Labels)
}

// istioMatchesAny reports whether header h matches one of Istio's header
// patterns: exact, "prefix*" or "*suffix", case-insensitive as header
// names are.
func istioMatchesAny(patterns []string, h string) bool {
	h = strings.ToLower(h)
	for _, p := range patterns {
		p = strings.ToLower(p)
		switch {
		case p == "*":
			return true
		case strings.HasSuffix(p, "*") && strings.HasPrefix(h, strings.TrimSuffix(p, "*")):
			return true
		case strings.HasPrefix(p, "*") && strings.HasSuffix(h, strings.TrimPrefix(p, "*")):
			return true
		case p == h:
			return true
		}
	}
	return false
}
