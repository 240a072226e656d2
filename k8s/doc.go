// Package k8s holds no Go code: the directory ships Kubernetes manifests for
// running flashgate as a sidecar, and its tests prove them well formed
// without a cluster.
//
// The core manifests (listed in kustomization.yaml, `kubectl apply -k k8s/`)
// run a demo application with an Envoy sidecar (envoy/envoy-sidecar.yaml, in
// the flashgate-envoy ConfigMap) and a flashgate sidecar bound to 127.0.0.1,
// the descriptors ConfigMap (descriptors/flashsale.yaml, mounted as a directory
// so reloads work), a demo Redis and a NetworkPolicy for it. istio/ holds the
// mesh shape: the extension providers (ext_authz over gRPC and over HTTP),
// the pod-local ServiceEntry, a CUSTOM AuthorizationPolicy for each, the
// EnvoyFilter alternative and the application without its own Envoy.
// ingress-nginx/ runs flashgate as a Deployment whose HTTP front-end the
// ingress-nginx controller asks through auth-url, with the annotations that
// turn its 403 into the client's 429.
//
// k8s_test.go decodes every Kubernetes object strictly into k8s.io/api types
// (unknown fields fail), asserts the product facts (loopback gRPC, probes,
// hardening, drain order, byte-identical ConfigMaps) and checks the Istio
// resources' shape, the EnvoyFilter's filter config through Envoy's protos,
// and runs the ingress-nginx annotations, rendered as the controller renders
// them, through nginx -t and a real nginx (internal/testing/proxytest).
// docs_test.go decodes the docs' Pod `containers:` fragments the same way.
// README.md is the operator's guide.
//
// The directory is a Go module of its own, so that k8s.io stays out of the
// sidecar's module.
package k8s
