package keyadmin

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/flashgate/flashgate/descriptors"
	"github.com/flashgate/flashgate/window/overrides"
)

// SetOverride sets ov on every sidecar from now for dur, on the rule
// OverrideTarget finds for rule and domain, after checking it against the
// file's rule; it replaces an override of the rule in force.
func (a *Admin) SetOverride(ctx context.Context, rule, domain string, ov *overrides.Override, dur time.Duration) (OverrideRow, error) {
	s, err := a.Overrides()
	if err != nil {
		return OverrideRow{}, err
	}
	t, r, err := a.OverrideTarget(rule, domain)
	if err != nil {
		return OverrideRow{}, err
	}
	now := a.now().Truncate(time.Millisecond)
	ov.Target, ov.Set, ov.Until = t, now, now.Add(dur)
	if err := ov.Check(r, now); err != nil {
		return OverrideRow{}, fmt.Errorf("rule %s (%s): %w", t.Rule, r.Limit, err)
	}
	if err := s.Set(ctx, ov); err != nil {
		return OverrideRow{}, err
	}
	return newOverrideList([]*overrides.Override{ov}, now).Overrides[0], nil
}

// ClearOverride ends the override of the rule OverrideTarget finds for
// rule and domain on every sidecar, recording by and reason; a rule
// without one is no error. A rule no longer in the file is cleared when
// it still holds an override.
func (a *Admin) ClearOverride(ctx context.Context, rule, domain, by, reason string) (Cleared, error) {
	s, err := a.Overrides()
	if err != nil {
		return Cleared{}, err
	}
	t, _, err := a.OverrideTarget(rule, domain)
	if errors.Is(err, descriptors.ErrUnknownRule) {
		// A rule a reload removed may still hold a dormant override.
		if was, gerr := s.Get(ctx, t); gerr != nil || was == nil {
			return Cleared{}, err
		}
	} else if err != nil {
		return Cleared{}, err
	}
	was, err := s.Clear(ctx, t, by, reason)
	if err != nil {
		return Cleared{}, err
	}
	return Cleared{Target: t, Was: was}, nil
}

// ListOverrides returns the overrides in force, soonest to end first.
func (a *Admin) ListOverrides(ctx context.Context) (OverrideList, error) {
	s, err := a.Overrides()
	if err != nil {
		return OverrideList{}, err
	}
	list, err := s.List(ctx)
	if err != nil {
		return OverrideList{}, err
	}
	return newOverrideList(list, a.now()), nil
}

// OverrideHistory returns the last n sets and clears, newest first.
func (a *Admin) OverrideHistory(ctx context.Context, n int) (History, error) {
	s, err := a.Overrides()
	if err != nil {
		return History{}, err
	}
	evs, err := s.History(ctx, n)
	if err != nil {
		return History{}, err
	}
	return History{History: evs}, nil
}
