package extauthz

import (
	"context"
	"reflect"
	"slices"
	"strings"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/flashgate/flashgate/descriptors"
	"github.com/flashgate/flashgate/window"
)

// TestWireFieldNumbers: the field numbers decodeCheck reads are those of
// go-control-plane's descriptors.
func TestWireFieldNumbers(t *testing.T) {
	field := func(m proto.Message, path ...string) protowire.Number {
		t.Helper()
		md := m.ProtoReflect().Descriptor()
		var fd protoreflect.FieldDescriptor
		for _, name := range path {
			if fd = md.Fields().ByName(protoreflect.Name(name)); fd == nil {
				t.Fatalf("%s has no field %s", md.FullName(), name)
			}
			if fd.IsMap() {
				md = fd.MapValue().ContainingMessage()
			} else {
				md = fd.Message()
			}
		}
		return fd.Number()
	}
	for _, c := range []struct {
		got, want protowire.Number
		what      string
	}{
		{fCheckAttributes, field(&authv3.CheckRequest{}, "attributes"), "CheckRequest.attributes"},
		{fAttrSource, field(&authv3.AttributeContext{}, "source"), "AttributeContext.source"},
		{fAttrRequest, field(&authv3.AttributeContext{}, "request"), "AttributeContext.request"},
		{fAttrExtensions, field(&authv3.AttributeContext{}, "context_extensions"), "AttributeContext.context_extensions"},
		{fPeerAddress, field(&authv3.AttributeContext_Peer{}, "address"), "Peer.address"},
		{fAddressSocket, field(&corev3.Address{}, "socket_address"), "Address.socket_address"},
		{fAddressPipe, field(&corev3.Address{}, "pipe"), "Address.pipe"},
		{fAddressInternal, field(&corev3.Address{}, "envoy_internal_address"), "Address.envoy_internal_address"},
		{fSocketAddress, field(&corev3.SocketAddress{}, "address"), "SocketAddress.address"},
		{fRequestHTTP, field(&authv3.AttributeContext_Request{}, "http"), "Request.http"},
		{fHTTPMethod, field(&authv3.AttributeContext_HttpRequest{}, "method"), "HttpRequest.method"},
		{fHTTPHeaders, field(&authv3.AttributeContext_HttpRequest{}, "headers"), "HttpRequest.headers"},
		{fHTTPPath, field(&authv3.AttributeContext_HttpRequest{}, "path"), "HttpRequest.path"},
		{fHTTPHost, field(&authv3.AttributeContext_HttpRequest{}, "host"), "HttpRequest.host"},
		{fHTTPHeaderMap, field(&authv3.AttributeContext_HttpRequest{}, "header_map"), "HttpRequest.header_map"},
		{fHeaderMapHeaders, field(&corev3.HeaderMap{}, "headers"), "HeaderMap.headers"},
		{fHeaderKey, field(&corev3.HeaderValue{}, "key"), "HeaderValue.key"},
		{fHeaderValue, field(&corev3.HeaderValue{}, "value"), "HeaderValue.value"},
		{fHeaderRawValue, field(&corev3.HeaderValue{}, "raw_value"), "HeaderValue.raw_value"},
	} {
		if c.got != c.want {
			t.Errorf("%s: decodeCheck reads field %d, the descriptor says %d", c.what, c.got, c.want)
		}
	}
	// The map entries' key and value.
	md := (&authv3.AttributeContext_HttpRequest{}).ProtoReflect().Descriptor().Fields().ByName("headers").Message()
	if k, v := md.Fields().ByName("key").Number(), md.Fields().ByName("value").Number(); k != fHeaderKey || v != fHeaderValue {
		t.Errorf("map entry key/value are %d/%d, decodeCheck reads %d/%d", k, v, fHeaderKey, fHeaderValue)
	}
}

// checkLazyMapping asserts that the request in wire bytes b maps under cfg
// exactly as it does decoded whole by the lenient codec, when that codec
// accepts it; lazy decoding may accept bytes it refuses (fields no rule
// reads are not parsed), never the other way round.
func checkLazyMapping(t *testing.T, cfg *descriptors.Config, b []byte) {
	t.Helper()
	var full authv3.CheckRequest
	fullErr := newLenientCodec(false, nil).Unmarshal(mem.BufferSlice{mem.SliceBuffer(b)}, &full)
	var lazy authv3.CheckRequest
	if err := newLenientCodec(true, nil).Unmarshal(mem.BufferSlice{mem.SliceBuffer(b)}, &lazy); err != nil {
		t.Fatalf("the lazy codec refused the bytes: %v", err)
	}
	wire := wireOf(&lazy)
	if wire == nil {
		t.Fatal("the lazy codec kept no wire bytes")
	}
	f := fieldsOf(cfg)
	lazyErr := decodeCheck(wire, &f, &lazy)
	if fullErr != nil {
		return
	}
	if lazyErr != nil {
		t.Fatalf("decodeCheck refused bytes the codec decodes: %v", lazyErr)
	}
	if wireOf(&lazy) != nil {
		t.Fatal("decodeCheck left the wire bytes in the request")
	}
	var mf, ml mapping
	mapCheck(cfg, &full, window.Keys{}, &mf)
	mapCheck(cfg, &lazy, window.Keys{}, &ml)
	if !reflect.DeepEqual(mf.Hits, ml.Hits) || mf.Missing != ml.Missing {
		t.Fatalf("lazily decoded, the request maps to %+v (missing %v); decoded whole, to %+v (missing %v)", ml.Hits, ml.Missing, mf.Hits, mf.Missing)
	}
}

// wireRequests are CheckRequests in wire form covering what decodeCheck
// reads: headers in the map and in header_map (raw values, mixed case,
// repeats), addresses of each kind, context extensions, invalid UTF-8,
// a message sent twice (merged), and fields of unexpected wire types.
func wireRequests(t testing.TB) map[string][]byte {
	t.Helper()
	marshal := func(r *authv3.CheckRequest) []byte {
		t.Helper()
		b, err := proto.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	req := func(path, method, host, peer string, headers map[string]string, hm []*corev3.HeaderValue, ext map[string]string) *authv3.CheckRequest {
		http := &authv3.AttributeContext_HttpRequest{Path: path, Method: method, Host: host, Headers: headers}
		if hm != nil {
			http.HeaderMap = &corev3.HeaderMap{Headers: hm}
		}
		return &authv3.CheckRequest{Attributes: &authv3.AttributeContext{
			Source: &authv3.AttributeContext_Peer{Address: &corev3.Address{Address: &corev3.Address_SocketAddress{
				SocketAddress: &corev3.SocketAddress{Address: peer, PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: 5555}},
			}}},
			Destination: &authv3.AttributeContext_Peer{Address: &corev3.Address{Address: &corev3.Address_SocketAddress{
				SocketAddress: &corev3.SocketAddress{Address: "10.9.9.9", PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: 443}},
			}}},
			Request:           &authv3.AttributeContext_Request{Http: http},
			ContextExtensions: ext,
		}}
	}
	envoy := map[string]string{
		":method": "POST", ":path": "/api/coupon/7?x=1", ":authority": "example.com", ":scheme": "https",
		"x-uid": "u1", "x-device-fp": "d1", "x-forwarded-for": "203.0.113.9, 10.0.0.1, 10.0.0.2",
		"x-request-id": "0f5e6c1e", "user-agent": "Mozilla/5.0", "cookie": strings.Repeat("c=1; ", 200),
		"accept": "*/*", "content-type": "application/json", "x-envoy-expected-rq-timeout-ms": "15000",
	}
	out := map[string][]byte{
		"envoy-shaped": marshal(req("/api/coupon/7?x=1", "POST", "example.com", "10.0.0.5", envoy, nil, map[string]string{"tenant": "acme"})),
		"header_map only": marshal(req("/api/coupon/7", "", "", "::ffff:10.0.0.5", nil, []*corev3.HeaderValue{
			{Key: ":method", Value: "GET"}, {Key: ":authority", Value: "example.com"},
			{Key: "X-Uid", RawValue: []byte("u2")}, {Key: "x-uid", Value: "u3"},
			{Key: "X-Forwarded-For", Value: "198.51.100.1, 10.0.0.1"}, {Key: "x-other", Value: "o"},
		}, nil)),
		"map and header_map": marshal(req("/api/x", "GET", "example.com", "2001:db8::1", map[string]string{"x-uid": "in-map"},
			[]*corev3.HeaderValue{{Key: "x-uid", Value: "in-header-map"}}, map[string]string{"tenant": "t", "other": "o"})),
		"nothing": marshal(&authv3.CheckRequest{}),
		"no http": marshal(&authv3.CheckRequest{Attributes: &authv3.AttributeContext{ContextExtensions: map[string]string{"tenant": "t"}}}),
		"pipe peer": marshal(&authv3.CheckRequest{Attributes: &authv3.AttributeContext{Source: &authv3.AttributeContext_Peer{
			Address: &corev3.Address{Address: &corev3.Address_Pipe{Pipe: &corev3.Pipe{Path: "/run/x.sock"}}},
		}}}),
	}
	// Sent twice: protobuf merges the messages (maps add up, scalars and
	// oneofs: the last wins).
	first := marshal(req("/api/a", "GET", "a.example", "10.0.0.1", map[string]string{"x-uid": "first", "x-device-fp": "d"}, nil, map[string]string{"tenant": "t1"}))
	second := marshal(req("/api/b", "PUT", "", "10.0.0.2", map[string]string{"x-uid": "second"}, nil, nil))
	out["merged"] = append(slices.Clone(first), second...)
	pipeAfter := marshal(&authv3.CheckRequest{Attributes: &authv3.AttributeContext{Source: &authv3.AttributeContext_Peer{
		Address: &corev3.Address{Address: &corev3.Address_Pipe{Pipe: &corev3.Pipe{Path: "/run/x.sock"}}},
	}}})
	out["socket then pipe"] = append(slices.Clone(first), pipeAfter...)
	// Invalid UTF-8 in values the rules read, written by hand (Marshal
	// refuses it): attributes{request{http{path, headers{x-uid: ...}}}}.
	entry := protowire.AppendBytes(protowire.AppendTag(nil, fHeaderKey, protowire.BytesType), []byte("x-uid"))
	entry = protowire.AppendBytes(protowire.AppendTag(entry, fHeaderValue, protowire.BytesType), []byte("u\xff\xfe1"))
	http := protowire.AppendBytes(protowire.AppendTag(nil, fHTTPPath, protowire.BytesType), []byte("/api/\xffx"))
	http = protowire.AppendBytes(protowire.AppendTag(http, fHTTPHeaders, protowire.BytesType), entry)
	http = protowire.AppendBytes(protowire.AppendTag(http, fHTTPMethod, protowire.BytesType), []byte("GET"))
	// A varint where a string belongs: protobuf keeps it unknown.
	http = protowire.AppendVarint(protowire.AppendTag(http, fHTTPHost, protowire.VarintType), 7)
	request := protowire.AppendBytes(protowire.AppendTag(nil, fRequestHTTP, protowire.BytesType), http)
	attrs := protowire.AppendBytes(protowire.AppendTag(nil, fAttrRequest, protowire.BytesType), request)
	// A header_map key that folds to a rule's header only under Unicode
	// folding (U+212A KELVIN SIGN): not the header, in either decode.
	out["kelvin sign"] = marshal(req("/api/coupon/1", "GET", "", "10.0.0.1", nil, []*corev3.HeaderValue{
		{Key: "x-uid", Value: "real"}, {Key: "x-\u212aey", Value: "victim"}, {Key: "X-\u212aey", Value: "victim2"},
	}, nil))
	out["header_map folded"] = marshal(req("/api/coupon/1", "GET", "", "10.0.0.1", nil, []*corev3.HeaderValue{
		{Key: "X-KEY", Value: "k1"}, {Key: "X-Uid", Value: "u1"},
	}, nil))
	out["invalid UTF-8, odd wire types"] = protowire.AppendBytes(protowire.AppendTag(nil, fCheckAttributes, protowire.BytesType), attrs)
	return out
}

// TestLazyDecodeMapsAlike: every request maps the same decoded lazily (only
// what the rules read) as decoded whole, under rule sets reading every
// kind of value, and the lazy decode keeps no header the rules do not
// read.
func TestLazyDecodeMapsAlike(t *testing.T) {
	fuzzCfg, err := descriptors.ParseConfig("fuzz.yaml", []byte(fuzzYAML))
	if err != nil {
		t.Fatal(err)
	}
	example, err := descriptors.ExampleConfig()
	if err != nil {
		t.Fatal(err)
	}
	keyCfg, err := descriptors.ParseConfig("key.yaml", []byte(`
domain: key
sources:
  key: {request_headers: {header_name: x-key}}
descriptors:
  - key: key
    rate_limit: {requests: 5, window: 1m}
`))
	if err != nil {
		t.Fatal(err)
	}
	for name, b := range wireRequests(t) {
		for _, cfg := range []*descriptors.Config{fuzzCfg, example, keyCfg} {
			t.Run(name+"/"+cfg.Name, func(t *testing.T) { checkLazyMapping(t, cfg, b) })
		}
	}
	var lazy authv3.CheckRequest
	keepWire(&lazy, mem.BufferSlice{mem.SliceBuffer(wireRequests(t)["envoy-shaped"])})
	f := fieldsOf(example)
	if err := decodeCheck(wireOf(&lazy), &f, &lazy); err != nil {
		t.Fatal(err)
	}
	var kept []string
	for k := range lazy.GetAttributes().GetRequest().GetHttp().GetHeaders() {
		kept = append(kept, k)
	}
	slices.Sort(kept)
	if want := []string{"x-device-fp", "x-uid"}; !slices.Equal(kept, want) {
		t.Errorf("the example's rules kept headers %q, want %q (what they read)", kept, want)
	}
}

// TestLazyDecodeMalformed: bytes that are no CheckRequest where the rules
// read fail decodeCheck, and through the real gRPC server Check answers
// InvalidArgument (where a decoding codec answered Internal) and serves the
// next request.
func TestLazyDecodeMalformed(t *testing.T) {
	cfg, err := descriptors.ParseConfig("fuzz.yaml", []byte(fuzzYAML))
	if err != nil {
		t.Fatal(err)
	}
	f := fieldsOf(cfg)
	bad := [][]byte{
		{0x0a, 0x05, 0x22, 0x10},       // attributes{request: length past the end}
		{0x0a, 0x02, 0x22, 0x80},       // a truncated length
		{0x0a, 0x03, 0x22, 0x01, 0x12}, // http: a tag with no length
	}
	for _, b := range bad {
		var req authv3.CheckRequest
		keepWire(&req, mem.BufferSlice{mem.SliceBuffer(b)})
		if err := decodeCheck(wireOf(&req), &f, &req); err == nil {
			t.Errorf("decodeCheck(% x) = nil, want an error", b)
		}
	}

	_, conn := serveBufconn(t, newEnv(t, cfg, nil).srv)
	for _, b := range bad {
		var resp []byte
		err := conn.Invoke(context.Background(), authv3.Authorization_Check_FullMethodName, &b, &resp,
			grpc.ForceCodecV2(rawCodec{}))
		if status.Code(err) != codes.InvalidArgument {
			t.Errorf("Check(% x) through gRPC = %v, want InvalidArgument", b, err)
		}
	}
	good, err := proto.Marshal(&authv3.CheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var raw []byte
	if err := conn.Invoke(context.Background(), authv3.Authorization_Check_FullMethodName, &good, &raw,
		grpc.ForceCodecV2(rawCodec{})); err != nil {
		t.Fatalf("an empty request after the bad ones: %v", err)
	}
	var resp authv3.CheckResponse
	if err := proto.Unmarshal(raw, &resp); err != nil || resp.GetStatus().GetCode() != 0 {
		t.Fatalf("an empty request after the bad ones = %v, %v; want OK", &resp, err)
	}
}

// FuzzLazyDecode: for any bytes the lenient codec decodes, the lazy decode
// maps them alike (see checkLazyMapping).
func FuzzLazyDecode(f *testing.F) {
	for _, b := range wireRequests(f) {
		f.Add(b)
	}
	cfg, err := descriptors.ParseConfig("fuzz.yaml", []byte(fuzzYAML))
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, b []byte) { checkLazyMapping(t, cfg, b) })
}

// TestSharedResponsesPreEncoded: through a Server's own gRPC server, a
// shared OK response goes out as the bytes encoded when it was built, and
// they are its encoding: the client reads the same response Check returns.
func TestSharedResponsesPreEncoded(t *testing.T) {
	e := newEnv(t, nil, nil)
	_, conn := serveBufconn(t, e.srv)
	r := req{path: "/api/coupon/1", ip: "10.0.0.1", headers: map[string]string{"x-uid": "u1", "x-device-fp": "d1"}}.proto()
	// In process first (a fresh uid: remaining 4 after this one), then the
	// same over gRPC for another uid, which gets the same shared response.
	want, err := e.srv.Check(context.Background(), r)
	if err != nil {
		t.Fatal(err)
	}
	enc, ok := e.srv.rules.Load().encoded.Load(want)
	if !ok {
		t.Fatalf("the shared OK response %v has no stored encoding", want)
	}
	r2 := req{path: "/api/coupon/1", ip: "10.0.0.2", headers: map[string]string{"x-uid": "u2", "x-device-fp": "d2"}}.proto()
	b, err := proto.Marshal(r2)
	if err != nil {
		t.Fatal(err)
	}
	var raw []byte
	if err := conn.Invoke(context.Background(), authv3.Authorization_Check_FullMethodName, &b, &raw, grpc.ForceCodecV2(rawCodec{})); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(raw, enc.(mem.BufferSlice).Materialize()) {
		t.Fatalf("the reply's bytes differ from the stored encoding")
	}
	var got authv3.CheckResponse
	if err := proto.Unmarshal(raw, &got); err != nil || !proto.Equal(&got, want) {
		t.Fatalf("over gRPC: %v (%v); in process: %v", &got, err, want)
	}
}

// BenchmarkDecodeCheck: an Envoy-shaped CheckRequest (wireRequests'
// "envoy-shaped": 13 headers, a 1 KB cookie, addresses, a context
// extension) as the lenient codec decodes it whole, and as Check decodes
// it lazily for the example's rules (the codec's copy included).
func BenchmarkDecodeCheck(b *testing.B) {
	wire := wireRequests(b)["envoy-shaped"]
	cfg, err := descriptors.ExampleConfig()
	if err != nil {
		b.Fatal(err)
	}
	f := fieldsOf(cfg)
	data := mem.BufferSlice{mem.SliceBuffer(wire)}
	b.Run("whole", func(b *testing.B) {
		c := newLenientCodec(false, nil)
		b.ReportAllocs()
		for b.Loop() {
			var req authv3.CheckRequest
			if err := c.Unmarshal(data, &req); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("lazy", func(b *testing.B) {
		c := newLenientCodec(true, nil)
		b.ReportAllocs()
		for b.Loop() {
			var req authv3.CheckRequest
			if err := c.Unmarshal(data, &req); err != nil {
				b.Fatal(err)
			}
			if err := decodeCheck(wireOf(&req), &f, &req); err != nil {
				b.Fatal(err)
			}
		}
	})
}
