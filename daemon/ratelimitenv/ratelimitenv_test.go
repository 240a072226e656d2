package ratelimitenv

import "testing"

// TestVarsRows checks each row of the table: a note, and no default for a
// variable never honoured.
func TestVarsRows(t *testing.T) {
	for _, r := range Vars() {
		if r.Note == "" {
			t.Errorf("%s: no note", r.Name)
		}
		if r.Flag == "" && r.value == nil && r.Default != "" {
			t.Errorf("%s: a default for a variable never honoured", r.Name)
		}
	}
}
