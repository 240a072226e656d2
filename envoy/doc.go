// Package envoy holds no Go code: the directory ships flashgate's Envoy
// configurations, and its tests prove them valid against Envoy's own
// protobuf definitions (go-control-plane) without running Envoy.
//
//   - envoy.yaml: a front proxy (listener 0.0.0.0:8080) as used by
//     docker-compose.yml: the ext_authz HTTP filter calls flashgate over gRPC
//     (host flashgate:9191, HTTP/2), /healthz is exempt, /api/coupon/ passes
//     context_extensions, everything is routed to the demo upstream.
//   - envoy-sidecar.yaml: the same filter chain as an ingress sidecar in an
//     application pod, with the app on 127.0.0.1:8081 and flashgate on
//     127.0.0.1:9191; k8s/ ships it in a ConfigMap.
//   - envoy-http.yaml: the sidecar with ext_authz http_service calling
//     flashgate's HTTP front-end (127.0.0.1:9193, path_prefix /authz): the
//     allowed request headers (x-uid, x-device-fp, x-forwarded-for), the
//     rate-limit headers let through to the client on denial and on success.
//
// envoy_test.go loads every *.yaml here into bootstrap/v3.Bootstrap (YAML →
// JSON → protojson, unknown fields rejected, every typed_config type
// resolved), runs ValidateAll on the bootstrap and on every Any inside it,
// and asserts the product facts. compose_test.go checks docker-compose.yml,
// the Dockerfile and .dockerignore at the repository root. README.md is the
// operator's guide.
package envoy
