package main

// The operator commands (inspect, bans) share serve's Redis flags, key
// prefix, penalty box flags and rules, so that they name the keys the
// sidecars use: a key is derived from a rule and values by the front-end's
// own code (descriptors.Config.LimitKey, rls.Config.LimitKey), never built here.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	"github.com/redis/go-redis/v9"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/flashgate/flashgate/daemon"
	"github.com/flashgate/flashgate/descriptors"
	"github.com/flashgate/flashgate/rls"
	"github.com/flashgate/flashgate/window"
	"github.com/flashgate/flashgate/window/redisstore"
)

// opsTimeout is --redis-timeout's default for the operator commands: one
// command, not a check on a deadline.
const opsTimeout = 2 * time.Second

// opsOptions are the flags every operator command takes.
type opsOptions struct {
	redisOptions
	banOptions
	backend   string
	config    string
	rlsConfig string
	json      bool
}

// register adds the flags to cmd: serve's, which serve's environment
// variables (FLASHGATE_<FLAG>) set too, and --json.
func (o *opsOptions) register(cmd *cobra.Command, e env) {
	shared := pflag.NewFlagSet(cmd.Name(), pflag.ContinueOnError)
	o.redisOptions.addFlags(shared, opsTimeout)
	o.banOptions.addFlags(shared)
	shared.StringVar(&o.backend, "backend", "redis", "serve's backend: redis (memory keeps windows and bans inside each serve process, out of reach)")
	shared.StringVar(&o.config, "config", "", "serve's descriptors file (default: the built-in example)")
	shared.StringVar(&o.rlsConfig, "rls-config", "", "serve's ratelimit config directory, for --domain and --entry")
	cmd.Flags().AddFlagSet(shared)
	withEnvOf(cmd, shared, e)
	cmd.Flags().BoolVar(&o.json, "json", false, "print JSON instead of a table")
}

// keyOptions name one limit key: a rule of the descriptors file and its
// values, or a domain of the ratelimit config and a descriptor's entries.
type keyOptions struct {
	rule    string
	values  []string
	domain  string
	entries []string
}

func (k *keyOptions) addFlags(f *pflag.FlagSet) {
	f.StringVar(&k.rule, "rule", "", "rule of the descriptors file")
	f.StringArrayVar(&k.values, "value", nil, "the request value the rule keys (repeat for a rule that keys several, in the file's order)")
	f.StringVar(&k.domain, "domain", "", "ratelimit service: the domain of --rls-config (instead of --rule)")
	f.StringArrayVar(&k.entries, "entry", nil, "ratelimit service: a descriptor entry key=value (repeat, in order)")
}

// ops is an operator command's connection to serve's Redis and rules.
type ops struct {
	opts   *opsOptions
	keys   window.Keys
	ban    window.Ban // the server's penalty box
	client redis.UniversalClient
	bans   *redisstore.FleetBans
	now    func() time.Time
}

// openOps validates o and connects to Redis (lazily: the first command
// dials). The caller closes it.
func openOps(o *opsOptions) (*ops, error) {
	switch o.backend {
	case "redis":
	case "memory":
		return nil, errors.New("--backend memory: each serve process keeps its windows and bans in its own memory, out of this command's reach; inspect and bans work on the redis backend (--backend redis --redis-addr ...)")
	default:
		return nil, fmt.Errorf("--backend %q: want redis", o.backend)
	}
	if len(o.redisAddrs) == 0 {
		return nil, errors.New("--redis-addr is missing: give serve's Redis (flag or FLASHGATE_REDIS_ADDR)")
	}
	if o.redisTimeout <= 0 {
		return nil, fmt.Errorf("--redis-timeout %s: must be positive", o.redisTimeout)
	}
	keys, err := o.keys()
	if err != nil {
		return nil, err
	}
	ban, err := o.banOptions.parse()
	if err != nil {
		return nil, err
	}
	// go-redis logs a failed dial through its one package-level logger
	// (it has no per-client one) before the call returns the error, which
	// the command reports itself, once: discard its lines. An operator
	// command is the whole process, so nothing else's logs are lost.
	redis.SetLogger(quietRedis{})
	cc := o.clientConfig(o.redisTimeout)
	cc.PoolSize, cc.MinIdleConns, cc.Name = 2, -1, redisstore.ClientName+"-ops"
	client, err := redisstore.NewClient(cc)
	if err != nil {
		return nil, fmt.Errorf("redis: %w", err)
	}
	bans, err := redisstore.NewFleetBans(client, keys, redisstore.FleetBansOptions{})
	if err != nil {
		client.Close()
		return nil, err
	}
	return &ops{opts: o, keys: keys, ban: ban, client: client, bans: bans, now: time.Now}, nil
}

func (p *ops) close() { p.client.Close() }

// quietRedis is a go-redis logger that writes nothing.
type quietRedis struct{}

func (quietRedis) Printf(context.Context, string, ...any) {}

// openTarget opens the connection of o and resolves the key k names (see
// resolve); the caller closes the connection.
func openTarget(o *opsOptions, k *keyOptions, needValue bool) (*ops, *target, error) {
	p, err := openOps(o)
	if err != nil {
		return nil, nil, err
	}
	t, err := p.resolve(k, needValue)
	if err != nil {
		p.close()
		return nil, nil, err
	}
	return p, t, nil
}

// target is the limit key an operator named, with its rule's settings.
type target struct {
	// Rule is the rule's name (ratelimit service: its name or path);
	// Domain the domain of the ratelimit config, "" for the descriptors
	// file.
	Rule, Domain string
	Key          string
	Limit        window.Limit
	// Ban is the penalty box in force for the rule: the one it asks for
	// (Asks), its unset fields taken from serve's --ban-* flags; the zero
	// Ban when it asks for none (its keys are never banned).
	Ban    window.Ban
	Asks   bool
	Shadow bool
}

// resolve derives the key k names through the front-end's own code.
// needValue: a rule whose key holds no request value is refused too (a
// ban there would refuse every request the rule applies to).
func (p *ops) resolve(k *keyOptions, needValue bool) (*target, error) {
	switch {
	case k.domain != "" || len(k.entries) > 0:
		if k.rule != "" || len(k.values) > 0 {
			return nil, errors.New("--rule/--value name a rule of the descriptors file, --domain/--entry a descriptor of the ratelimit service: give one pair")
		}
		return p.resolveRLS(k)
	case k.rule == "":
		return nil, errors.New("--rule is missing: name a rule of the descriptors file (flashgate validate lists them), or --domain and --entry for the ratelimit service")
	}
	cfg, err := daemon.LoadRules(p.opts.config)
	if err != nil {
		return nil, err
	}
	if r := cfg.Rule(k.rule); r != nil && len(k.values) == 0 && len(r.Keyed()) > 0 {
		return nil, fmt.Errorf("--value is missing: rule %s keys %d request value(s); give one --value each, in the file's order", r.Name, len(r.Keyed()))
	}
	key, r, err := cfg.LimitKey(p.keys, k.rule, k.values...)
	if err != nil {
		return nil, p.unknownRule(err)
	}
	if needValue && len(k.values) == 0 {
		return nil, fmt.Errorf("rule %s keys no request value: its one window counts every request it applies to, and a ban of it would refuse them all", r.Name)
	}
	t := &target{Rule: r.Name, Key: key, Limit: r.Limit, Shadow: r.Shadow}
	p.setBan(t, r.PenaltyBox())
	return t, nil
}

// unknownRule adds to err, when it is about an unknown rule of the
// built-in example, that the descriptors file was not given.
func (p *ops) unknownRule(err error) error {
	if errors.Is(err, descriptors.ErrUnknownRule) && p.opts.config == "" {
		return fmt.Errorf("%w (no --config given: give serve's descriptors file)", err)
	}
	return err
}

func (p *ops) resolveRLS(k *keyOptions) (*target, error) {
	if p.opts.rlsConfig == "" {
		return nil, errors.New("--domain and --entry need --rls-config, serve's ratelimit config directory")
	}
	if k.domain == "" || len(k.entries) == 0 {
		return nil, errors.New("the ratelimit service needs --domain and at least one --entry key=value")
	}
	cfg, err := rls.LoadDir(p.opts.rlsConfig)
	if err != nil {
		return nil, err
	}
	desc, err := parseEntries(k.entries)
	if err != nil {
		return nil, err
	}
	key, r, err := cfg.LimitKey(p.keys, k.domain, desc)
	if err != nil {
		return nil, err
	}
	t := &target{Rule: r.Label(), Domain: k.domain, Key: key, Limit: r.WindowLimit(), Shadow: r.Shadow}
	p.setBan(t, r.PenaltyBox())
	return t, nil
}

// setBan sets t's penalty box from the one its rule asks for (nil: none),
// completed by serve's, as the Guard does.
func (p *ops) setBan(t *target, asked *window.Ban) {
	if asked != nil {
		t.Ban, t.Asks = asked.Or(p.ban), true
	}
}

// parseEntries reads --entry key=value flags, in order, as one
// descriptor.
func parseEntries(entries []string) (*ratelimitv3.RateLimitDescriptor, error) {
	desc := &ratelimitv3.RateLimitDescriptor{}
	for _, e := range entries {
		key, value, ok := strings.Cut(e, "=")
		if !ok || key == "" {
			return nil, fmt.Errorf("--entry %q: want key=value", e)
		}
		desc.Entries = append(desc.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: key, Value: value})
	}
	return desc, nil
}

// splitKey reads a limit key of keys back into its rule segment and, when
// the key holds it verbatim, its value ("" when it holds a hash). A value
// is never recovered from a hash: it is shown only when building the key
// from the two segments gives the key back.
func splitKey(keys window.Keys, key string) (rule, value string, ok bool) {
	head := keys.Prefix() + ":{"
	rest, found := strings.CutPrefix(key, head)
	if !found || len(rest) < len("xxxxxx}:") || rest[6:8] != "}:" {
		return "", "", false
	}
	rule, value, found = strings.Cut(rest[8:], ":")
	if !found {
		return "", "", false
	}
	if strings.HasPrefix(value, "#") || keys.Key(rule, value) != key {
		value = ""
	}
	return rule, value, true
}

// writeJSON prints v as one indented JSON document.
func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return fmt.Errorf("write: %w", err)
	}
	return nil
}

// describeLimit writes a limit for people: "5 per 1s", bucketed or not.
func describeLimit(l window.Limit) string {
	s := fmt.Sprintf("%d per %s", l.Requests, l.Window)
	if l.Buckets > 0 {
		s += fmt.Sprintf(" (%d buckets)", l.Buckets)
	}
	return s
}

// describeBan writes a penalty box for people.
func describeBan(b window.Ban) string {
	if !b.Enabled() {
		return "off"
	}
	return fmt.Sprintf("%d denials in %s → %s", b.Threshold, b.Window, b.Duration)
}

// penaltyBox is a rule's penalty box as --json writes it.
type penaltyBox struct {
	// On: the rule's keys are banned after Threshold denials within
	// WindowMS, for DurationMS; off, they are never banned.
	On         bool  `json:"on"`
	Threshold  int   `json:"threshold,omitempty"`
	WindowMS   int64 `json:"window_ms,omitempty"`
	DurationMS int64 `json:"duration_ms,omitempty"`
}

func newPenaltyBox(b window.Ban) penaltyBox {
	if !b.Enabled() {
		return penaltyBox{}
	}
	return penaltyBox{On: true, Threshold: b.Threshold, WindowMS: b.Window.Milliseconds(), DurationMS: b.Duration.Milliseconds()}
}

// stamp writes t for a table: UTC to the millisecond, and how far from now.
func stamp(t, now time.Time) string {
	if t.IsZero() {
		return "-"
	}
	d := roundFor(t.Sub(now))
	rel := "now"
	switch {
	case d > 0:
		rel = "in " + d.String()
	case d < 0:
		rel = (-d).String() + " ago"
	}
	return t.UTC().Format("2006-01-02T15:04:05.000Z") + " (" + rel + ")"
}

// roundFor rounds d for people: to the second from a minute up, else to
// the millisecond.
func roundFor(d time.Duration) time.Duration {
	if d >= time.Minute || d <= -time.Minute {
		return d.Round(time.Second)
	}
	return d.Round(time.Millisecond)
}
