package main

import (
	"testing"

	"github.com/flashgate/flashgate/descriptors"
	"github.com/flashgate/flashgate/rls"
)

// TestReservedRulePrefix: the descriptors file refuses the rule names of
// the RLS's key namespace, so that no ext_authz rule shares a domain's
// windows.
func TestReservedRulePrefix(t *testing.T) {
	if descriptors.ReservedRulePrefix != rls.KeyNamespace {
		t.Errorf("the descriptors file reserves %q, the RLS keys under %q", descriptors.ReservedRulePrefix, rls.KeyNamespace)
	}
}
