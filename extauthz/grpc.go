package extauthz

import (
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
)

// Codec returns the gRPC codec for a server of any ext_authz service: the
// proto codec, repairing invalid UTF-8 in requests (see lenientCodec).
func Codec() encoding.CodecV2 { return newLenientCodec(false, nil) }

// Codec returns the codec of the server s is registered on: Codec's, but
// Check decodes only what the rules read, and shared responses are sent
// as bytes encoded once.
func (s *Server) Codec() encoding.CodecV2 { return newLenientCodec(true, &s.encoded) }

// Register registers s as the Authorization service on r; r's server
// should use s.Codec.
func (s *Server) Register(r grpc.ServiceRegistrar) { authv3.RegisterAuthorizationServer(r, s) }
