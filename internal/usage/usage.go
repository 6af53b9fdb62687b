// Package usage marks the errors that are the caller's to fix: a wrong flag
// or argument, input that cannot be used, settings the policy refuses. The
// libraries the commands call mark them where they find them; the CLI exits
// 2 for them (nothing was done) and 1 for every other failure.
package usage

import (
	"errors"
	"fmt"
)

// Error is an error in how a command was called or configured.
type Error struct{ err error }

func (e Error) Error() string { return e.err.Error() }

func (e Error) Unwrap() error { return e.err }

// Errorf is fmt.Errorf, marked as the caller's to fix.
func Errorf(format string, args ...any) error {
	return Error{fmt.Errorf(format, args...)}
}

// Wrap marks err as the caller's to fix; nil stays nil.
func Wrap(err error) error {
	if err == nil {
		return nil
	}
	return Error{err}
}

// Is reports whether err, or an error it wraps, is the caller's to fix.
func Is(err error) bool {
	var e Error
	return errors.As(err, &e)
}
