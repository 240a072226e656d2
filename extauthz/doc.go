// Package extauthz is flashgate's Envoy ext_authz (gRPC, API v3) server.
package extauthz
