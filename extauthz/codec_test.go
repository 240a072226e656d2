package extauthz

import (
	"bytes"
	"context"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
)

// rawCodec sends pre-encoded bytes as they are, so a test can put what
// Envoy may forward (invalid UTF-8) on the wire; Go's proto marshaller
// refuses to.
type rawCodec struct{}

func (rawCodec) Name() string { return "proto" }

func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	return mem.BufferSlice{mem.SliceBuffer(*v.(*[]byte))}, nil
}

func (rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	*v.(*[]byte) = data.Materialize()
	return nil
}

// invalidUTF8Request encodes a CheckRequest for /api/coupon/x whose x-uid
// (and, in header_map, x-device-fp) hold the bytes 0xff 0xfe 0xfd + suffix.
func invalidUTF8Request(t *testing.T, suffix string) []byte {
	t.Helper()
	const marker = "@@@"
	r := &authv3.CheckRequest{Attributes: &authv3.AttributeContext{
		Source: &authv3.AttributeContext_Peer{Address: &corev3.Address{Address: &corev3.Address_SocketAddress{
			SocketAddress: &corev3.SocketAddress{Address: "10.9.9.9", PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: 1}}}}},
		Request: &authv3.AttributeContext_Request{Http: &authv3.AttributeContext_HttpRequest{
			Method: "GET", Path: "/api/coupon/x",
			Headers: map[string]string{"x-uid": marker + suffix},
		}},
	}}
	b, err := proto.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Count(b, []byte(marker)) != 1 {
		t.Fatal("marker not found exactly once")
	}
	return bytes.Replace(b, []byte(marker), []byte{0xff, 0xfe, 0xfd}, 1)
}

// TestInvalidUTF8OverTheWire: a header with invalid UTF-8 is decided like
// any other value, not refused with a gRPC error.
func TestInvalidUTF8OverTheWire(t *testing.T) {
	e := newEnv(t, nil, nil)
	_, conn := serveBufconn(t, e.srv)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	wire := invalidUTF8Request(t, "user")
	if err := proto.Unmarshal(wire, &authv3.CheckRequest{}); err == nil {
		t.Fatal("the test request is valid UTF-8; it tests nothing")
	}
	statuses := make([]codes.Code, 0, 7)
	for range 7 {
		var out []byte
		err := conn.Invoke(ctx, "/envoy.service.auth.v3.Authorization/Check", &wire, &out, grpc.ForceCodecV2(rawCodec{}))
		if err != nil {
			t.Fatalf("Check with invalid UTF-8: %v", err)
		}
		var resp authv3.CheckResponse
		if err := proto.Unmarshal(out, &resp); err != nil {
			t.Fatal(err)
		}
		statuses = append(statuses, codes.Code(resp.GetStatus().GetCode()))
	}
	// The repaired value is one user: 5 per second, then 429s.
	for i, c := range statuses {
		want := codes.OK
		if i >= 5 {
			want = codes.ResourceExhausted
		}
		if c != want {
			t.Fatalf("answers %v: want 5 OK then RESOURCE_EXHAUSTED", statuses)
		}
	}
}

func TestRepairUTF8(t *testing.T) {
	md := (&authv3.CheckRequest{}).ProtoReflect().Descriptor()
	fixed, changed, err := repairUTF8(invalidUTF8Request(t, "u"), md, 0)
	if err != nil || !changed {
		t.Fatalf("changed %v, err %v", changed, err)
	}
	var r authv3.CheckRequest
	if err := proto.Unmarshal(fixed, &r); err != nil {
		t.Fatal(err)
	}
	if got := r.GetAttributes().GetRequest().GetHttp().GetHeaders()["x-uid"]; got != "\uFFFDu" {
		t.Errorf("x-uid = %q, want U+FFFD then u", got)
	}
	if _, _, err := repairUTF8([]byte{0x0a, 0xff}, md, 0); err == nil {
		t.Error("truncated wire data accepted")
	}
}
