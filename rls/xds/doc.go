// Package xds is a state-of-the-world xDS client of ratelimit configs: it
// subscribes on an ADS stream to resources of type [TypeURL], as
// envoyproxy/ratelimit does with CONFIG_TYPE=GRPC_XDS_SOTW, and hands each
// response to an [Applier] as the whole config. A response the Applier
// accepts is ACKed; one it refuses is NACKed with the error, the config in
// force kept. A broken stream is reopened after the retry interval.
// flashgate's schema additions have no proto field: a pushed config has
// their defaults.
package xds
