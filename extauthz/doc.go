// Package extauthz is flashgate's Envoy ext_authz (gRPC, API v3) front-end:
// a codec that reads each CheckRequest into the hits of a descriptors file
// (package descriptors), asks the enforcement core (package enforce), and
// writes its verdict as OK or a 429 with the core's rate-limit headers and
// problem body. Check never returns a gRPC error for backend trouble: the
// core's failure modes decide ([enforce.FailureMode]).
//
//	srv, err := extauthz.NewServer(cfg, extauthz.Options{Core: core, Keys: keys})
//	h, err := host.New(host.Options{GRPC: lis, Codec: srv.Codec(), ...})
//	srv.Register(h)
//	go srv.Reloader(path).Watch(ctx, 0)
//
// The server's own codec does not decode a CheckRequest: Check decodes only
// what the rules in force read (wire.go), and shared OK responses are sent
// as bytes encoded once (response.go).
package extauthz
