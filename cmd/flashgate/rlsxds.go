package main

import (
	"fmt"
	"net"
	"time"

	"github.com/spf13/pflag"

	"github.com/flashgate/flashgate/daemon"
	"github.com/flashgate/flashgate/rls/xds"
)

// rlsXDSOptions are serve's flags of the RLS config from an xDS management
// server (ratelimit's CONFIG_TYPE=GRPC_XDS_SOTW and CONFIG_GRPC_XDS_*).
type rlsXDSOptions struct {
	rlsXDSServer       string
	rlsXDSNodeID       string
	rlsXDSNodeMetadata string
	rlsXDSRetry        time.Duration
	rlsXDSTLS          bool
	rlsXDSTLSCert      string
	rlsXDSTLSKey       string
	rlsXDSTLSCA        string
	rlsXDSTLSSAN       string
	rlsXDSForceStart   bool
}

func (o *rlsXDSOptions) addFlags(f *pflag.FlagSet) {
	f.StringVar(&o.rlsXDSServer, "rls-xds-server", "", "xDS management server, HOST:PORT: serve envoy.service.ratelimit.v3.RateLimitService on --grpc-addr with the ratelimit configs (RateLimitConfig resources, state of the world) it pushes (ratelimit's CONFIG_GRPC_XDS_SERVER_URL); not with --rls-config")
	f.StringVar(&o.rlsXDSNodeID, "rls-xds-node-id", xds.DefaultNodeID, "xDS node id (ratelimit's CONFIG_GRPC_XDS_NODE_ID)")
	f.StringVar(&o.rlsXDSNodeMetadata, "rls-xds-node-metadata", "", "xDS node metadata, KEY=VALUE,... (ratelimit's CONFIG_GRPC_XDS_NODE_METADATA)")
	f.DurationVar(&o.rlsXDSRetry, "rls-xds-retry-interval", xds.DefaultRetryInterval, "pause before a new xDS stream after one failed (ratelimit's CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL)")
	f.BoolVar(&o.rlsXDSTLS, "rls-xds-tls", false, "connect to the xDS server over TLS (ratelimit's CONFIG_GRPC_XDS_SERVER_USE_TLS)")
	f.StringVar(&o.rlsXDSTLSCert, "rls-xds-tls-cert", "", "client certificate (PEM) for an mTLS xDS server (ratelimit's CONFIG_GRPC_XDS_CLIENT_TLS_CERT)")
	f.StringVar(&o.rlsXDSTLSKey, "rls-xds-tls-key", "", "key (PEM) of --rls-xds-tls-cert (ratelimit's CONFIG_GRPC_XDS_CLIENT_TLS_KEY)")
	f.StringVar(&o.rlsXDSTLSCA, "rls-xds-tls-ca", "", "CA certificates (PEM) the xDS server's certificate is verified against (default: the system's; ratelimit's CONFIG_GRPC_XDS_SERVER_TLS_CACERT)")
	f.StringVar(&o.rlsXDSTLSSAN, "rls-xds-tls-server-name", "", "name the xDS server's certificate is verified for (default: the host of --rls-xds-server; ratelimit's CONFIG_GRPC_XDS_SERVER_TLS_SAN)")
	f.BoolVar(&o.rlsXDSForceStart, "rls-xds-force-start", false, "turn ready before the xDS server pushed a first config (answering OK for every domain until then); by default readiness waits for it (ratelimit's FORCE_START_WITHOUT_INITIAL_CONFIG)")
}

// validate checks the xDS flags together with --rls-config (rlsConfig).
func (o *rlsXDSOptions) validate(rlsConfig string, changed func(string) bool) error {
	if o.rlsXDSServer == "" {
		for _, name := range []string{"rls-xds-node-id", "rls-xds-node-metadata", "rls-xds-retry-interval", "rls-xds-tls",
			"rls-xds-tls-cert", "rls-xds-tls-key", "rls-xds-tls-ca", "rls-xds-tls-server-name", "rls-xds-force-start"} {
			if changed(name) {
				return fmt.Errorf("--%s needs --rls-xds-server", name)
			}
		}
		return nil
	}
	if rlsConfig != "" {
		return fmt.Errorf("--rls-config and --rls-xds-server exclude each other: the ratelimit config comes from a directory or from xDS")
	}
	if _, _, err := net.SplitHostPort(o.rlsXDSServer); err != nil {
		return fmt.Errorf("--rls-xds-server %q: want HOST:PORT", o.rlsXDSServer)
	}
	if o.rlsXDSNodeID == "" {
		return fmt.Errorf("--rls-xds-node-id is empty")
	}
	if o.rlsXDSRetry <= 0 {
		return fmt.Errorf("--rls-xds-retry-interval %s: must be positive", o.rlsXDSRetry)
	}
	if !o.rlsXDSTLS {
		for _, name := range []string{"rls-xds-tls-cert", "rls-xds-tls-key", "rls-xds-tls-ca", "rls-xds-tls-server-name"} {
			if changed(name) {
				return fmt.Errorf("--%s needs --rls-xds-tls", name)
			}
		}
	}
	if (o.rlsXDSTLSCert == "") != (o.rlsXDSTLSKey == "") {
		return fmt.Errorf("--rls-xds-tls-cert and --rls-xds-tls-key go together")
	}
	return nil
}

// options are the xDS client's daemon options.
func (o *rlsXDSOptions) options() daemon.XDSOptions {
	return daemon.XDSOptions{
		Server: o.rlsXDSServer, NodeID: o.rlsXDSNodeID, NodeMetadata: o.rlsXDSNodeMetadata, RetryInterval: o.rlsXDSRetry,
		TLS: o.rlsXDSTLS, Files: daemon.TLSFiles{Cert: o.rlsXDSTLSCert, Key: o.rlsXDSTLSKey, CA: o.rlsXDSTLSCA},
		ServerName: o.rlsXDSTLSSAN, ForceStart: o.rlsXDSForceStart,
	}
}
