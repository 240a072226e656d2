package main

import (
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
)

// rawCodec lets bench send pre-encoded CheckRequests and read only the status
// code of the answer, so that the load generator spends its CPU on the
// transport, not on protobuf: Marshal takes a *rawMessage whose bytes are
// already the wire form; Unmarshal stores the status code into a
// *checkAnswer. Its name is "proto", so the server sees ordinary
// application/grpc+proto calls.
type rawCodec struct{}

// rawMessage is a message in its wire form.
type rawMessage []byte

// checkAnswer is what bench reads of a CheckResponse: status.code; or, with
// rls set, of a RateLimitResponse: overall_code.
type checkAnswer struct {
	rls  bool
	code int32
}

// RateLimitResponse.overall_code's values bench counts (Code_OK and
// Code_OVER_LIMIT of envoy.service.ratelimit.v3).
const (
	rlsOK        = 1
	rlsOverLimit = 2
)

// allowed reports whether the answer lets the request through.
func (a checkAnswer) allowed() bool {
	if a.rls {
		return a.code == rlsOK
	}
	return a.code == int32(codes.OK)
}

func (rawCodec) Name() string { return "proto" }

func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	m, ok := v.(*rawMessage)
	if !ok {
		return nil, fmt.Errorf("rawCodec: cannot marshal %T", v)
	}
	return mem.BufferSlice{mem.SliceBuffer(*m)}, nil
}

func (rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	a, ok := v.(*checkAnswer)
	if !ok {
		return fmt.Errorf("rawCodec: cannot unmarshal into %T", v)
	}
	var b []byte
	if len(data) == 1 {
		b = data[0].ReadOnlyData()
	} else {
		b = data.Materialize()
	}
	var code int32
	var err error
	if a.rls {
		code, err = overallCode(b)
	} else {
		code, err = statusCode(b)
	}
	if err != nil {
		return err
	}
	a.code = code
	return nil
}

// statusCode reads CheckResponse.status.code (fields 1 and 1) from the wire
// form b; absent fields read as 0 (OK).
func statusCode(b []byte) (int32, error) {
	st, err := field(b, 1, protowire.BytesType)
	if err != nil || st == nil {
		return 0, err
	}
	return varintField(st, 1, "CheckResponse.status")
}

// overallCode reads RateLimitResponse.overall_code (field 1, an enum) from
// the wire form b; absent reads as 0 (UNKNOWN).
func overallCode(b []byte) (int32, error) {
	return varintField(b, 1, "RateLimitResponse")
}

// varintField returns the last value of varint field num of message b (0
// when absent, as proto3 reads it); what names the message in errors.
func varintField(b []byte, num protowire.Number, what string) (int32, error) {
	var v int32
	for len(b) > 0 {
		n0, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return 0, fmt.Errorf("%s: %w", what, protowire.ParseError(n))
		}
		b = b[n:]
		if n0 == num && typ == protowire.VarintType {
			x, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return 0, fmt.Errorf("%s field %d: %w", what, num, protowire.ParseError(n))
			}
			v, b = int32(x), b[n:]
			continue
		}
		n = protowire.ConsumeFieldValue(n0, typ, b)
		if n < 0 {
			return 0, fmt.Errorf("%s: %w", what, protowire.ParseError(n))
		}
		b = b[n:]
	}
	return v, nil
}

// field returns the last value of length-delimited field num in b, or nil.
func field(b []byte, num protowire.Number, want protowire.Type) ([]byte, error) {
	var last []byte
	for len(b) > 0 {
		n0, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return nil, fmt.Errorf("CheckResponse: %w", protowire.ParseError(n))
		}
		b = b[n:]
		if n0 == num && typ == want {
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return nil, fmt.Errorf("CheckResponse: %w", protowire.ParseError(n))
			}
			last = v
			b = b[n:]
			continue
		}
		n = protowire.ConsumeFieldValue(n0, typ, b)
		if n < 0 {
			return nil, fmt.Errorf("CheckResponse: %w", protowire.ParseError(n))
		}
		b = b[n:]
	}
	return last, nil
}
