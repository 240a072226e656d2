package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/flashgate/flashgate/daemon"
	"github.com/flashgate/flashgate/descriptors"
	"github.com/flashgate/flashgate/rls"
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

// keyNames is what a limit key tells of itself.
type keyNames struct {
	// Rule is the rule of the descriptors file the key is of; Domain the
	// ratelimit service's domain instead (whose keys do not name the rule).
	Rule   string `json:"rule,omitempty"`
	Domain string `json:"domain,omitempty"`
	Key    string `json:"key"`
	// Value is the request value, only when the key holds it verbatim
	// (short, of A-Z a-z 0-9 . _ -); a hashed value is never shown.
	Value string `json:"value,omitempty"`
}

// names reads key's rule or domain and verbatim value.
func (p *ops) names(key string) keyNames {
	seg, value, _ := splitKey(p.keys, key)
	n := keyNames{Rule: seg, Key: key, Value: value}
	// No rule of a descriptors file is named so (the prefix is reserved).
	if d, ok := strings.CutPrefix(seg, rls.KeyNamespace); ok {
		n.Rule, n.Domain = "", d
	}
	return n
}

// label is the rule column of a table.
func (n keyNames) label() string {
	if n.Domain != "" {
		return "domain " + n.Domain
	}
	return n.Rule
}

// banRow is one ban, as the bans commands print it (--json: this object).
type banRow struct {
	keyNames
	Until       time.Time `json:"until"`
	RemainingMS int64     `json:"remaining_ms"`
}

// row describes the ban of key until until, at now.
func (p *ops) row(key string, until, now time.Time) banRow {
	return banRow{keyNames: p.names(key), Until: until, RemainingMS: until.Sub(now).Milliseconds()}
}

func writeBanTable(w io.Writer, rows []banRow) error {
	if len(rows) == 0 {
		if _, err := fmt.Fprintln(w, "no bans"); err != nil {
			return fmt.Errorf("write: %w", err)
		}
		return nil
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "rule\tkey\tremaining\tuntil\tvalue")
	for _, r := range rows {
		value := r.Value
		if value == "" {
			value = "-"
		}
		remaining := roundFor(time.Duration(r.RemainingMS) * time.Millisecond).String()
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", r.label(), r.Key, remaining, r.Until.UTC().Format("2006-01-02T15:04:05.000Z"), value)
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("write: %w", err)
	}
	return nil
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
			return runBansList(cmd.Context(), e.stdout, &o, rule, domain)
		},
	}
	cmd.Flags().StringVar(&rule, "rule", "", "only the bans of this rule of the descriptors file")
	cmd.Flags().StringVar(&domain, "domain", "", "only the bans of this domain of the ratelimit config (--rls-config)")
	o.register(cmd, e)
	return cmd
}

func runBansList(ctx context.Context, w io.Writer, o *opsOptions, rule, domain string) error {
	p, err := openOps(o)
	if err != nil {
		return err
	}
	defer p.close()
	only, err := p.ruleSegment(rule, domain)
	if err != nil {
		return err
	}
	list, err := p.bans.List(ctx)
	if err != nil {
		return err
	}
	now := p.now()
	rows := []banRow{}
	for _, b := range list {
		if seg, _, _ := splitKey(p.keys, b.Key); only == "" || seg == only {
			rows = append(rows, p.row(b.Key, b.Until, now))
		}
	}
	if o.json {
		return writeJSON(w, struct {
			Bans []banRow `json:"bans"`
		}{rows})
	}
	return writeBanTable(w, rows)
}

// ruleSegment returns the rule part of the keys of rule (a rule of the
// descriptors file) or domain (of the ratelimit config), checked against
// the rules; "" for neither.
func (p *ops) ruleSegment(rule, domain string) (string, error) {
	var name string
	switch {
	case rule != "" && domain != "":
		return "", errors.New("--rule and --domain: give one")
	case rule != "":
		cfg, err := daemon.LoadRules(p.opts.config)
		if err != nil {
			return "", err
		}
		if cfg.Rule(rule) == nil {
			return "", p.unknownRule(fmt.Errorf("%w %q: %s has no rule of that name", descriptors.ErrUnknownRule, rule, cfg.Name))
		}
		name = rule
	case domain != "":
		if p.opts.rlsConfig == "" {
			return "", errors.New("--domain needs --rls-config, serve's ratelimit config directory")
		}
		cfg, err := rls.LoadDir(p.opts.rlsConfig)
		if err != nil {
			return "", err
		}
		if cfg.Domain(domain) == nil {
			return "", fmt.Errorf("%w %q: the ratelimit config has no such domain", rls.ErrUnknownDomain, domain)
		}
		// The ratelimit service keys a domain's windows under this rule.
		name = rls.KeyNamespace + domain
	default:
		return "", nil
	}
	// The rule part as keys write it (hashed if long), whatever the value.
	seg, _, _ := splitKey(p.keys, p.keys.Key(name, ""))
	return seg, nil
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
			return runBansAdd(cmd.Context(), e, &o, &k, dur)
		},
	}
	k.addFlags(cmd.Flags())
	cmd.Flags().DurationVar(&dur, "for", 0, "how long the ban lasts (required), such as 30m or 24h")
	_ = cmd.MarkFlagRequired("for")
	o.register(cmd, e)
	return cmd
}

func runBansAdd(ctx context.Context, e env, o *opsOptions, k *keyOptions, dur time.Duration) error {
	if err := bans.CheckDuration(dur); err != nil {
		return fmt.Errorf("--for %s: %w", dur, err)
	}
	p, t, err := openTarget(o, k, true)
	if err != nil {
		return err
	}
	defer p.close()
	if !t.Ban.Enabled() {
		return fmt.Errorf("rule %s has its penalty box off (%s): every sidecar would drop the ban at the key's first request; give the rule a ban (ban: {} takes serve's --ban-* flags) first", t.Rule, banSource(t))
	}
	if t.Shadow {
		fmt.Fprintf(e.stderr, "flashgate: rule %s is in shadow mode: the ban is recorded, but sidecars refuse nothing under this rule\n", t.Rule)
	}
	now := p.now()
	until := now.Add(dur).Truncate(time.Millisecond)
	if err := p.bans.Add(ctx, t.Key, until); err != nil {
		return err
	}
	r := p.row(t.Key, until, now)
	if o.json {
		return writeJSON(e.stdout, r)
	}
	return writeBanTable(e.stdout, []banRow{r})
}

// banSource says why t's penalty box is off, for errors.
func banSource(t *target) string {
	if t.Asks {
		return "its ban settings with serve's --ban-* flags"
	}
	return "it asks for no ban"
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
			return runBansLift(cmd.Context(), e.stdout, &o, &k, reset)
		},
	}
	k.addFlags(cmd.Flags())
	cmd.Flags().BoolVar(&reset, "reset-window", false, "also empty the key's window, so that it is admitted at once")
	o.register(cmd, e)
	return cmd
}

// liftResult is what bans lift prints (--json: this object).
type liftResult struct {
	keyNames
	// WasBanned: the key was banned (until WasUntil) when lifted.
	WasBanned   bool      `json:"was_banned"`
	WasUntil    time.Time `json:"was_until,omitzero"`
	ResetWindow bool      `json:"reset_window"`
}

func runBansLift(ctx context.Context, w io.Writer, o *opsOptions, k *keyOptions, reset bool) error {
	p, t, err := openTarget(o, k, false)
	if err != nil {
		return err
	}
	defer p.close()
	until, banned, err := p.bans.Get(ctx, t.Key)
	if err != nil {
		return err
	}
	if err := p.bans.Lift(ctx, t.Key, reset); err != nil {
		return err
	}
	r := liftResult{keyNames: p.names(t.Key), WasBanned: banned, ResetWindow: reset}
	if banned {
		r.WasUntil = until
	}
	if o.json {
		return writeJSON(w, r)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "rule\t%s\n", r.label())
	fmt.Fprintf(tw, "key\t%s\n", r.Key)
	switch {
	case banned:
		fmt.Fprintf(tw, "lifted\tyes: the ban that would have ended %s is over\n", stamp(until, p.now()))
	default:
		fmt.Fprintf(tw, "lifted\tnothing: the key was not banned\n")
	}
	if reset {
		fmt.Fprintf(tw, "window\temptied\n")
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("write: %w", err)
	}
	return nil
}
