package keyadmin

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/flashgate/flashgate/daemon"
	"github.com/flashgate/flashgate/descriptors"
	"github.com/flashgate/flashgate/internal/checkreq"
	"github.com/flashgate/flashgate/rls"
	"github.com/flashgate/flashgate/window"
	"github.com/flashgate/flashgate/window/redisstore"
)

// Options say where serve's keys and rules are: serve's settings.
type Options struct {
	// Backend is serve's; only daemon.BackendRedis's keys are in reach.
	Backend string
	// Redis is serve's Redis; its Timeout bounds each call.
	Redis redisstore.ClientConfig
	Keys  window.Keys
	// Ban is serve's penalty box, which completes the one a rule asks for.
	Ban window.Ban
	// Config and RLSConfig are serve's descriptors file ("" : the example)
	// and ratelimit config directory.
	Config, RLSConfig string
}

// Admin is a connection to serve's Redis and rules. It is not safe for
// concurrent use; Close releases it.
type Admin struct {
	opts   Options
	client redis.UniversalClient
	bans   *redisstore.FleetBans
	now    func() time.Time
}

// Client returns the Admin's Redis client, for the stores an operator
// command opens beside it (the overrides); Close closes it.
func (a *Admin) Client() redis.UniversalClient { return a.client }

// Keys returns serve's key namespace the Admin names keys in.
func (a *Admin) Keys() window.Keys { return a.opts.Keys }

// Open returns an Admin of o; the first call dials. Its errors name
// serve's flags.
func Open(o Options) (*Admin, error) {
	switch o.Backend {
	case daemon.BackendRedis:
	case daemon.BackendMemory:
		return nil, errors.New("--backend memory: each serve process keeps its windows and bans in its own memory, out of this command's reach; inspect and bans work on the redis backend (--backend redis --redis-addr ...)")
	default:
		return nil, fmt.Errorf("--backend %q: want redis", o.Backend)
	}
	if len(o.Redis.Addrs) == 0 {
		return nil, errors.New("--redis-addr is missing: give serve's Redis (flag or FLASHGATE_REDIS_ADDR)")
	}
	if o.Redis.Timeout <= 0 {
		return nil, fmt.Errorf("--redis-timeout %s: must be positive", o.Redis.Timeout)
	}
	if err := daemon.CheckBan(o.Ban); err != nil {
		return nil, err
	}
	o.Redis.PoolSize, o.Redis.MinIdleConns, o.Redis.Name = 2, -1, redisstore.ClientName+"-ops"
	client, err := redisstore.NewClient(o.Redis)
	if err != nil {
		return nil, fmt.Errorf("redis: %w", err)
	}
	fb, err := redisstore.NewFleetBans(client, o.Keys, redisstore.FleetBansOptions{})
	if err != nil {
		client.Close()
		return nil, err
	}
	return &Admin{opts: o, client: client, bans: fb, now: time.Now}, nil
}

// Close releases the connection.
func (a *Admin) Close() { a.client.Close() }

// Ref names one limit key: Rule of the descriptors file and its Values,
// or Domain of the ratelimit config and a descriptor's Entries (key=value).
type Ref struct {
	Rule    string
	Values  []string
	Domain  string
	Entries []string
}

// Target is the limit key a [Ref] names, with its rule's settings.
type Target struct {
	// Rule is the rule's name (ratelimit service: its name or path);
	// Domain the ratelimit config's domain, "" for the descriptors file.
	Rule, Domain string
	Key          string
	Limit        window.Limit
	// Ban is the penalty box in force for the rule: the one it asks for
	// (Asks), its unset fields taken from serve's; the zero Ban when it
	// asks for none (its keys are never banned).
	Ban    window.Ban
	Asks   bool
	Shadow bool
}

// Resolve derives the key ref names through the front-end's own code.
// needValue: a rule whose key holds no request value is refused too (a
// ban there would refuse every request the rule applies to).
func (a *Admin) Resolve(ref Ref, needValue bool) (*Target, error) {
	switch {
	case ref.Domain != "" || len(ref.Entries) > 0:
		if ref.Rule != "" || len(ref.Values) > 0 {
			return nil, errors.New("--rule/--value name a rule of the descriptors file, --domain/--entry a descriptor of the ratelimit service: give one pair")
		}
		return a.resolveRLS(ref)
	case ref.Rule == "":
		return nil, errors.New("--rule is missing: name a rule of the descriptors file (flashgate validate lists them), or --domain and --entry for the ratelimit service")
	}
	cfg, err := daemon.LoadRules(a.opts.Config)
	if err != nil {
		return nil, err
	}
	if r := cfg.Rule(ref.Rule); r != nil && len(ref.Values) == 0 && len(r.Keyed()) > 0 {
		return nil, fmt.Errorf("--value is missing: rule %s keys %d request value(s); give one --value each, in the file's order", r.Name, len(r.Keyed()))
	}
	key, r, err := cfg.LimitKey(a.opts.Keys, ref.Rule, ref.Values...)
	if err != nil {
		return nil, a.UnknownRule(err)
	}
	if needValue && len(ref.Values) == 0 {
		return nil, fmt.Errorf("rule %s keys no request value: its one window counts every request it applies to, and a ban of it would refuse them all", r.Name)
	}
	t := &Target{Rule: r.Name, Key: key, Limit: r.Limit, Shadow: r.Shadow}
	a.setBan(t, r.PenaltyBox())
	return t, nil
}

// UnknownRule adds to err, when it is about an unknown rule of the
// built-in example, that the descriptors file was not given.
func (a *Admin) UnknownRule(err error) error {
	if errors.Is(err, descriptors.ErrUnknownRule) && a.opts.Config == "" {
		return fmt.Errorf("%w (no --config given: give serve's descriptors file)", err)
	}
	return err
}

func (a *Admin) resolveRLS(ref Ref) (*Target, error) {
	if a.opts.RLSConfig == "" {
		return nil, errors.New("--domain and --entry need --rls-config, serve's ratelimit config directory")
	}
	if ref.Domain == "" || len(ref.Entries) == 0 {
		return nil, errors.New("the ratelimit service needs --domain and at least one --entry key=value")
	}
	cfg, err := rls.LoadDir(a.opts.RLSConfig)
	if err != nil {
		return nil, err
	}
	desc, err := checkreq.ParseEntries(ref.Entries)
	if err != nil {
		return nil, err
	}
	key, r, err := cfg.LimitKey(a.opts.Keys, ref.Domain, desc)
	if err != nil {
		return nil, err
	}
	t := &Target{Rule: r.Label(), Domain: ref.Domain, Key: key, Limit: r.WindowLimit(), Shadow: r.Shadow}
	a.setBan(t, r.PenaltyBox())
	return t, nil
}

// setBan sets t's penalty box from the one its rule asks for (nil: none),
// completed by serve's, as the Guard does.
func (a *Admin) setBan(t *Target, asked *window.Ban) {
	if asked != nil {
		t.Ban, t.Asks = asked.Or(a.opts.Ban), true
	}
}

// RuleSegment returns the rule part of the keys of rule (a rule of the
// descriptors file) or domain (of the ratelimit config), checked against
// the rules; "" for neither.
func (a *Admin) RuleSegment(rule, domain string) (string, error) {
	var name string
	switch {
	case rule != "" && domain != "":
		return "", errors.New("--rule and --domain: give one")
	case rule != "":
		cfg, err := daemon.LoadRules(a.opts.Config)
		if err != nil {
			return "", err
		}
		if cfg.Rule(rule) == nil {
			return "", a.UnknownRule(fmt.Errorf("%w %q: %s has no rule of that name", descriptors.ErrUnknownRule, rule, cfg.Name))
		}
		name = rule
	case domain != "":
		if a.opts.RLSConfig == "" {
			return "", errors.New("--domain needs --rls-config, serve's ratelimit config directory")
		}
		cfg, err := rls.LoadDir(a.opts.RLSConfig)
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
	seg, _, _ := SplitKey(a.opts.Keys, a.opts.Keys.Key(name, ""))
	return seg, nil
}

// SplitKey reads a limit key of keys back into its rule segment and, when
// the key holds it verbatim, its value ("" when it holds a hash). A value
// is never recovered from a hash: it is shown only when building the key
// from the two segments gives the key back.
func SplitKey(keys window.Keys, key string) (rule, value string, ok bool) {
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

// KeyNames is what a limit key tells of itself.
type KeyNames struct {
	// Rule is the key's rule of the descriptors file, or Domain its RLS domain.
	Rule   string `json:"rule,omitempty"`
	Domain string `json:"domain,omitempty"`
	Key    string `json:"key"`
	// Value is the request value, only when the key holds it verbatim
	// (short, of A-Z a-z 0-9 . _ -); a hashed value is never shown.
	Value string `json:"value,omitempty"`
}

// Names reads key's rule or domain and verbatim value.
func (a *Admin) Names(key string) KeyNames {
	seg, value, _ := SplitKey(a.opts.Keys, key)
	n := KeyNames{Rule: seg, Key: key, Value: value}
	// No rule of a descriptors file is named so (the prefix is reserved).
	if d, ok := strings.CutPrefix(seg, rls.KeyNamespace); ok {
		n.Rule, n.Domain = "", d
	}
	return n
}

// Ban is one ban of the fleet.
type Ban struct {
	KeyNames
	Until       time.Time `json:"until"`
	RemainingMS int64     `json:"remaining_ms"`
}

func (a *Admin) ban(key string, until, now time.Time) Ban {
	return Ban{KeyNames: a.Names(key), Until: until, RemainingMS: until.Sub(now).Milliseconds()}
}

// Bans lists the bans in force, soonest to end first: all, or those of
// rule (of the descriptors file) or domain (of the ratelimit config).
func (a *Admin) Bans(ctx context.Context, rule, domain string) ([]Ban, error) {
	only, err := a.RuleSegment(rule, domain)
	if err != nil {
		return nil, err
	}
	list, err := a.bans.List(ctx)
	if err != nil {
		return nil, err
	}
	now := a.now()
	rows := []Ban{}
	for _, b := range list {
		if seg, _, _ := SplitKey(a.opts.Keys, b.Key); only == "" || seg == only {
			rows = append(rows, a.ban(b.Key, b.Until, now))
		}
	}
	return rows, nil
}

// AddBan bans the key ref names on every sidecar for dur (as
// bans.CheckDuration allows), replacing a ban of it. The rule must keep a
// request value in its key and have its penalty box on. It returns the
// ban and the key's target.
func (a *Admin) AddBan(ctx context.Context, ref Ref, dur time.Duration) (Ban, *Target, error) {
	t, err := a.Resolve(ref, true)
	if err != nil {
		return Ban{}, nil, err
	}
	if !t.Ban.Enabled() {
		why := "it asks for no ban"
		if t.Asks {
			why = "its ban settings with serve's --ban-* flags"
		}
		return Ban{}, nil, fmt.Errorf("rule %s has its penalty box off (%s): every sidecar would drop the ban at the key's first request; give the rule a ban (ban: {} takes serve's --ban-* flags) first", t.Rule, why)
	}
	now := a.now()
	until := now.Add(dur).Truncate(time.Millisecond)
	if err := a.bans.Add(ctx, t.Key, until); err != nil {
		return Ban{}, nil, err
	}
	return a.ban(t.Key, until, now), t, nil
}

// Lift is what lifting a ban did.
type Lift struct {
	KeyNames
	// WasBanned: the key was banned (until WasUntil) when lifted.
	WasBanned   bool      `json:"was_banned"`
	WasUntil    time.Time `json:"was_until,omitzero"`
	ResetWindow bool      `json:"reset_window"`
}

// LiftBan ends the ban of the key ref names on every sidecar and forgets
// its denials; reset empties its window too. A key not banned is no error.
func (a *Admin) LiftBan(ctx context.Context, ref Ref, reset bool) (Lift, error) {
	t, err := a.Resolve(ref, false)
	if err != nil {
		return Lift{}, err
	}
	until, banned, err := a.bans.Get(ctx, t.Key)
	if err != nil {
		return Lift{}, err
	}
	if err := a.bans.Lift(ctx, t.Key, reset); err != nil {
		return Lift{}, err
	}
	r := Lift{KeyNames: a.Names(t.Key), WasBanned: banned, ResetWindow: reset}
	if banned {
		r.WasUntil = until
	}
	return r, nil
}

// PenaltyBox is a rule's penalty box.
type PenaltyBox struct {
	// On: the rule's keys are banned after Threshold denials within
	// WindowMS, for DurationMS; off, they are never banned.
	On         bool  `json:"on"`
	Threshold  int   `json:"threshold,omitempty"`
	WindowMS   int64 `json:"window_ms,omitempty"`
	DurationMS int64 `json:"duration_ms,omitempty"`
}

func newPenaltyBox(b window.Ban) PenaltyBox {
	if !b.Enabled() {
		return PenaltyBox{}
	}
	return PenaltyBox{On: true, Threshold: b.Threshold, WindowMS: b.Window.Milliseconds(), DurationMS: b.Duration.Milliseconds()}
}

// Inspection is one key's window and ban, read at one instant.
type Inspection struct {
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
	AdmitsAt    time.Time  `json:"admits_at"`
	Full        bool       `json:"full"`
	Banned      bool       `json:"banned"`
	BannedUntil time.Time  `json:"banned_until,omitzero"`
	PenaltyBox  PenaltyBox `json:"penalty_box"`
	Shadow      bool       `json:"shadow,omitempty"`
	// Held are a leased key's slots that sidecars hold: reserved in
	// running leases, one entry per sidecar, the one holding most first.
	Held []Held `json:"held,omitempty"`
	// Now is Redis's time of the reading.
	Now time.Time `json:"now"`
	// Target is the key's rule, for people.
	Target *Target `json:"-"`
}

// Inspect reads the window and ban of the key ref names, changing nothing.
func (a *Admin) Inspect(ctx context.Context, ref Ref) (Inspection, error) {
	t, err := a.Resolve(ref, false)
	if err != nil {
		return Inspection{}, err
	}
	st, err := redisstore.Inspect(ctx, a.client, t.Key, t.Limit)
	if err != nil {
		return Inspection{}, err
	}
	until, banned, err := a.bans.Get(ctx, t.Key)
	if err != nil {
		return Inspection{}, err
	}
	r := Inspection{
		Rule: t.Rule, Domain: t.Domain, Key: t.Key, Limit: t.Limit.Requests,
		WindowMS: t.Limit.Window.Milliseconds(), Buckets: t.Limit.Buckets,
		Count: st.Count, Oldest: st.Oldest, Newest: st.Newest, AdmitsAt: st.AdmitsAt, Full: st.Full(),
		Banned: banned, PenaltyBox: newPenaltyBox(t.Ban), Shadow: t.Shadow, Now: st.Now, Target: t,
	}
	if banned {
		r.BannedUntil = until
	}
	r.Held = heldBySidecar(st.Leases)
	return r, nil
}

// Held is the slots one sidecar holds in a leased key's window: counted
// in it until their leases end (used or not), then until they leave it.
type Held struct {
	// Sidecar is the reserving sidecar's store id (16 hex digits).
	Sidecar string `json:"sidecar"`
	Slots   int    `json:"slots"`
	// Ends are its leases' ends, the slots' scores, earliest first.
	Ends []time.Time `json:"ends"`
}

// heldBySidecar groups leases (earliest end first) by sidecar.
func heldBySidecar(leases []redisstore.LeaseSlots) []Held {
	var out []Held
	at := map[string]int{}
	for _, l := range leases {
		i, ok := at[l.Sidecar]
		if !ok {
			i = len(out)
			at[l.Sidecar] = i
			out = append(out, Held{Sidecar: l.Sidecar})
		}
		out[i].Slots += l.Slots
		out[i].Ends = append(out[i].Ends, l.Ends)
	}
	slices.SortStableFunc(out, func(a, b Held) int { return cmp.Compare(b.Slots, a.Slots) })
	return out
}
