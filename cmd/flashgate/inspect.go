package main

import (
	"context"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/flashgate/flashgate/window"
	"github.com/flashgate/flashgate/window/overrides"
	"github.com/flashgate/flashgate/window/redisstore"
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
admission, when it admits again, and whether the fleet bans it.

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

// inspectResult is what inspect prints (--json: this object).
type inspectResult struct {
	Rule   string `json:"rule"`
	Domain string `json:"domain,omitempty"`
	Key    string `json:"key"`
	Limit  int    `json:"limit"`
	// WindowMS is the window's length; Buckets its sub-windows (0: exact).
	WindowMS int64 `json:"window_ms"`
	Buckets  int   `json:"buckets,omitempty"`
	// Count is what the next check counts before its own request.
	Count  int       `json:"count"`
	Oldest time.Time `json:"oldest,omitzero"`
	Newest time.Time `json:"newest,omitzero"`
	// AdmitsAt is when one more request fits (Now when it fits now).
	AdmitsAt time.Time `json:"admits_at"`
	Full     bool      `json:"full"`
	// Banned: the fleet bans the key until BannedUntil.
	Banned      bool      `json:"banned"`
	BannedUntil time.Time `json:"banned_until,omitzero"`
	// PenaltyBox is the rule's penalty box in force.
	PenaltyBox penaltyBox `json:"penalty_box"`
	Shadow     bool       `json:"shadow,omitempty"`
	// Override is the rule's override in force (flashgate limits), if any.
	Override *overrides.Override `json:"override,omitempty"`
	// Now is Redis's time of the reading.
	Now time.Time `json:"now"`

	lim window.Limit
	ban window.Ban
}

func runInspect(ctx context.Context, w io.Writer, o *opsOptions, k *keyOptions) error {
	p, t, err := openTarget(o, k, false)
	if err != nil {
		return err
	}
	defer p.close()
	st, err := redisstore.Inspect(ctx, p.client, t.Key, t.Limit)
	if err != nil {
		return err
	}
	until, banned, err := p.bans.Get(ctx, t.Key)
	if err != nil {
		return err
	}
	r := inspectResult{
		Rule: t.Rule, Domain: t.Domain, Key: t.Key, Limit: t.Limit.Requests,
		WindowMS: t.Limit.Window.Milliseconds(), Buckets: t.Limit.Buckets,
		Count: st.Count, Oldest: st.Oldest, Newest: st.Newest, AdmitsAt: st.AdmitsAt, Full: st.Full(),
		Banned: banned, PenaltyBox: newPenaltyBox(t.Ban), Shadow: t.Shadow, Now: st.Now, lim: t.Limit, ban: t.Ban,
	}
	if banned {
		r.BannedUntil = until
	}
	if r.Override, err = overrideOf(ctx, p, t); err != nil {
		return err
	}
	if o.json {
		return writeJSON(w, r)
	}
	return r.writeTable(w)
}

func (r *inspectResult) writeTable(w io.Writer) error {
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
	fmt.Fprintf(tw, "count\t%d of %s\n", r.Count, describeLimit(r.lim))
	fmt.Fprintf(tw, "oldest\t%s\n", stamp(r.Oldest, r.Now))
	fmt.Fprintf(tw, "newest\t%s\n", stamp(r.Newest, r.Now))
	fmt.Fprintf(tw, "admits\t%s\n", admits)
	fmt.Fprintf(tw, "banned\t%s\n", banned)
	fmt.Fprintf(tw, "penalty box\t%s\n", describeBan(r.ban))
	fmt.Fprintf(tw, "override\t%s\n", describeOverride(r.Override, r.Now))
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("write: %w", err)
	}
	return nil
}
