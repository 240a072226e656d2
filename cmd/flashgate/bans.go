package main

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/flashgate/flashgate/daemon/keyadmin"
	"github.com/flashgate/flashgate/window/bans"
)

func newBansCmd(e env) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "bans",
		Short: "List, add and lift the fleet's bans in Redis",
		Long: `bans works on the fleet's ban list in serve's Redis: the keys every sidecar
refuses without asking Redis, until their ban ends. A ban added or lifted
here reaches every sidecar within a second.

Each subcommand takes serve's Redis flags, --key-prefix and descriptors
file (FLASHGATE_* variables set them as for serve), so that it derives the
key serve uses for a rule and value.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	cmd.AddCommand(newBansListCmd(e), newBansAddCmd(e), newBansLiftCmd(e))
	return cmd
}

func newBansListCmd(e env) *cobra.Command {
	var (
		o      opsOptions
		rule   string
		domain string
	)
	cmd := &cobra.Command{
		Use:   "list [--rule R] [--json]",
		Short: "List the bans in force",
		Long: `list prints the bans in force, soonest to end first: the rule, the key, the
time remaining, and the request value where the key holds it verbatim (a
long or unusual value is hashed in the key and never shown). --rule keeps
the bans of one rule of the descriptors file, --domain those of one domain of
the ratelimit service (--rls-config).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return o.run(e, func(p *ops) (keyadmin.Table, error) {
				bans, err := p.Bans(cmd.Context(), rule, domain)
				return keyadmin.BanList{Bans: bans}, err
			})
		},
	}
	cmd.Flags().StringVar(&rule, "rule", "", "only the bans of this rule of the descriptors file")
	cmd.Flags().StringVar(&domain, "domain", "", "only the bans of this domain of the ratelimit config (--rls-config)")
	o.register(cmd, e)
	return cmd
}

func newBansAddCmd(e env) *cobra.Command {
	var (
		o   opsOptions
		k   keyOptions
		dur time.Duration
	)
	cmd := &cobra.Command{
		Use:   "add --rule R --value V --for D [--json]",
		Short: "Ban a key on every sidecar for a while",
		Long: `add bans the key of a rule and a request value on every sidecar for --for:
each refuses it from its local cache, without asking Redis, within a second.
An existing ban of the key is replaced (shortened too).

The rule must ask for a penalty box (ban: in the descriptors file or the
ratelimit config): a sidecar drops a ban of a rule without one at its first
hit. A rule that keys no request value cannot be banned this way. --for is
at most 8760h (one year).`,
		Example: `  flashgate bans add --redis-addr 127.0.0.1:6379 --rule coupon_per_uid --value mallory --for 1h`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := bans.CheckDuration(dur); err != nil {
				return fmt.Errorf("--for %s: %w", dur, err)
			}
			return o.run(e, func(p *ops) (keyadmin.Table, error) {
				r, t, err := p.AddBan(cmd.Context(), k.ref(), dur)
				if err == nil && t.Shadow {
					fmt.Fprintf(e.stderr, "flashgate: rule %s is in shadow mode: the ban is recorded, but sidecars refuse nothing under this rule\n", t.Rule)
				}
				return r, err
			})
		},
	}
	k.addFlags(cmd.Flags())
	cmd.Flags().DurationVar(&dur, "for", 0, "how long the ban lasts (required), such as 30m or 24h")
	_ = cmd.MarkFlagRequired("for")
	o.register(cmd, e)
	return cmd
}

func newBansLiftCmd(e env) *cobra.Command {
	var (
		o     opsOptions
		k     keyOptions
		reset bool
	)
	cmd := &cobra.Command{
		Use:   "lift --rule R --value V [--reset-window] [--json]",
		Short: "Lift a key's ban on every sidecar",
		Long: `lift ends the ban of the key of a rule and a request value on every sidecar
within a second, and forgets its denials toward the next ban. The key is
admitted again when its window has room; with --reset-window its window is
emptied too, so it is admitted at once. Lifting a key that is not banned is
not an error (the output says it was not banned).`,
		Example: `  flashgate bans lift --redis-addr 127.0.0.1:6379 --rule coupon_per_uid --value alice --reset-window`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return o.run(e, func(p *ops) (keyadmin.Table, error) { return p.LiftBan(cmd.Context(), k.ref(), reset) })
		},
	}
	k.addFlags(cmd.Flags())
	cmd.Flags().BoolVar(&reset, "reset-window", false, "also empty the key's window, so that it is admitted at once")
	o.register(cmd, e)
	return cmd
}
