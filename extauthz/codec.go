package extauthz

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"unicode/utf8"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"google.golang.org/grpc/encoding"
	grpcproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// lenientCodec is the server's gRPC codec: grpc-go's proto codec, except
// that invalid UTF-8 in a request's strings is repaired to U+FFFD instead
// of refused, since Envoy forwards HTTP/1 header bytes as they came and a
// refusal would turn a Check into a gRPC error. With lazy a CheckRequest's
// wire bytes are kept for Check (keepWire); with encoded a shared response
// is sent as the bytes stored for it (preEncode).
type lenientCodec struct {
	base    encoding.CodecV2
	lazy    bool
	encoded *atomic.Pointer[sync.Map] // *authv3.CheckResponse → mem.BufferSlice
}

func newLenientCodec(lazy bool, encoded *atomic.Pointer[sync.Map]) lenientCodec {
	base := encoding.GetCodecV2(grpcproto.Name)
	return lenientCodec{base: base, lazy: lazy, encoded: encoded}
}

// Name is "proto": the codec replaces, not adds to, the content subtype.
func (c lenientCodec) Name() string { return grpcproto.Name }

func (c lenientCodec) Marshal(v any) (mem.BufferSlice, error) {
	if r, ok := v.(*authv3.CheckResponse); ok && c.encoded != nil {
		if m := c.encoded.Load(); m != nil {
			if b, ok := m.Load(r); ok {
				return b.(mem.BufferSlice), nil
			}
		}
	}
	return c.base.Marshal(v)
}

func (c lenientCodec) Unmarshal(data mem.BufferSlice, v any) error {
	if req, ok := v.(*authv3.CheckRequest); ok && c.lazy {
		keepWire(req, data)
		return nil
	}
	err := c.base.Unmarshal(data, v)
	if err == nil {
		return nil
	}
	m, ok := v.(proto.Message)
	if !ok || !strings.Contains(err.Error(), "UTF-8") {
		// Only an invalid-UTF-8 refusal is worth a repair.
		return err
	}
	buf := data.Materialize()
	fixed, changed, serr := repairUTF8(buf, m.ProtoReflect().Descriptor(), 0)
	if serr != nil || !changed {
		return err
	}
	proto.Reset(m)
	if err2 := proto.Unmarshal(fixed, m); err2 != nil {
		return fmt.Errorf("unmarshal after UTF-8 repair: %w", err2)
	}
	return nil
}

// maxRepairDepth bounds the recursion of repairUTF8.
const maxRepairDepth = 64

var errBadWire = errors.New("malformed protobuf wire data")

// repairUTF8 rewrites message b of type md with every invalid UTF-8
// sequence in its strings, nested ones included, replaced by U+FFFD.
func repairUTF8(b []byte, md protoreflect.MessageDescriptor, depth int) ([]byte, bool, error) {
	if depth > maxRepairDepth {
		return nil, false, errBadWire
	}
	out := make([]byte, 0, len(b)+16)
	changed := false
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return nil, false, errBadWire
		}
		fd := md.Fields().ByNumber(num)
		if typ != protowire.BytesType || fd == nil {
			m := protowire.ConsumeFieldValue(num, typ, b[n:])
			if m < 0 {
				return nil, false, errBadWire
			}
			out = append(out, b[:n+m]...)
			b = b[n+m:]
			continue
		}
		v, m := protowire.ConsumeBytes(b[n:])
		if m < 0 {
			return nil, false, errBadWire
		}
		switch fd.Kind() {
		case protoreflect.StringKind:
			if !utf8.Valid(v) {
				v, changed = []byte(strings.ToValidUTF8(string(v), "\uFFFD")), true
			}
		case protoreflect.MessageKind:
			sub, c, err := repairUTF8(v, fd.Message(), depth+1)
			if err != nil {
				return nil, false, err
			}
			v, changed = sub, changed || c
		}
		out = protowire.AppendTag(out, num, typ)
		out = protowire.AppendBytes(out, v)
		b = b[n+m:]
	}
	return out, changed, nil
}
