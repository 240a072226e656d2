package keyadmin

import (
	"context"
	"errors"
	"fmt"

	"github.com/flashgate/flashgate/daemon"
	"github.com/flashgate/flashgate/descriptors"
	"github.com/flashgate/flashgate/rls"
	"github.com/flashgate/flashgate/window/overrides"
	"github.com/flashgate/flashgate/window/redisstore"
)

// Overrides opens the fleet's overrides (flashgate limits) on the Admin's
// connection; an override's times are Redis's.
func (a *Admin) Overrides() (*redisstore.Overrides, error) {
	return redisstore.NewOverrides(a.client, a.opts.Keys)
}

// OverrideTarget finds the rule an override names in serve's rules: rule in
// the descriptors file, or with domain a rule (its name or descriptor path)
// of the ratelimit config. It returns the rule's target and its limit and
// mode as the file has them; an unknown or unlimited rule is refused.
func (a *Admin) OverrideTarget(rule, domain string) (overrides.Target, overrides.Rule, error) {
	if rule == "" {
		return overrides.Target{}, overrides.Rule{}, errors.New("--rule is missing: name a rule of the descriptors file (flashgate validate lists them), or with --domain a rule of the ratelimit config")
	}
	if domain == "" {
		cfg, err := daemon.LoadRules(a.opts.Config)
		if err != nil {
			return overrides.Target{}, overrides.Rule{}, err
		}
		r := cfg.Rule(rule)
		if r == nil {
			return overrides.Target{Domain: cfg.Domain, Rule: rule}, overrides.Rule{},
				a.UnknownRule(fmt.Errorf("%w %q: %s has no rule of that name", descriptors.ErrUnknownRule, rule, cfg.Name))
		}
		return overrides.Target{Domain: cfg.Domain, Rule: r.Name}, overrides.Rule{Limit: r.Limit, Shadow: r.Shadow}, nil
	}
	if a.opts.RLSConfig == "" {
		return overrides.Target{}, overrides.Rule{}, errors.New("--domain needs --rls-config, serve's ratelimit config directory")
	}
	cfg, err := rls.LoadDir(a.opts.RLSConfig)
	if err != nil {
		return overrides.Target{}, overrides.Rule{}, err
	}
	d := cfg.Domain(domain)
	if d == nil {
		return overrides.Target{}, overrides.Rule{}, fmt.Errorf("%w %q: the ratelimit config has no such domain", rls.ErrUnknownDomain, domain)
	}
	for _, r := range d.Rules() {
		if r.Path == rule || r.Name != "" && r.Name == rule {
			if r.Unlimited {
				return overrides.Target{}, overrides.Rule{}, fmt.Errorf("rule %s of domain %s is unlimited: it counts nothing to override", rule, domain)
			}
			if r.WindowLimit().Requests <= 0 {
				return overrides.Target{}, overrides.Rule{}, fmt.Errorf("rule %s of domain %s allows 0 requests: it refuses every request without counting, which an override does not change", rule, domain)
			}
			return overrides.Target{Domain: d.Name, Rule: r.Label()}, overrides.Rule{Limit: r.WindowLimit(), Shadow: r.Shadow}, nil
		}
	}
	return overrides.Target{Domain: d.Name, Rule: rule}, overrides.Rule{},
		fmt.Errorf("%w %q: domain %s has no rule of that name or descriptor path", descriptors.ErrUnknownRule, rule, domain)
}

// Override returns the override in force for t's rule, nil if none.
func (a *Admin) Override(ctx context.Context, t *Target) (*overrides.Override, error) {
	s, err := a.Overrides()
	if err != nil {
		return nil, err
	}
	domain := t.Domain
	if domain == "" {
		cfg, err := daemon.LoadRules(a.opts.Config)
		if err != nil {
			return nil, err
		}
		domain = cfg.Domain
	}
	return s.Get(ctx, overrides.Target{Domain: domain, Rule: t.Rule})
}
