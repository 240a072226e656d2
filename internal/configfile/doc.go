// Package configfile holds what both config formats' loaders share about
// a file, apart from its schema: its errors, each a plain sentence at
// FILE:LINE:COL ([Error]), several of them at once ([Errors], at most
// [MaxErrors]), and a read bounded to the largest size a loader accepts
// ([Read]). The front-ends name the error types as their own
// (descriptors.ConfigError, rls.ConfigError); neither imports the other.
package configfile
