package proxy

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/url"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/goccy/go-yaml"
)

const traefikDynamic = "traefik/dynamic.yaml"

// The types below mirror Traefik v3's dynamic configuration
// (github.com/traefik/traefik/v3/pkg/config/dynamic, v3.7) as the file
// provider reads it, field for field where this file uses them; the
// middleware kinds and load-balancer settings it does not use are kept as
// raw JSON so that they decode but stay unchecked. Traefik itself is not a
// dependency (nor packaged by Debian), so the file is never run.
type traefikConfig struct {
	HTTP *traefikHTTP `json:"http"`
}

type traefikHTTP struct {
	Routers           map[string]*traefikRouter     `json:"routers"`
	Services          map[string]*traefikService    `json:"services"`
	Middlewares       map[string]*traefikMiddleware `json:"middlewares"`
	ServersTransports map[string]json.RawMessage    `json:"serversTransports"`
}

type traefikRouter struct {
	EntryPoints   []string        `json:"entryPoints"`
	Middlewares   []string        `json:"middlewares"`
	Service       string          `json:"service"`
	Rule          string          `json:"rule"`
	RuleSyntax    string          `json:"ruleSyntax"`
	Priority      int             `json:"priority"`
	TLS           json.RawMessage `json:"tls"`
	Observability json.RawMessage `json:"observability"`
}

type traefikService struct {
	LoadBalancer *struct {
		Servers []struct {
			URL          string `json:"url"`
			Weight       *int   `json:"weight"`
			PreservePath bool   `json:"preservePath"`
		} `json:"servers"`
		Sticky             json.RawMessage `json:"sticky"`
		Strategy           string          `json:"strategy"`
		HealthCheck        json.RawMessage `json:"healthCheck"`
		PassiveHealthCheck json.RawMessage `json:"passiveHealthCheck"`
		PassHostHeader     *bool           `json:"passHostHeader"`
		ResponseForwarding json.RawMessage `json:"responseForwarding"`
		ServersTransport   string          `json:"serversTransport"`
	} `json:"loadBalancer"`
	Weighted  json.RawMessage `json:"weighted"`
	Mirroring json.RawMessage `json:"mirroring"`
	Failover  json.RawMessage `json:"failover"`
}

type traefikMiddleware struct {
	ForwardAuth *traefikForwardAuth `json:"forwardAuth"`
	Headers     *traefikHeaders     `json:"headers"`
	Chain       *struct {
		Middlewares []string `json:"middlewares"`
	} `json:"chain"`

	AddPrefix         json.RawMessage `json:"addPrefix"`
	StripPrefix       json.RawMessage `json:"stripPrefix"`
	StripPrefixRegex  json.RawMessage `json:"stripPrefixRegex"`
	ReplacePath       json.RawMessage `json:"replacePath"`
	ReplacePathRegex  json.RawMessage `json:"replacePathRegex"`
	IPAllowList       json.RawMessage `json:"ipAllowList"`
	EncodedCharacters json.RawMessage `json:"encodedCharacters"`
	Errors            json.RawMessage `json:"errors"`
	RateLimit         json.RawMessage `json:"rateLimit"`
	RedirectRegex     json.RawMessage `json:"redirectRegex"`
	RedirectScheme    json.RawMessage `json:"redirectScheme"`
	BasicAuth         json.RawMessage `json:"basicAuth"`
	DigestAuth        json.RawMessage `json:"digestAuth"`
	InFlightReq       json.RawMessage `json:"inFlightReq"`
	Buffering         json.RawMessage `json:"buffering"`
	CircuitBreaker    json.RawMessage `json:"circuitBreaker"`
	Compress          json.RawMessage `json:"compress"`
	PassTLSClientCert json.RawMessage `json:"passTLSClientCert"`
	Retry             json.RawMessage `json:"retry"`
	ContentType       json.RawMessage `json:"contentType"`
	GrpcWeb           json.RawMessage `json:"grpcWeb"`
	Plugin            json.RawMessage `json:"plugin"`
}

// traefikForwardAuth is dynamic.ForwardAuth.
type traefikForwardAuth struct {
	Address                  string          `json:"address"`
	TLS                      json.RawMessage `json:"tls"`
	TrustForwardHeader       *bool           `json:"trustForwardHeader"`
	AuthResponseHeaders      []string        `json:"authResponseHeaders"`
	AuthResponseHeadersRegex string          `json:"authResponseHeadersRegex"`
	AuthRequestHeaders       []string        `json:"authRequestHeaders"`
	MaxResponseBodySize      *int64          `json:"maxResponseBodySize"`
	AddAuthCookiesToResponse []string        `json:"addAuthCookiesToResponse"`
	HeaderField              string          `json:"headerField"`
	ForwardBody              bool            `json:"forwardBody"`
	MaxBodySize              *int64          `json:"maxBodySize"`
	PreserveLocationHeader   bool            `json:"preserveLocationHeader"`
	PreserveRequestMethod    bool            `json:"preserveRequestMethod"`
	AuthSigninURL            string          `json:"authSigninURL"`
}

// traefikHeaders is dynamic.Headers.
type traefikHeaders struct {
	CustomRequestHeaders              map[string]string `json:"customRequestHeaders"`
	CustomResponseHeaders             map[string]string `json:"customResponseHeaders"`
	AccessControlAllowCredentials     bool              `json:"accessControlAllowCredentials"`
	AccessControlAllowHeaders         []string          `json:"accessControlAllowHeaders"`
	AccessControlAllowMethods         []string          `json:"accessControlAllowMethods"`
	AccessControlAllowOriginList      []string          `json:"accessControlAllowOriginList"`
	AccessControlAllowOriginListRegex []string          `json:"accessControlAllowOriginListRegex"`
	AccessControlExposeHeaders        []string          `json:"accessControlExposeHeaders"`
	AccessControlMaxAge               *int64            `json:"accessControlMaxAge"`
	AddVaryHeader                     bool              `json:"addVaryHeader"`
	AllowedHosts                      []string          `json:"allowedHosts"`
	HostsProxyHeaders                 []string          `json:"hostsProxyHeaders"`
	SSLProxyHeaders                   map[string]string `json:"sslProxyHeaders"`
	STSSeconds                        *int64            `json:"stsSeconds"`
	STSIncludeSubdomains              bool              `json:"stsIncludeSubdomains"`
	STSPreload                        bool              `json:"stsPreload"`
	ForceSTSHeader                    bool              `json:"forceSTSHeader"`
	FrameDeny                         bool              `json:"frameDeny"`
	CustomFrameOptionsValue           string            `json:"customFrameOptionsValue"`
	ContentTypeNosniff                bool              `json:"contentTypeNosniff"`
	BrowserXSSFilter                  bool              `json:"browserXssFilter"`
	CustomBrowserXSSValue             string            `json:"customBrowserXSSValue"`
	ContentSecurityPolicy             string            `json:"contentSecurityPolicy"`
	ContentSecurityPolicyReportOnly   string            `json:"contentSecurityPolicyReportOnly"`
	PublicKey                         string            `json:"publicKey"`
	ReferrerPolicy                    string            `json:"referrerPolicy"`
	PermissionsPolicy                 string            `json:"permissionsPolicy"`
	IsDevelopment                     bool              `json:"isDevelopment"`
}

// loadTraefik decodes a dynamic configuration strictly: duplicate keys,
// unknown fields and field names in the wrong case are errors.
func loadTraefik(data []byte) (*traefikConfig, error) {
	var c traefikConfig
	// Strict: keys match the json tags exactly, case included; the kinds
	// kept as json.RawMessage decode through their UnmarshalJSON.
	if err := yaml.UnmarshalWithOptions(data, &c, yaml.Strict(), yaml.UseJSONUnmarshaler()); err != nil {
		return nil, err
	}
	if c.HTTP == nil {
		return nil, errors.New("no http section")
	}
	return &c, nil
}

// TestTraefikDynamicConfig: the router sends every request through the
// header strip and then ForwardAuth to flashgate's HTTP front-end; /healthz
// skips both; ForwardAuth distrusts a client's X-Forwarded-*, passes every
// request header to flashgate and copies the rate-limit fields; the strip
// removes the headers flashgate prefers to Traefik's.
func TestTraefikDynamicConfig(t *testing.T) {
	data, err := os.ReadFile(traefikDynamic)
	if err != nil {
		t.Fatal(err)
	}
	c, err := loadTraefik(data)
	if err != nil {
		t.Fatalf("%s: %v", traefikDynamic, err)
	}
	h := c.HTTP

	for name, r := range h.Routers {
		if h.Services[r.Service] == nil {
			t.Errorf("router %s: unknown service %q", name, r.Service)
		}
		for _, m := range r.Middlewares {
			if h.Middlewares[m] == nil {
				t.Errorf("router %s: unknown middleware %q", name, m)
			}
		}
		if !slices.Equal(r.EntryPoints, []string{"web"}) {
			t.Errorf("router %s: entryPoints %v, want [web]", name, r.EntryPoints)
		}
	}
	app := h.Routers["app"]
	if app == nil || app.Rule != "PathPrefix(`/`)" {
		t.Fatalf("router app = %+v, want rule PathPrefix(`/`)", app)
	}
	if !slices.Equal(app.Middlewares, []string{"flashgate-strip", "flashgate"}) {
		t.Errorf("router app middlewares %v, want [flashgate-strip flashgate]: the strip must run first", app.Middlewares)
	}
	hz := h.Routers["app-healthz"]
	if hz == nil || hz.Rule != "Path(`/healthz`)" || len(hz.Middlewares) != 0 || hz.Priority <= app.Priority {
		t.Errorf("router app-healthz = %+v, want Path(`/healthz`), no middlewares, above app's priority", hz)
	}

	fa := h.Middlewares["flashgate"].ForwardAuth
	if fa == nil {
		t.Fatalf("middleware flashgate is not a forwardAuth")
	}
	if u, err := url.Parse(fa.Address); err != nil || u.Scheme != "http" || u.Host != "127.0.0.1:9193" {
		t.Errorf("forwardAuth.address = %q, want http://127.0.0.1:9193/ (flashgate's HTTP front-end)", fa.Address)
	}
	if fa.TrustForwardHeader == nil || *fa.TrustForwardHeader {
		t.Errorf("forwardAuth.trustForwardHeader must be set, and false: a client's X-Forwarded-* would reach flashgate")
	}
	if len(fa.AuthRequestHeaders) > 0 {
		t.Errorf("forwardAuth.authRequestHeaders %v: leave it unset so every header a rule reads reaches flashgate", fa.AuthRequestHeaders)
	}
	for _, f := range []string{"RateLimit", "RateLimit-Policy", "X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset"} {
		if !slices.ContainsFunc(fa.AuthResponseHeaders, func(h string) bool { return strings.EqualFold(h, f) }) {
			t.Errorf("forwardAuth.authResponseHeaders lacks %s", f)
		}
	}
	if fa.ForwardBody || fa.PreserveRequestMethod || fa.AuthSigninURL != "" || fa.MaxResponseBodySize != nil {
		t.Errorf("forwardAuth %+v: no body, GET checks, no sign-in redirect, no response size limit (the problem body must pass)", fa)
	}

	strip := h.Middlewares["flashgate-strip"].Headers
	if strip == nil {
		t.Fatalf("middleware flashgate-strip is not a headers middleware")
	}
	for _, hd := range []string{"X-Original-URI", "X-Original-Method", "X-Flashgate-Deny-Status"} {
		if v, ok := strip.CustomRequestHeaders[hd]; !ok || v != "" {
			t.Errorf("flashgate-strip does not remove %s (customRequestHeaders %q: \"\" removes)", hd, hd)
		}
	}

	lb := h.Services["app"].LoadBalancer
	if lb == nil || len(lb.Servers) != 1 || lb.Servers[0].URL != "http://127.0.0.1:8081" {
		t.Errorf("service app = %+v, want one server http://127.0.0.1:8081", lb)
	}
}

// TestTraefikDecodingIsStrict proves loadTraefik catches what Traefik
// would not read as meant.
func TestTraefikDecodingIsStrict(t *testing.T) {
	orig, err := os.ReadFile(traefikDynamic)
	if err != nil {
		t.Fatal(err)
	}
	tests := map[string]struct{ old, new string }{
		"misspelt field":          {"\n        trustForwardHeader: false", "\n        trustForwardHeaders: false"},
		"field in the wrong case": {"authResponseHeaders:", "authresponseheaders:"},
		"unknown middleware kind": {"forwardAuth:", "forwardAuthz:"},
		"wrong value type":        {"\n        trustForwardHeader: false", "\n        trustForwardHeader: nope"},
		"duplicate key":           {"    app:\n      loadBalancer:", "    app: {}\n    app:\n      loadBalancer:"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if !bytes.Contains(orig, []byte(tc.old)) {
				t.Fatalf("%s no longer contains %q: update this test", traefikDynamic, tc.old)
			}
			_, err := loadTraefik(bytes.Replace(orig, []byte(tc.old), []byte(tc.new), 1))
			if err == nil {
				t.Fatalf("accepted")
			}
			t.Log(err)
		})
	}
}
