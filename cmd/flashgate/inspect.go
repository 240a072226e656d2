package main

import (
	"github.com/spf13/cobra"

	"github.com/flashgate/flashgate/daemon/keyadmin"
)

func newInspectCmd(e env) *cobra.Command {
	var (
		o opsOptions
		k keyOptions
	)
	cmd := &cobra.Command{
		Use:   "inspect --rule R --value V [--json]",
		Short: "Show one key's window and ban, as every sidecar sees them in Redis",
		Long: `inspect derives the limit key of a rule and a request value the way serve
does (same descriptors file, --key-prefix and Redis flags, which serve's
FLASHGATE_* variables set too) and reads it from Redis without changing it:
the requests its window counts against the limit, the oldest and newest
admission, when it admits again, whether the fleet bans it, and for a
leased rule the slots each sidecar holds in running leases.

A rule that keys several values takes one --value each, in the file's order.
For the ratelimit service name the key with --rls-config, --domain and one
--entry key=value per descriptor entry. An unknown rule, or a value the rule
never sees (not an IP address for a client-IP rule, a header value with a
comma, ...), is an error that says so, as is a missing --value.`,
		Example: `  flashgate inspect --redis-addr 127.0.0.1:6379 --rule coupon_per_uid --value alice
  flashgate inspect --rls-config /etc/ratelimit --domain edge --entry remote_address=10.0.0.7 --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return o.run(e, func(p *ops) (keyadmin.Table, error) { return p.Report(cmd.Context(), k.ref()) })
		},
	}
	k.addFlags(cmd.Flags())
	o.register(cmd, e)
	return cmd
}
