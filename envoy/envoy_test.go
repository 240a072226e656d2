package envoy

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listenerv3 "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	extauthzv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_authz/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	upstreamhttpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/goccy/go-yaml"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/anypb"

	// Every extension a typed_config of these files names must be registered
	// in protoregistry.GlobalTypes, or protojson cannot resolve its @type.
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/access_loggers/stream/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
)

const (
	extAuthzFilter = "envoy.filters.http.ext_authz"
	routerFilter   = "envoy.filters.http.router"
	hcmFilter      = "envoy.filters.network.http_connection_manager"
	httpOptionsKey = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
)

// loadBootstrap decodes one Envoy YAML config strictly into a Bootstrap and
// validates it, including every Any inside it.
func loadBootstrap(data []byte) (*bootstrapv3.Bootstrap, error) {
	js, err := yaml.YAMLToJSON(data)
	if err != nil {
		return nil, fmt.Errorf("yaml to json: %w", err)
	}
	var bs bootstrapv3.Bootstrap
	if err := (protojson.UnmarshalOptions{DiscardUnknown: false}).Unmarshal(js, &bs); err != nil {
		return nil, fmt.Errorf("protojson: %w", err)
	}
	if err := validateDeep(&bs); err != nil {
		return nil, err
	}
	return &bs, nil
}

// validateDeep runs ValidateAll on m and, recursively, on the message packed
// in every google.protobuf.Any reachable from it: protoc-gen-validate checks
// only an Any's type URL, never its contents.
func validateDeep(m proto.Message) error {
	if v, ok := m.(interface{ ValidateAll() error }); ok {
		if err := v.ValidateAll(); err != nil {
			return fmt.Errorf("%s: %w", m.ProtoReflect().Descriptor().FullName(), err)
		}
	}
	return walkAnys(m.ProtoReflect(), func(a *anypb.Any) error {
		inner, err := anypb.UnmarshalNew(a, proto.UnmarshalOptions{})
		if err != nil {
			return fmt.Errorf("unpack %s: %w", a.GetTypeUrl(), err)
		}
		return validateDeep(inner)
	})
}

// walkAnys calls fn for every Any directly or indirectly inside m, without
// descending into the Anys themselves (fn does that after unpacking).
func walkAnys(m protoreflect.Message, fn func(*anypb.Any) error) error {
	var err error
	visit := func(v protoreflect.Message) bool {
		if a, ok := v.Interface().(*anypb.Any); ok {
			err = fn(a)
		} else {
			err = walkAnys(v, fn)
		}
		return err == nil
	}
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		switch {
		case fd.IsList() && fd.Message() != nil:
			l := v.List()
			for i := 0; i < l.Len() && err == nil; i++ {
				visit(l.Get(i).Message())
			}
		case fd.IsMap() && fd.MapValue().Message() != nil:
			v.Map().Range(func(_ protoreflect.MapKey, mv protoreflect.Value) bool {
				return visit(mv.Message())
			})
		case fd.Message() != nil && !fd.IsMap():
			visit(v.Message())
		}
		return err == nil
	})
	return err
}

func unpack[T proto.Message](t *testing.T, a *anypb.Any, into T) T {
	t.Helper()
	if a == nil {
		t.Fatalf("missing typed_config, want %T", into)
	}
	if err := a.UnmarshalTo(into); err != nil {
		t.Fatalf("typed_config %s: %v", a.GetTypeUrl(), err)
	}
	return into
}

func configFiles(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob("*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if len(files) < 3 {
		t.Fatalf("found %v, want at least envoy.yaml, envoy-sidecar.yaml and envoy-http.yaml", files)
	}
	return files
}

func TestConfigsValidAgainstEnvoyProtos(t *testing.T) {
	for _, file := range configFiles(t) {
		t.Run(file, func(t *testing.T) {
			data, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			bs, err := loadBootstrap(data)
			if err != nil {
				t.Fatalf("%s: %v", file, err)
			}
			checkProductFacts(t, bs)
			checkExplicitKeys(t, data)
		})
	}
}

// flashgateFacts is what each file must say about flashgate beyond
// validity: where the cluster points, where the app lives, and whether
// ext_authz speaks gRPC or HTTP (http_service) to flashgate.
var flashgateFacts = map[string]struct {
	flashgateAddr string // host:port of the flashgate cluster's only endpoint
	upstream      string // cluster name of the application
	upstreamAddr  string
	http          bool // ext_authz http_service to the HTTP front-end, not grpc_service
}{
	"envoy.yaml":         {flashgateAddr: "flashgate:9191", upstream: "demo", upstreamAddr: "demo:5678"},
	"envoy-sidecar.yaml": {flashgateAddr: "127.0.0.1:9191", upstream: "app", upstreamAddr: "127.0.0.1:8081"},
	"envoy-http.yaml":    {flashgateAddr: "127.0.0.1:9193", upstream: "app", upstreamAddr: "127.0.0.1:8081", http: true},
}

func TestEveryConfigHasFacts(t *testing.T) {
	for _, file := range configFiles(t) {
		if _, ok := flashgateFacts[file]; !ok {
			t.Errorf("%s: add its expected addresses to flashgateFacts", file)
		}
	}
}

func checkProductFacts(t *testing.T, bs *bootstrapv3.Bootstrap) {
	t.Helper()
	file := filepath.Base(t.Name())
	want := flashgateFacts[file]

	clusters := map[string]*clusterv3.Cluster{}
	for _, c := range bs.GetStaticResources().GetClusters() {
		clusters[c.GetName()] = c
	}

	// The flashgate cluster speaks HTTP/2 (gRPC) or HTTP/1.1 (the HTTP
	// front-end) and points where it should.
	fg := clusters["flashgate"]
	if fg == nil {
		t.Fatalf("no cluster named flashgate")
	}
	opts := unpack(t, fg.GetTypedExtensionProtocolOptions()[httpOptionsKey], &upstreamhttpv3.HttpProtocolOptions{})
	if want.http {
		if opts.GetExplicitHttpConfig().GetHttpProtocolOptions() == nil {
			t.Errorf("flashgate cluster: want explicit_http_config.http_protocol_options (HTTP/1.1), got %v", opts)
		}
	} else if opts.GetExplicitHttpConfig().GetHttp2ProtocolOptions() == nil {
		t.Errorf("flashgate cluster: want explicit_http_config.http2_protocol_options, got %v", opts)
	}
	if fg.GetConnectTimeout().AsDuration() <= 0 {
		t.Errorf("flashgate cluster: want an explicit connect_timeout")
	}
	if got := endpoints(fg); len(got) != 1 || got[0] != want.flashgateAddr {
		t.Errorf("flashgate cluster endpoints = %v, want [%s]", got, want.flashgateAddr)
	}
	if up := clusters[want.upstream]; up == nil {
		t.Errorf("no upstream cluster %q", want.upstream)
	} else if got := endpoints(up); len(got) != 1 || got[0] != want.upstreamAddr {
		t.Errorf("%s cluster endpoints = %v, want [%s]", want.upstream, got, want.upstreamAddr)
	}

	// One listener on 0.0.0.0:8080 with an HTTP connection manager.
	listeners := bs.GetStaticResources().GetListeners()
	if len(listeners) != 1 {
		t.Fatalf("got %d listeners, want 1", len(listeners))
	}
	l := listeners[0]
	if sa := l.GetAddress().GetSocketAddress(); sa.GetAddress() != "0.0.0.0" || sa.GetPortValue() != 8080 {
		t.Errorf("listener address = %v, want 0.0.0.0:8080", sa)
	}
	hcm := findHCM(t, l)

	// ext_authz is there, before the router, which is last.
	filters := hcm.GetHttpFilters()
	if n := len(filters); n < 2 || filters[n-1].GetName() != routerFilter {
		t.Fatalf("http_filters must end with %s, got %v", routerFilter, filterNames(filters))
	}
	var authz *extauthzv3.ExtAuthz
	for _, f := range filters {
		if f.GetName() == extAuthzFilter {
			authz = unpack(t, f.GetTypedConfig(), &extauthzv3.ExtAuthz{})
		}
	}
	if authz == nil {
		t.Fatalf("no %s filter in %v", extAuthzFilter, filterNames(filters))
	}
	if authz.GetTransportApiVersion() != corev3.ApiVersion_V3 {
		t.Errorf("ext_authz transport_api_version = %v, want V3", authz.GetTransportApiVersion())
	}
	if want.http {
		checkHTTPService(t, authz)
	} else {
		gs := authz.GetGrpcService()
		if gs.GetEnvoyGrpc().GetClusterName() != "flashgate" {
			t.Errorf("ext_authz grpc_service = %v, want envoy_grpc cluster flashgate", gs)
		}
		if d := gs.GetTimeout().AsDuration(); d <= 0 || d > 250*time.Millisecond {
			t.Errorf("ext_authz grpc_service.timeout = %v, want explicit and short (0 < t ≤ 250ms)", d)
		}
		if authz.GetAllowedHeaders() != nil {
			t.Errorf("ext_authz allowed_headers is set: x-uid and x-device-fp must reach flashgate; see the comment in the file")
		}
	}
	if authz.GetWithRequestBody() != nil {
		t.Errorf("ext_authz must not buffer the request body")
	}
	if authz.GetIncludePeerCertificate() {
		t.Errorf("ext_authz include_peer_certificate: flashgate never reads it")
	}
	if authz.GetStatusOnError().GetCode() != typev3.StatusCode_ServiceUnavailable {
		t.Errorf("ext_authz status_on_error = %v, want ServiceUnavailable", authz.GetStatusOnError())
	}

	// Routes: every cluster exists, /healthz skips the check, one route
	// passes context_extensions.
	var healthzDisabled, withContext bool
	for _, vh := range hcm.GetRouteConfig().GetVirtualHosts() {
		for _, r := range vh.GetRoutes() {
			if c := r.GetRoute().GetCluster(); c != "" && clusters[c] == nil {
				t.Errorf("route %v: unknown cluster %q", r.GetMatch(), c)
			}
			cfg, ok := r.GetTypedPerFilterConfig()[extAuthzFilter]
			if !ok {
				continue
			}
			per := unpack(t, cfg, &extauthzv3.ExtAuthzPerRoute{})
			if r.GetMatch().GetPath() == "/healthz" && per.GetDisabled() {
				healthzDisabled = true
			}
			if len(per.GetCheckSettings().GetContextExtensions()) > 0 {
				withContext = true
			}
		}
	}
	if !healthzDisabled {
		t.Errorf("no route for path /healthz with ExtAuthzPerRoute disabled: true")
	}
	if !withContext && !want.http { // http_service carries no context_extensions
		t.Errorf("no route passes check_settings.context_extensions")
	}
}

// checkExplicitKeys asserts settings whose default equals their value and so
// cannot be seen in the decoded proto: they must be spelled out for readers.
func checkExplicitKeys(t *testing.T, data []byte) {
	t.Helper()
	for _, key := range []string{"failure_mode_allow", "include_peer_certificate", "transport_api_version"} {
		if !bytes.Contains(data, []byte("\n"+strings.Repeat(" ", 22)+key+":")) {
			t.Errorf("the ext_authz filter must set %s explicitly", key)
		}
	}
}

// TestEveryHCMNormalisesPaths: every HTTP connection manager a shipped
// Envoy config holds normalises the path (RFC 3986 dot segments and
// escapes), merges slashes, and unescapes an encoded slash with a redirect,
// so that Envoy's routes, the descriptors its rate-limit actions build, and
// the upstream all see the path flashgate's rules match. The Kubernetes
// ConfigMap holds envoy-sidecar.yaml byte for byte (package k8s checks it),
// docker-compose mounts envoy.yaml.
func TestEveryHCMNormalisesPaths(t *testing.T) {
	files := append(configFiles(t), filepath.Join("ratelimit", "envoy.yaml"))
	for _, file := range files {
		t.Run(file, func(t *testing.T) {
			data, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			bs, err := loadBootstrap(data)
			if err != nil {
				t.Fatal(err)
			}
			n := 0
			for _, l := range bs.GetStaticResources().GetListeners() {
				for _, fc := range l.GetFilterChains() {
					for _, f := range fc.GetFilters() {
						if f.GetName() != hcmFilter {
							continue
						}
						n++
						hcm := unpack(t, f.GetTypedConfig(), &hcmv3.HttpConnectionManager{})
						if !hcm.GetNormalizePath().GetValue() || !hcm.GetMergeSlashes() {
							t.Errorf("listener %s: normalize_path and merge_slashes must be on, or //api/coupon/ slips past prefix rules", l.GetName())
						}
						if a := hcm.GetPathWithEscapedSlashesAction(); a != hcmv3.HttpConnectionManager_UNESCAPE_AND_REDIRECT {
							t.Errorf("listener %s: path_with_escaped_slashes_action %v, want UNESCAPE_AND_REDIRECT", l.GetName(), a)
						}
					}
				}
			}
			if n == 0 {
				t.Error("no HTTP connection manager")
			}
		})
	}
}

func findHCM(t *testing.T, l *listenerv3.Listener) *hcmv3.HttpConnectionManager {
	t.Helper()
	for _, fc := range l.GetFilterChains() {
		for _, f := range fc.GetFilters() {
			if f.GetName() == hcmFilter {
				return unpack(t, f.GetTypedConfig(), &hcmv3.HttpConnectionManager{})
			}
		}
	}
	t.Fatalf("listener %s: no %s", l.GetName(), hcmFilter)
	return nil
}

func endpoints(c *clusterv3.Cluster) []string {
	var out []string
	for _, le := range c.GetLoadAssignment().GetEndpoints() {
		for _, lb := range le.GetLbEndpoints() {
			sa := lb.GetEndpoint().GetAddress().GetSocketAddress()
			out = append(out, fmt.Sprintf("%s:%d", sa.GetAddress(), sa.GetPortValue()))
		}
	}
	return out
}

func filterNames(fs []*hcmv3.HttpFilter) []string {
	var out []string
	for _, f := range fs {
		out = append(out, f.GetName())
	}
	return out
}

// TestBrokenConfigsFail proves the loader is strict: each mutation of
// envoy.yaml must be rejected, and for the reason given.
func TestBrokenConfigsFail(t *testing.T) {
	orig, err := os.ReadFile("envoy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	tests := map[string]struct {
		old, new string
		wantErr  string
	}{
		"unknown field": {
			old: "transport_api_version: V3", new: "transport_api_versionn: V3",
			wantErr: "transport_api_versionn",
		},
		"typo in @type": {
			old:     "type.googleapis.com/envoy.extensions.filters.http.ext_authz.v3.ExtAuthz\n",
			new:     "type.googleapis.com/envoy.extensions.filters.http.ext_authz.v3.ExtAuth\n",
			wantErr: "ExtAuth",
		},
		"unknown enum value": {
			old: "code: ServiceUnavailable", new: "code: ServiceUnavailabl",
			wantErr: "ServiceUnavailabl",
		},
		"bootstrap rule (port out of range)": {
			old: "port_value: 8080", new: "port_value: 80800",
			wantErr: "PortValue",
		},
		"rule inside an Any (empty stat_prefix)": {
			old: "stat_prefix: ingress_http", new: `stat_prefix: ""`,
			wantErr: "StatPrefix",
		},
		"rule inside an Any inside an Any (per-route config without override)": {
			old: "\n" + strings.Repeat(" ", 30) + "disabled: true", new: "",
			wantErr: "Override",
		},
		"rule inside an Any inside an Any (empty cluster name)": {
			old: "envoy_grpc: {cluster_name: flashgate}", new: `envoy_grpc: {cluster_name: ""}`,
			wantErr: "ClusterName",
		},
		"bad duration": {
			old: "timeout: 0.05s", new: "timeout: 50ms",
			wantErr: "Duration",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if !bytes.Contains(orig, []byte(tc.old)) {
				t.Fatalf("envoy.yaml no longer contains %q: update this test", tc.old)
			}
			broken := bytes.Replace(orig, []byte(tc.old), []byte(tc.new), 1)
			_, err := loadBootstrap(broken)
			if err == nil {
				t.Fatalf("broken config accepted")
			}
			if !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("error %q does not mention %q", err, tc.wantErr)
			}
			t.Log(err)
		})
	}
}

// TestWalkAnysFindsNested guards the walker itself: an Any in a map inside an
// Any inside a list must be reached.
func TestWalkAnysFindsNested(t *testing.T) {
	per, err := anypb.New(&extauthzv3.ExtAuthzPerRoute{}) // no override: invalid
	if err != nil {
		t.Fatal(err)
	}
	hcm, err := anypb.New(&hcmv3.HttpConnectionManager{
		StatPrefix: "x",
		RouteSpecifier: &hcmv3.HttpConnectionManager_RouteConfig{RouteConfig: &routev3.RouteConfiguration{
			VirtualHosts: []*routev3.VirtualHost{{
				Name: "v", Domains: []string{"*"},
				Routes: []*routev3.Route{{
					Match:                &routev3.RouteMatch{PathSpecifier: &routev3.RouteMatch_Prefix{Prefix: "/"}},
					Action:               &routev3.Route_DirectResponse{DirectResponse: &routev3.DirectResponseAction{Status: 200}},
					TypedPerFilterConfig: map[string]*anypb.Any{extAuthzFilter: per},
				}},
			}},
		}},
	})
	if err != nil {
		t.Fatal(err)
	}
	l := &listenerv3.Listener{FilterChains: []*listenerv3.FilterChain{{
		Filters: []*listenerv3.Filter{{Name: hcmFilter, ConfigType: &listenerv3.Filter_TypedConfig{TypedConfig: hcm}}},
	}}}
	if err := validateDeep(l); err == nil || !strings.Contains(err.Error(), "Override") {
		t.Fatalf("validateDeep = %v, want the nested ExtAuthzPerRoute rejected", err)
	}
}
