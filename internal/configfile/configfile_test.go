package configfile

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestError(t *testing.T) {
	tests := map[string]struct {
		err  *Error
		want string
	}{
		"at a position": {&Error{File: "f.yaml", Line: 3, Column: 7, Msg: "key is empty"}, "f.yaml:3:7: key is empty"},
		"whole file":    {&Error{File: "f.yaml", Msg: "anchor &a is defined twice"}, "f.yaml: anchor &a is defined twice"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if got := tc.err.Error(); got != tc.want {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
}

func TestJoin(t *testing.T) {
	errs := make([]*Error, MaxErrors+5)
	for i := range errs {
		errs[i] = &Error{File: "f", Line: i + 1, Column: 1, Msg: "m"}
	}
	tests := map[string]struct {
		n, want int    // errors given, errors listed (0: nil)
		more    string // the last line when some are not listed
	}{
		"none":      {0, 0, ""},
		"one":       {1, 1, ""},
		"several":   {3, 3, ""},
		"too many":  {MaxErrors + 5, MaxErrors, "and 5 more"},
		"the bound": {MaxErrors, MaxErrors, ""},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			err := Join(errs[:tc.n])
			var many Errors
			var one *Error
			switch {
			case tc.want == 0:
				if err != nil {
					t.Fatalf("Join: %v, want nil", err)
				}
			case tc.want == 1:
				if !errors.As(err, &one) || err != error(errs[0]) {
					t.Fatalf("Join: %v (%T), want the one *Error", err, err)
				}
			default:
				if !errors.As(err, &many) || len(many.List) != tc.want || many.Len() != tc.n {
					t.Fatalf("Join: %v (%T), want Errors listing %d of %d", err, err, tc.want, tc.n)
				}
				if !errors.As(err, &one) || one != errs[0] {
					t.Errorf("errors.As found %v, want the first error", one)
				}
				lines := strings.Split(err.Error(), "\n")
				wantLines := tc.want
				if tc.more != "" {
					wantLines++
				}
				if len(lines) != wantLines {
					t.Fatalf("%d lines, want %d", len(lines), wantLines)
				}
				if last := lines[len(lines)-1]; tc.more != "" && last != tc.more {
					t.Errorf("last line %q, want %q", last, tc.more)
				} else if tc.more == "" && last != errs[tc.want-1].Error() {
					t.Errorf("last line %q, want the last error", last)
				}
			}
		})
	}
}

func TestRead(t *testing.T) {
	dir := t.TempDir()
	big := filepath.Join(dir, "big.yaml")
	if err := os.WriteFile(big, []byte(strings.Repeat("x", 100)), 0o644); err != nil {
		t.Fatal(err)
	}
	data, err := Read(big, 10, "descriptors file")
	if err != nil || len(data) != 11 {
		t.Errorf("Read of 100 bytes bounded to 10: %d bytes, %v; want 11", len(data), err)
	}
	_, err = Read(filepath.Join(dir, "nope.yaml"), 10, "descriptors file")
	if err == nil || !strings.HasPrefix(err.Error(), "read descriptors file: ") || !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Read of a missing file: %v, want read descriptors file: …, wrapping os.ErrNotExist", err)
	}
}
