package main

import (
	"github.com/spf13/pflag"

	"github.com/flashgate/flashgate/daemon"
	"github.com/flashgate/flashgate/rls/xds"
)

// addXDSFlags adds serve's flags of the RLS config from an xDS management
// server (ratelimit's CONFIG_TYPE=GRPC_XDS_SOTW and CONFIG_GRPC_XDS_*) to f,
// set into o.
func addXDSFlags(f *pflag.FlagSet, o *daemon.XDSOptions) {
	f.StringVar(&o.Server, "rls-xds-server", "", "xDS management server, HOST:PORT: serve envoy.service.ratelimit.v3.RateLimitService on --grpc-addr with the ratelimit configs (RateLimitConfig resources, state of the world) it pushes (ratelimit's CONFIG_GRPC_XDS_SERVER_URL); not with --rls-config")
	f.StringVar(&o.NodeID, "rls-xds-node-id", xds.DefaultNodeID, "xDS node id (ratelimit's CONFIG_GRPC_XDS_NODE_ID)")
	f.StringVar(&o.NodeMetadata, "rls-xds-node-metadata", "", "xDS node metadata, KEY=VALUE,... (ratelimit's CONFIG_GRPC_XDS_NODE_METADATA)")
	f.DurationVar(&o.RetryInterval, "rls-xds-retry-interval", xds.DefaultRetryInterval, "pause before a new xDS stream after one failed (ratelimit's CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL)")
	f.BoolVar(&o.TLS, "rls-xds-tls", false, "connect to the xDS server over TLS (ratelimit's CONFIG_GRPC_XDS_SERVER_USE_TLS)")
	f.StringVar(&o.Files.Cert, "rls-xds-tls-cert", "", "client certificate (PEM) for an mTLS xDS server (ratelimit's CONFIG_GRPC_XDS_CLIENT_TLS_CERT)")
	f.StringVar(&o.Files.Key, "rls-xds-tls-key", "", "key (PEM) of --rls-xds-tls-cert (ratelimit's CONFIG_GRPC_XDS_CLIENT_TLS_KEY)")
	f.StringVar(&o.Files.CA, "rls-xds-tls-ca", "", "CA certificates (PEM) the xDS server's certificate is verified against (default: the system's; ratelimit's CONFIG_GRPC_XDS_SERVER_TLS_CACERT)")
	f.StringVar(&o.ServerName, "rls-xds-tls-server-name", "", "name the xDS server's certificate is verified for (default: the host of --rls-xds-server; ratelimit's CONFIG_GRPC_XDS_SERVER_TLS_SAN)")
	f.BoolVar(&o.ForceStart, "rls-xds-force-start", false, "turn ready before the xDS server pushed a first config (answering OK for every domain until then); by default readiness waits for it (ratelimit's FORCE_START_WITHOUT_INITIAL_CONFIG)")
}
