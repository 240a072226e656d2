// Package charts holds no Go code: the directory ships the flashgate Helm
// chart (charts/flashgate), and its tests prove it renders well formed
// objects without a cluster.
//
// flashgate_test.go renders the chart with the Helm SDK (the same engine
// `helm template` runs) with its default values and with every file of
// charts/flashgate/examples, decodes every object strictly into k8s.io/api
// types (unknown and duplicate fields fail; the ServiceMonitor, which has no
// Go type here, into a structural copy of the fields the chart sets), and
// checks what could go wrong between the objects: the container's flags are
// flags `flashgate serve` has, the descriptors and RLS ConfigMaps pass
// flashgate's own validation, probes, Services and NetworkPolicies point at
// ports the flags open and at pods that exist, and value sets the chart
// refuses fail to render. It runs Helm's linter too. docs/helm.md is the
// operator's guide.
//
// The directory is a Go module of its own, so that the Helm SDK and k8s.io
// stay out of the sidecar's module; it builds flashgate from the root.
package charts
