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

// MaxErrors is the most errors a load reports.
const MaxErrors = 20

// Errors is every error found in a load's files, by file and in file
// order (at most MaxErrors); a load returns it when there is more than one.
type Errors []*Error

// Error returns the errors, one "FILE:LINE:COL: message" a line.
func (e Errors) Error() string {
	lines := make([]string, len(e))
	for i, ce := range e {
		lines[i] = ce.Error()
	}
	return strings.Join(lines, "\n")
}

// Unwrap returns the errors, for errors.As and errors.Is.
func (e Errors) Unwrap() []error {
	out := make([]error, len(e))
	for i, ce := range e {
		out[i] = ce
	}
	return out
}

// Join returns nil for no errors, the one error, or Errors holding the
// first MaxErrors of errs.
func Join(errs []*Error) error {
	switch {
	case len(errs) == 0:
		return nil
	case len(errs) == 1:
		return errs[0]
	case len(errs) > MaxErrors:
		return Errors(errs[:MaxErrors])
	}
	return Errors(errs)
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
