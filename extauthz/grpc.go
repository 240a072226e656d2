package extauthz

import (
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
)

// Codec returns the gRPC codec for a server of any ext_authz service:
// grpc-go's proto codec, except that a request whose string fields hold
// invalid UTF-8 is repaired instead of refused (Envoy forwards raw HTTP/1
// header bytes), see lenientCodec. It decodes every field, as any Go
// ext_authz server would.
func Codec() encoding.CodecV2 { return newLenientCodec(false, nil) }

// Codec returns the gRPC codec of the server s is registered on: Codec's,
// except that it does not decode a CheckRequest (Check decodes only what
// the rules in force read of it; headers they do not name are never
// parsed), and that it sends the OK responses s shares between checks as
// bytes encoded once.
func (s *Server) Codec() encoding.CodecV2 { return newLenientCodec(true, &s.encoded) }

// Register registers s as the envoy.service.auth.v3.Authorization service
// on r (a gRPC server, before it serves). Its server should use s.Codec.
func (s *Server) Register(r grpc.ServiceRegistrar) { authv3.RegisterAuthorizationServer(r, s) }
