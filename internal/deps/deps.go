//go:build tools

// Package deps pins the modules the project builds on while packages are
// being written in parallel, so that `go mod tidy` keeps them. Removed once
// every dependency is imported by real code.
package deps

import (
	_ "github.com/dgraph-io/ristretto/v2"
	_ "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	_ "github.com/goccy/go-yaml"
	_ "github.com/prometheus/client_golang/prometheus"
	_ "github.com/redis/go-redis/v9"
	_ "github.com/spf13/cobra"
	_ "golang.org/x/term"
	_ "google.golang.org/grpc"
	_ "google.golang.org/protobuf/encoding/protojson"
	_ "k8s.io/api/apps/v1"
	_ "sigs.k8s.io/yaml"
)
