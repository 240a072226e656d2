// Package xds is a state-of-the-world xDS client of ratelimit configs: it
// subscribes, on an aggregated discovery (ADS) stream, to the resources of
// type [TypeURL] (ratelimit.config.ratelimit.v3.RateLimitConfig, one domain
// each) as envoyproxy/ratelimit does with CONFIG_TYPE=GRPC_XDS_SOTW, and
// hands every response to an [Applier] (an rls.Pusher: the path a config
// directory's reload takes).
//
// Each response is the whole config: its resources, converted to the YAML
// files the rls package reads from a directory, replace the config in force,
// so a resource the server no longer sends removes its domain. A response
// the Applier accepts is ACKed (its version and nonce); one it refuses
// (a bad config, a resource that does not decode, two resources of one
// domain) is NACKed with the error as error_detail, and the config in force
// stays, as after a bad file.
//
// The node sent is ratelimit's: the node id (ratelimit's default "default")
// and the metadata as string fields. When the stream cannot be opened or
// breaks, the client waits the retry interval (ratelimit's 3s by default)
// and opens a new stream, asking for every resource again. The connection is
// plaintext, TLS, or mTLS with a client certificate ([TLSConfig]).
//
// flashgate's additions to the ratelimit schema (failure_mode, local_share,
// ban, the {requests, window} form, algorithm, buckets) have no field in the
// proto: a pushed config has their defaults, as a file without them.
package xds
