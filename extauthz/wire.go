package extauthz

import (
	"errors"
	"slices"
	"strings"
	"unicode/utf8"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/flashgate/flashgate/descriptors"
)

// The server's codec does not decode a CheckRequest (Envoy sends every
// header; the rules read a handful): it keeps the wire bytes as unknown
// fields under wireField (keepWire), and Check decodes only what the rule
// set in force reads (decodeCheck). Decoding with the rules that then map
// the request means a reload never leaves a request without a value its
// rules need.

// wireField is the largest valid field number, far from CheckRequest's.
const wireField protowire.Number = protowire.MaxValidNumber

// The field numbers decodeCheck reads; TestWireFieldNumbers checks them.
const (
	fCheckAttributes protowire.Number = 1 // CheckRequest.attributes

	fAttrSource     protowire.Number = 1  // AttributeContext.source
	fAttrRequest    protowire.Number = 4  // AttributeContext.request
	fAttrExtensions protowire.Number = 10 // AttributeContext.context_extensions

	fPeerAddress   protowire.Number = 1 // AttributeContext.Peer.address
	fAddressSocket protowire.Number = 1 // Address.socket_address
	// Address.pipe and .envoy_internal_address: the oneof's other members
	fAddressPipe, fAddressInternal protowire.Number = 2, 3
	fSocketAddress                 protowire.Number = 2 // SocketAddress.address

	fRequestHTTP protowire.Number = 2 // AttributeContext.Request.http

	fHTTPMethod    protowire.Number = 2  // HttpRequest.method
	fHTTPHeaders   protowire.Number = 3  // HttpRequest.headers
	fHTTPPath      protowire.Number = 4  // HttpRequest.path
	fHTTPHost      protowire.Number = 5  // HttpRequest.host
	fHTTPHeaderMap protowire.Number = 13 // HttpRequest.header_map

	fHeaderMapHeaders protowire.Number = 1 // HeaderMap.headers
	fHeaderKey        protowire.Number = 1 // HeaderValue.key, and a map entry's key
	fHeaderValue      protowire.Number = 2 // HeaderValue.value, and a map entry's value
	fHeaderRawValue   protowire.Number = 3 // HeaderValue.raw_value
)

// errMalformed: a request's bytes are not a CheckRequest.
var errMalformed = errors.New("malformed CheckRequest wire data")

// requestFields is what one rule set reads of a CheckRequest.
type requestFields struct {
	headers            []string // header names, as the rules spell them
	path, method, host bool
	peer, extensions   bool
	anyHeader, anyHTTP bool
	anyAttrib          bool
}

// fieldsOf returns what cfg's rules read, with what those fall back on.
func fieldsOf(cfg *descriptors.Config) requestFields {
	var f requestFields
	header := func(name string) {
		if !slices.Contains(f.headers, name) {
			f.headers = append(f.headers, name)
		}
	}
	for _, src := range cfg.Sources() {
		switch src.Kind {
		case descriptors.SourceHeader:
			header(src.Name)
		case descriptors.SourcePath:
			f.path = true
		case descriptors.SourceMethod:
			f.method = true
			header(":method")
		case descriptors.SourceAuthority:
			f.host = true
			header(":authority")
		case descriptors.SourceContextExtension:
			f.extensions = true
		case descriptors.SourceRemoteAddress:
			f.peer = true
			if cfg.ClientIP.TrustedHops > 0 {
				header("x-forwarded-for")
			}
		}
	}
	f.anyHeader = len(f.headers) > 0
	f.anyHTTP = f.anyHeader || f.path || f.method || f.host
	f.anyAttrib = f.anyHTTP || f.peer || f.extensions
	return f
}

// wantHeader reports whether the rules read header name, exactly as spelt.
func (f *requestFields) wantHeader(name []byte) bool {
	for _, h := range f.headers {
		if h == string(name) {
			return true
		}
	}
	return false
}

// wantHeaderFold is wantHeader for header_map's case-insensitive keys.
func (f *requestFields) wantHeaderFold(name []byte) bool {
	for _, h := range f.headers {
		if asciiEqualFold(h, name) {
			return true
		}
	}
	return false
}

// keepWire makes req carry data for Check to decode: one copy.
func keepWire(req *authv3.CheckRequest, data mem.BufferSlice) {
	n := data.Len()
	b := make([]byte, 0, protowire.SizeTag(wireField)+protowire.SizeVarint(uint64(n))+n)
	b = protowire.AppendTag(b, wireField, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(n))
	for _, buf := range data {
		b = append(b, buf.ReadOnlyData()...)
	}
	req.ProtoReflect().SetUnknown(b)
}

// wireOf returns the wire bytes keepWire left in req, or nil.
func wireOf(req *authv3.CheckRequest) []byte {
	if req == nil || req.Attributes != nil {
		return nil
	}
	u := req.ProtoReflect().GetUnknown()
	num, typ, n := protowire.ConsumeTag(u)
	if n < 0 || num != wireField || typ != protowire.BytesType {
		return nil
	}
	v, m := protowire.ConsumeBytes(u[n:])
	if m < 0 || n+m != len(u) {
		return nil
	}
	return v
}

// decodeCheck decodes into req what f says the rules read of the wire
// bytes b, skipping the rest, by protobuf's merge rules; invalid UTF-8 is
// repaired as the lenient codec does.
func decodeCheck(b []byte, f *requestFields, req *authv3.CheckRequest) error {
	req.ProtoReflect().SetUnknown(nil)
	return eachField(b, func(num protowire.Number, v []byte) error {
		if num != fCheckAttributes || !f.anyAttrib {
			return nil
		}
		if req.Attributes == nil {
			req.Attributes = &authv3.AttributeContext{}
		}
		return decodeAttributes(v, f, req.Attributes)
	})
}

func decodeAttributes(b []byte, f *requestFields, a *authv3.AttributeContext) error {
	return eachField(b, func(num protowire.Number, v []byte) error {
		switch {
		case num == fAttrSource && f.peer:
			if a.Source == nil {
				a.Source = &authv3.AttributeContext_Peer{}
			}
			return decodePeer(v, a.Source)
		case num == fAttrRequest && f.anyHTTP:
			if a.Request == nil {
				a.Request = &authv3.AttributeContext_Request{}
			}
			return eachField(v, func(num protowire.Number, v []byte) error {
				if num != fRequestHTTP {
					return nil
				}
				if a.Request.Http == nil {
					a.Request.Http = &authv3.AttributeContext_HttpRequest{}
				}
				return decodeHTTP(v, f, a.Request.Http)
			})
		case num == fAttrExtensions && f.extensions:
			if a.ContextExtensions == nil {
				a.ContextExtensions = make(map[string]string)
			}
			return decodeEntry(v, a.ContextExtensions, nil)
		}
		return nil
	})
}

func decodePeer(b []byte, p *authv3.AttributeContext_Peer) error {
	return eachField(b, func(num protowire.Number, v []byte) error {
		if num != fPeerAddress {
			return nil
		}
		if p.Address == nil {
			p.Address = &corev3.Address{}
		}
		return eachField(v, func(num protowire.Number, v []byte) error {
			switch num {
			case fAddressPipe, fAddressInternal:
				p.Address.Address = nil // the oneof holds another kind of address now
				return nil
			case fAddressSocket:
			default:
				return nil
			}
			sa := p.Address.GetSocketAddress()
			if sa == nil {
				sa = &corev3.SocketAddress{}
				p.Address.Address = &corev3.Address_SocketAddress{SocketAddress: sa}
			}
			return eachField(v, func(num protowire.Number, v []byte) error {
				if num == fSocketAddress {
					sa.Address = wireString(v)
				}
				return nil
			})
		})
	})
}

func decodeHTTP(b []byte, f *requestFields, h *authv3.AttributeContext_HttpRequest) error {
	return eachField(b, func(num protowire.Number, v []byte) error {
		switch {
		case num == fHTTPMethod && f.method:
			h.Method = wireString(v)
		case num == fHTTPPath && f.path:
			h.Path = wireString(v)
		case num == fHTTPHost && f.host:
			h.Host = wireString(v)
		case num == fHTTPHeaders && f.anyHeader:
			if h.Headers == nil {
				h.Headers = make(map[string]string, len(f.headers))
			}
			return decodeEntry(v, h.Headers, f.wantHeader)
		case num == fHTTPHeaderMap && f.anyHeader:
			if h.HeaderMap == nil {
				h.HeaderMap = &corev3.HeaderMap{}
			}
			return eachField(v, func(num protowire.Number, v []byte) error {
				if num != fHeaderMapHeaders {
					return nil
				}
				return decodeHeaderValue(v, f, h.HeaderMap)
			})
		}
		return nil
	})
}

// decodeEntry adds a map entry to m if want (nil: any) wants its key.
func decodeEntry(b []byte, m map[string]string, want func([]byte) bool) error {
	key, val, _, err := keyValue(b)
	if err == nil && (want == nil || want(key)) {
		m[wireString(key)] = wireString(val)
	}
	return err
}

// decodeHeaderValue appends a header_map entry to hm if the rules read it.
func decodeHeaderValue(b []byte, f *requestFields, hm *corev3.HeaderMap) error {
	key, val, raw, err := keyValue(b)
	if err == nil && f.wantHeaderFold(key) {
		hv := &corev3.HeaderValue{Key: wireString(key), Value: wireString(val)}
		if len(raw) > 0 {
			hv.RawValue = slices.Clone(raw)
		}
		hm.Headers = append(hm.Headers, hv)
	}
	return err
}

// keyValue reads a map entry or a HeaderValue: key, value, raw_value.
func keyValue(b []byte) (key, val, raw []byte, err error) {
	err = eachField(b, func(num protowire.Number, v []byte) error {
		switch num {
		case fHeaderKey:
			key = v
		case fHeaderValue:
			val = v
		case fHeaderRawValue:
			raw = v
		}
		return nil
	})
	return key, val, raw, err
}

// eachField calls fn with every length-delimited field of message b; it
// fails on malformed wire data.
func eachField(b []byte, fn func(num protowire.Number, v []byte) error) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return errMalformed
		}
		b = b[n:]
		if typ != protowire.BytesType {
			m := protowire.ConsumeFieldValue(num, typ, b)
			if m < 0 {
				return errMalformed
			}
			b = b[m:]
			continue
		}
		v, m := protowire.ConsumeBytes(b)
		if m < 0 {
			return errMalformed
		}
		b = b[m:]
		if err := fn(num, v); err != nil {
			return err
		}
	}
	return nil
}

// wireString returns b as a string, invalid UTF-8 runs as U+FFFD.
func wireString(b []byte) string {
	if utf8.Valid(b) {
		return string(b)
	}
	return strings.ToValidUTF8(string(b), "\uFFFD")
}
