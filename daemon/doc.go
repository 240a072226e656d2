// Package daemon builds and runs one flashgate process from one Options
// value: the limiter stack (memory, or Redis under budget, breaker,
// fallback and guard, with the fleet's heartbeat and bans), the enforcement
// core, the front-ends (ext_authz, the ratelimit service from a directory
// or an xDS server, the HTTP front-end, ratelimit's /json side), the gRPC
// TLS reloader, the log limit and the host that serves them.
//
//	d, err := daemon.New(opts)   // listens; health NOT_SERVING
//	go onSIGHUP(d.Reload)        // the caller owns the process's signals
//	err = d.Serve(ctx)           // until ctx ends; then drains and closes
//
// New acquires and Close releases, last acquired first; a failed New has
// released what it acquired. Serve starts every goroutine the process runs
// (warm-up, heartbeat, ban sync, file watches, xDS) and returns once each
// has: when ctx ends, health turns NOT_SERVING, the listeners drain within
// Options.DrainTimeout, the background work stops, then the backend's
// clients close and the held log lines are written.
//
// The package reads no flags and no environment and never exits; its
// errors and log lines name the settings by serve's flags, as the docs do.
package daemon
