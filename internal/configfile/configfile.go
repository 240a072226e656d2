package configfile

import (
	"fmt"
	"io"
	"os"
	"strings"
)

// Error is an error in one config file, at a position when known.
type Error struct {
	File         string
	Line, Column int // 0 when the error concerns the whole file
	// Msg is a plain sentence, without position.
	Msg string
}

// Error returns "FILE:LINE:COL: message", or "FILE: message" without a
// position.
func (e *Error) Error() string {
	if e.Line == 0 {
		return fmt.Sprintf("%s: %s", e.File, e.Msg)
	}
	return fmt.Sprintf("%s:%d:%d: %s", e.File, e.Line, e.Column, e.Msg)
}

// MaxErrors is the most errors a load lists; the others are counted.
const MaxErrors = 20

// Errors is every error found in a load's files, by file and in file
// order: the first MaxErrors listed, and how many more there are. A load
// returns it when there is more than one.
type Errors struct {
	List []*Error
	// More is how many errors were found beyond List.
	More int
}

// Error returns the errors, one "FILE:LINE:COL: message" a line, and
// "and N more" on a last line when some are not listed.
func (e Errors) Error() string {
	lines := make([]string, len(e.List), len(e.List)+1)
	for i, ce := range e.List {
		lines[i] = ce.Error()
	}
	if e.More > 0 {
		lines = append(lines, fmt.Sprintf("and %d more", e.More))
	}
	return strings.Join(lines, "\n")
}

// Len returns how many errors were found, listed or not.
func (e Errors) Len() int { return len(e.List) + e.More }

// Unwrap returns the listed errors, for errors.As and errors.Is.
func (e Errors) Unwrap() []error {
	out := make([]error, len(e.List))
	for i, ce := range e.List {
		out[i] = ce
	}
	return out
}

// Join returns nil for no errors, the one error, or Errors listing the
// first MaxErrors of errs and counting the rest.
func Join(errs []*Error) error {
	switch {
	case len(errs) == 0:
		return nil
	case len(errs) == 1:
		return errs[0]
	case len(errs) > MaxErrors:
		return Errors{List: errs[:MaxErrors:MaxErrors], More: len(errs) - MaxErrors}
	}
	return Errors{List: errs}
}

// Read reads at most max+1 bytes of the file at path, enough for a loader
// to tell a file larger than max; what names the file in errors
// ("descriptors file").
func Read(path string, max int64, what string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", what, err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, max+1))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", what, err)
	}
	return data, nil
}
