package enforce

// A Reloader keeps one front-end's config in step with a file or a
// directory. It is told of changes by file-system notifications (inotify,
// through fsnotify) on the directories the config lives in, and it polls:
// every interval, and a short settle after a burst of notifications, it
// reads the config whole (the front-end's Read follows symlinks, so a
// Kubernetes ConfigMap's atomic ..data swap is seen like any write), hashes
// it, and parses and installs it only when the hash differs from the config
// in force. The poll catches what notifications miss (a file system
// without them, a watch lost with its directory, a symlink into a
// directory not watched); a directory that cannot be watched is tried again
// at every poll. The last good config stays in force whatever comes next: a
// bad config (refused by the front-end's parser, FILE:LINE:COL) or one that
// cannot be read (vanished, a directory, a symlink loop) is logged and
// counted once, and read again without a word until it changes. Reload,
// for SIGHUP, reads, reports and counts every time.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/fsnotify/fsnotify"
	"github.com/prometheus/client_golang/prometheus"
)

// DefaultPollInterval is how often a Reloader looks at its config without
// being told of a change.
const DefaultPollInterval = 500 * time.Millisecond

// NotifySettle is how long a Reloader waits after a file-system
// notification, for the writes of one change to end, before it reads the
// config: a burst of events is one read.
const NotifySettle = 50 * time.Millisecond

// ErrNoPath is returned by Reload when the config came from no file or
// directory (a built-in one).
var ErrNoPath = errors.New("the config did not come from a file or directory: nothing to reload")

// Source is a front-end's config as a [Reloader] reads and installs it; T
// is what Read returns (a file's bytes, a directory's files).
type Source[T any] struct {
	// What names the config in logs ("descriptors file"); PathKey is the
	// log key of its path ("file", "dir").
	What, PathKey string
	// Read reads the config at path and hashes it; an error means it
	// could not be read. Bounds on hostile content belong here or in
	// Install, so that no config holds the Reloader for long.
	Read func(path string) (content T, sum [32]byte, err error)
	// InForce returns the hash of the config in force, as Read computes it.
	InForce func() [32]byte
	// Install parses content read from path and puts it in force. On an
	// error the config in force stays.
	Install func(path string, content T) error
	// Dirs returns the directories whose changes may change the config
	// at path, for notifications; nil means path's own directory (path
	// itself when it is one).
	Dirs func(path string) []string
}

// Reloader reloads one front-end's config from a file or a directory (see
// the top of this file). Build it with [NewReloader]; its methods are safe
// for concurrent use, one reload running at a time.
type Reloader struct {
	path, what, key string
	reloads         *prometheus.CounterVec
	log             *slog.Logger
	inForce         func() [32]byte
	// read reads the config and returns its hash and the install of what
	// it read.
	read func() (sum [32]byte, install func() error, err error)
	// dirs are the directories to watch for notifications.
	dirs func() []string

	// mu is held for a whole reload (read, parse, install), so that SIGHUP
	// and the watch install their configs in order; it guards the fields
	// below.
	mu      sync.Mutex
	badSum  [32]byte // the last content Install refused
	badRead string   // the last error reading the config, "" if none
}

// NewReloader returns a Reloader of src at path for the front-end f: it
// counts into f's reloads counter (FrontMetrics.Reloads, by result) and
// logs on the core's logger. An empty path is a config from no file:
// Reload returns ErrNoPath and Watch only waits.
func NewReloader[T any](f *Front, path string, src Source[T]) *Reloader {
	dirs := func() []string { return cleanPaths(defaultDirs(path)) }
	if src.Dirs != nil {
		dirs = func() []string { return cleanPaths(src.Dirs(path)) }
	}
	return &Reloader{
		path:    path,
		dirs:    dirs,
		what:    src.What,
		key:     src.PathKey,
		reloads: f.Metrics().Reloads,
		log:     f.c.opts.Logger,
		inForce: src.InForce,
		read: func() ([32]byte, func() error, error) {
			content, sum, err := src.Read(path)
			return sum, func() error { return src.Install(path, content) }, err
		},
	}
}

// Path returns the file or directory the Reloader reads.
func (r *Reloader) Path() string { return r.path }

// Reload reads the config and installs it, changed or not (the CLI calls
// it on SIGHUP). A bad or unreadable config keeps the one in force: the
// error is logged, counted as result="error" and returned.
func (r *Reloader) Reload() error {
	if r.path == "" {
		return ErrNoPath
	}
	_, err := r.reload(true)
	return err
}

// Watch reloads the config until ctx ends, then returns nil: first at
// once, then a NotifySettle after the file-system notifications of a
// change, and every interval (0 means DefaultPollInterval) whatever the
// notifications say. It installs the config when it changed. A bad config
// is reported once per content, an unreadable one once per error.
func (r *Reloader) Watch(ctx context.Context, interval time.Duration) error {
	if r.path == "" {
		<-ctx.Done()
		return nil
	}
	if interval <= 0 {
		interval = DefaultPollInterval
	}
	n := r.notifier()
	defer n.close()
	t := time.NewTicker(interval)
	defer t.Stop()
	settle := time.NewTimer(0)
	<-settle.C
	for {
		if changed, err := r.reload(false); err == nil && changed {
			r.log.Info(r.what+" reloaded", r.key, r.path)
		}
	wait:
		for {
			select {
			case <-ctx.Done():
				return nil
			case <-t.C:
				n.rewatch()
				break wait
			case _, ok := <-n.events():
				if !ok { // the watcher is gone: the poll carries on alone
					n.w = nil
					continue
				}
				settle.Reset(NotifySettle)
			case _, ok := <-n.errors():
				if !ok {
					n.w = nil
					continue
				}
				// e.g. an overflowed event queue: read now.
				settle.Reset(NotifySettle)
			case <-settle.C:
				break wait
			}
		}
	}
}

// cleanPaths cleans every path, as the watcher's list holds them.
func cleanPaths(ps []string) []string {
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = filepath.Clean(p)
	}
	return out
}

// defaultDirs is Source.Dirs' default: path's directory, or path itself
// when it is a directory.
func defaultDirs(path string) []string {
	if fi, err := os.Stat(path); err == nil && fi.IsDir() {
		return []string{path}
	}
	return []string{filepath.Dir(path)}
}

// notifier forwards the file-system events of a Reloader's directories.
// Its zero value (notifications unavailable) never fires.
type notifier struct {
	r *Reloader
	w *fsnotify.Watcher // nil: none
	// warned: the failure to watch was logged (once per Watch).
	warned bool
}

// notifier starts watching r's directories; where that fails the poll
// alone finds changes (logged once).
func (r *Reloader) notifier() *notifier {
	n := &notifier{r: r}
	w, err := fsnotify.NewWatcher()
	if err != nil {
		r.log.Warn("file-system notifications unavailable: "+r.what+" changes are found by polling", r.key, r.path, "error", err)
		n.warned = true
		return n
	}
	n.w = w
	n.rewatch()
	return n
}

// rewatch adds the directories not watched yet (created since, or lost
// with a directory that was removed).
func (n *notifier) rewatch() {
	if n.w == nil {
		return
	}
	have := n.w.WatchList()
	for _, d := range n.r.dirs() {
		if slices.Contains(have, d) {
			continue
		}
		if err := n.w.Add(d); err != nil && !n.warned {
			n.warned = true
			n.r.log.Warn("cannot watch a directory for changes: "+n.r.what+" changes are found by polling until it can", "dir", d, "error", err)
		}
	}
}

// events returns the channel of events; nil (never ready) without a
// watcher.
func (n *notifier) events() <-chan fsnotify.Event {
	if n.w == nil {
		return nil
	}
	return n.w.Events
}

// errors returns the channel of the watcher's errors; nil without one.
func (n *notifier) errors() <-chan error {
	if n.w == nil {
		return nil
	}
	return n.w.Errors
}

func (n *notifier) close() {
	if n.w != nil {
		_ = n.w.Close()
	}
}

// reload reads the config and installs it if it changed (or force); it
// reports whether it installed it.
func (r *Reloader) reload(force bool) (bool, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	sum, install, err := r.read()
	if err != nil {
		if !force && err.Error() == r.badRead {
			return false, nil // reported when it first happened
		}
		r.badRead = err.Error()
		return false, r.failedLocked(err)
	}
	r.badRead = ""
	if !force && (sum == r.inForce() || sum == r.badSum) {
		return false, nil
	}
	if err := install(); err != nil {
		r.badSum = sum
		return false, r.failedLocked(err)
	}
	r.badSum = [32]byte{}
	r.reloads.WithLabelValues("success").Inc()
	return true, nil
}

func (r *Reloader) failedLocked(err error) error {
	r.reloads.WithLabelValues("error").Inc()
	r.log.Error(r.what+" reload failed; the previous config stays in force", r.key, r.path, "error", err)
	return fmt.Errorf("reload: %w", err)
}
