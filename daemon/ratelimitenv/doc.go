// Package ratelimitenv translates envoyproxy/ratelimit's environment
// variables (its src/settings/settings.go) into serve's flags, so that
// flashgate's image can replace ratelimit's. The mapping is one table,
// one row per variable and flag ([Vars]); docs/ratelimit.md's table is
// checked against it. The package reads no environment: the caller passes
// its lookup.
package ratelimitenv
