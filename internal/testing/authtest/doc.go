// Package authtest holds what the tests of flashgate's ext_authz clients
// (flashgate check, flashgate-bench) serve them: a small fake ext_authz
// server that limits per x-uid and records what it saw, and a gRPC server
// for it on a loopback port. It is for tests only.
package authtest
