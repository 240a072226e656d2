package main

import (
	"errors"
	"os/user"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/flashgate/flashgate/daemon/keyadmin"
	"github.com/flashgate/flashgate/window/overrides"
)

func newLimitsCmd(e env) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "limits",
		Short: "Override a rule's limit or mode on every sidecar, for a while",
		Long: `limits sets, clears and lists the fleet's overrides in serve's Redis: a rule's
limit cut (or, with --allow-raise, raised), a rule switched between shadow
and enforce mode, or a limit run beside a rule in shadow (a dry run), on
every sidecar within a second, until the override's end (--for, at most
24h), when the file's rule is in force again by itself. Every set and clear
is kept in a history (the last 1000).

Each subcommand takes serve's Redis flags, --key-prefix and rules
(--config, or --rls-config and --domain for the ratelimit service;
FLASHGATE_* variables set them as for serve).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	cmd.AddCommand(newLimitsSetCmd(e), newLimitsClearCmd(e), newLimitsListCmd(e), newLimitsHistoryCmd(e))
	return cmd
}

// ruleFlags name the rule of an override, and who changes it why.
type ruleFlags struct {
	rule, domain, by, reason string
}

func (r *ruleFlags) addFlags(f *pflag.FlagSet) {
	f.StringVar(&r.rule, "rule", "", "the rule: its name in the descriptors file; with --domain, a ratelimit rule's name or descriptor path (key_value.subkey)")
	f.StringVar(&r.domain, "domain", "", "ratelimit service: the rule's domain in --rls-config")
	f.StringVar(&r.by, "by", "", "who makes the change, for the history (default: the OS user)")
	f.StringVar(&r.reason, "reason", "", "why, for the history")
}

// who is --by, else the OS user.
func (r *ruleFlags) who(e env) string {
	if r.by != "" {
		return r.by
	}
	if u, err := user.Current(); err == nil && u.Username != "" {
		return u.Username
	}
	if u, ok := e.lookupEnv("USER"); ok && u != "" {
		return u
	}
	return "unknown"
}

func newLimitsSetCmd(e env) *cobra.Command {
	var (
		o                 opsOptions
		rf                ruleFlags
		requests          int
		win, dur          time.Duration
		shadow, enforce   bool
		dryRun, allowRise bool
	)
	cmd := &cobra.Command{
		Use:   "set --rule R (--requests N [--window W] [--dry-run] | --shadow | --enforce) --for D",
		Short: "Override a rule's limit or mode on every sidecar until an end",
		Long: `set overrides a rule on every sidecar within a second, for --for (at most
24h); then the file's rule is in force again by itself. It replaces an
override of the rule in force. The override outlives reloads of the file
while the rule is in it, and a restart of Redis (the sidecars write back the
overrides they hold).

  --requests N [--window W]  the rule's limit becomes N per W (default: the
                             rule's window); never above the file's limit
                             unless --allow-raise
  --requests N --dry-run     N runs beside the rule, in shadow: nothing is
                             denied by it, and flashgate_override_dry_run_total
                             counts the requests N would have denied
  --shadow                   the rule denies nothing (needs --allow-raise:
                             it lifts the limit)
  --enforce                  a shadow rule denies

A rule unknown to serve's rules (--config, or --rls-config and --domain) is
refused.`,
		Example: `  flashgate limits set --redis-addr 127.0.0.1:6379 --config rules.yaml --rule coupon_per_uid --requests 2 --for 15m --reason "orders failing"
  flashgate limits set --redis-addr 127.0.0.1:6379 --config rules.yaml --rule coupon_per_uid --requests 2 --dry-run --for 10m`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ov := &overrides.Override{Requests: requests, Window: win, AllowRaise: allowRise, Reason: rf.reason}
			n := 0
			for _, m := range []struct {
				on   bool
				mode overrides.Mode
			}{{cmd.Flags().Changed("requests") && !dryRun, overrides.ModeLimit}, {dryRun, overrides.ModeDryRun}, {shadow, overrides.ModeShadow}, {enforce, overrides.ModeEnforce}} {
				if m.on {
					ov.Mode, n = m.mode, n+1
				}
			}
			switch {
			case n != 1:
				return errors.New("give one of --requests N, --requests N --dry-run, --shadow, --enforce")
			case (ov.Mode == overrides.ModeShadow || ov.Mode == overrides.ModeEnforce) && (requests != 0 || win != 0):
				return errors.New("--shadow and --enforce take no --requests or --window")
			case dryRun && !cmd.Flags().Changed("requests"):
				return errors.New("--dry-run needs --requests N")
			}
			ov.By = rf.who(e)
			return o.run(e, func(p *ops) (keyadmin.Table, error) {
				return p.SetOverride(cmd.Context(), rf.rule, rf.domain, ov, dur)
			})
		},
	}
	f := cmd.Flags()
	rf.addFlags(f)
	f.IntVar(&requests, "requests", 0, "the limit's requests per window")
	f.DurationVar(&win, "window", 0, "the limit's window (default: the rule's)")
	f.BoolVar(&dryRun, "dry-run", false, "run --requests beside the rule in shadow: count what it would deny, deny nothing")
	f.BoolVar(&shadow, "shadow", false, "put the rule in shadow mode: decide and count, deny nothing (needs --allow-raise)")
	f.BoolVar(&enforce, "enforce", false, "put a shadow rule in enforce mode")
	f.BoolVar(&allowRise, "allow-raise", false, "allow a limit above the file's, or shadow mode")
	f.DurationVar(&dur, "for", 0, "how long the override lasts (required; at most 24h), such as 15m")
	_ = cmd.MarkFlagRequired("for")
	o.register(cmd, e)
	return cmd
}

func newLimitsClearCmd(e env) *cobra.Command {
	var (
		o  opsOptions
		rf ruleFlags
	)
	cmd := &cobra.Command{
		Use:   "clear --rule R [--domain D] [--reason TEXT]",
		Short: "End a rule's override on every sidecar",
		Long: `clear ends a rule's override on every sidecar within a second: the file's
rule is in force again. Clearing a rule without an override is not an error
(the output says so) and is recorded in the history too.`,
		Example: `  flashgate limits clear --redis-addr 127.0.0.1:6379 --config rules.yaml --rule coupon_per_uid --reason "orders back"`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return o.run(e, func(p *ops) (keyadmin.Table, error) {
				return p.ClearOverride(cmd.Context(), rf.rule, rf.domain, rf.who(e), rf.reason)
			})
		},
	}
	rf.addFlags(cmd.Flags())
	o.register(cmd, e)
	return cmd
}

func newLimitsListCmd(e env) *cobra.Command {
	var o opsOptions
	cmd := &cobra.Command{
		Use:   "list [--json]",
		Short: "List the overrides in force",
		Long:  `list prints the overrides in force, soonest to end first.`,
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return o.run(e, func(p *ops) (keyadmin.Table, error) { return p.ListOverrides(cmd.Context()) })
		},
	}
	o.register(cmd, e)
	return cmd
}

func newLimitsHistoryCmd(e env) *cobra.Command {
	var (
		o opsOptions
		n int
	)
	cmd := &cobra.Command{
		Use:   "history [--last N] [--json]",
		Short: "Show the last sets and clears of overrides",
		Long: `history prints the overrides set and cleared, newest first: when, the
operation, who (the OS user or --by), the rule, the override and the reason.
Redis keeps the last 1000.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return o.run(e, func(p *ops) (keyadmin.Table, error) { return p.OverrideHistory(cmd.Context(), n) })
		},
	}
	cmd.Flags().IntVar(&n, "last", 50, "how many events to show (at most 1000)")
	o.register(cmd, e)
	return cmd
}
