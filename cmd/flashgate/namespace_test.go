package main

import (
	"testing"

	"github.com/flashgate/flashgate/extauthz"
	"github.com/flashgate/flashgate/rls"
)

// TestReservedRulePrefix: the descriptors file refuses the rule names of
// the RLS's key namespace, so that no ext_authz rule shares a domain's
// windows.
func TestReservedRulePrefix(t *testing.T) {
	if extauthz.ReservedRulePrefix != rls.KeyNamespace {
		t.Errorf("extauthz reserves %q, the RLS keys under %q", extauthz.ReservedRulePrefix, rls.KeyNamespace)
	}
}
