package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/flashgate/flashgate/daemon/keyadmin"
	"github.com/flashgate/flashgate/window/overrides"
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
			return runInspect(cmd.Context(), e.stdout, &o, &k)
		},
	}
	k.addFlags(cmd.Flags())
	o.register(cmd, e)
	return cmd
}

// inspection is what inspect prints (--json: this object): the key's
// window and ban, and its rule's override in force (flashgate limits).
type inspection struct {
	keyadmin.Inspection
	Override *overrides.Override `json:"override,omitempty"`
}

func runInspect(ctx context.Context, w io.Writer, o *opsOptions, k *keyOptions) error {
	p, err := openOps(o)
	if err != nil {
		return err
	}
	defer p.close()
	in, err := p.Inspect(ctx, k.ref())
	if err != nil {
		return err
	}
	r := inspection{Inspection: in}
	if r.Override, err = overrideOf(ctx, p, in.Target); err != nil {
		return err
	}
	if o.json {
		return writeJSON(w, r)
	}
	return writeInspectTable(w, &r)
}

func writeInspectTable(w io.Writer, r *inspection) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	rule := r.Rule
	if r.Domain != "" {
		rule = fmt.Sprintf("%s (domain %s)", r.Rule, r.Domain)
	}
	if r.Shadow {
		rule += " (shadow: never denies)"
	}
	admits := "now"
	if r.Full {
		admits = stamp(r.AdmitsAt, r.Now)
	}
	banned := "no"
	if r.Banned {
		banned = "until " + stamp(r.BannedUntil, r.Now)
	}
	fmt.Fprintf(tw, "rule\t%s\n", rule)
	fmt.Fprintf(tw, "key\t%s\n", r.Key)
	fmt.Fprintf(tw, "count\t%d of %s\n", r.Count, describeLimit(r.Target.Limit))
	fmt.Fprintf(tw, "oldest\t%s\n", stamp(r.Oldest, r.Now))
	fmt.Fprintf(tw, "newest\t%s\n", stamp(r.Newest, r.Now))
	fmt.Fprintf(tw, "admits\t%s\n", admits)
	fmt.Fprintf(tw, "banned\t%s\n", banned)
	fmt.Fprintf(tw, "penalty box\t%s\n", describeBan(r.Target.Ban))
	fmt.Fprintf(tw, "override\t%s\n", describeOverride(r.Override, r.Now))
	for _, h := range r.Held {
		ends := make([]string, len(h.Ends))
		for i, e := range h.Ends {
			ends[i] = stamp(e, r.Now)
		}
		fmt.Fprintf(tw, "held\t%d slots by sidecar %s, leases end %s\n", h.Slots, h.Sidecar, strings.Join(ends, ", "))
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("write: %w", err)
	}
	return nil
}
