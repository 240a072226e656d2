package enforce

// A Reloader keeps one front-end's config in step with a file or a
// directory: it reads the config on file-system notifications and on a
// poll (which catches what notifications miss), and installs it only when
// its hash changed. The last good config stays in force; a bad or
// unreadable one is logged and counted once per content or error.

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

// DefaultPollInterval is how often a Reloader polls its config.
const DefaultPollInterval = 500 * time.Millisecond

// NotifySettle is how long a Reloader waits after a notification before
// it reads: a burst of events is one read.
const NotifySettle = 50 * time.Millisecond

// ErrNoPath is Reload's error for a config from no file or directory.
var ErrNoPath = errors.New("the config did not come from a file or directory: nothing to reload")

// Source is a front-end's config as a [Reloader] reads and installs it.
type Source[T any] struct {
	// What names the config in logs; PathKey is the log key of its path.
	What, PathKey string
	// Read reads the config at path and hashes it. Bounds on hostile
	// content belong here or in Install.
	Read func(path string) (content T, sum [32]byte, err error)
	// InForce returns the hash of the config in force.
	InForce func() [32]byte
	// Install parses content and puts it in force; on error the old stays.
	Install func(path string, content T) error
	// Dirs returns the directories to watch for path; nil means path's
	// own directory.
	Dirs func(path string) []string
}

// Reloader reloads one front-end's config (see the top of this file).
// Safe for concurrent use, one reload at a time.
type Reloader struct {
	path, what, key string
	reloads         *prometheus.CounterVec
	log             *slog.Logger
	inForce         func() [32]byte
	read            func() (sum [32]byte, install func() error, err error)
	dirs            func() []string

	// mu is held for a whole reload, so SIGHUP and the watch install in
	// order; it guards the fields below.
	mu      sync.Mutex
	badSum  [32]byte // the last content Install refused
	badRead string   // the last error reading the config, "" if none
}

// NewReloader returns a Reloader of src at path, counting into f's reloads
// counter. An empty path: Reload returns ErrNoPath and Watch only waits.
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

// Reload reads and installs the config, changed or not (SIGHUP). A bad or
// unreadable config keeps the one in force; the error is counted and
// returned.
func (r *Reloader) Reload() error {
	if r.path == "" {
		return ErrNoPath
	}
	_, err := r.reload(true)
	return err
}

// Watch reloads the config when it changes until ctx ends, then returns
// nil; interval 0 means DefaultPollInterval.
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
				settle.Reset(NotifySettle)
			case <-settle.C:
				break wait
			}
		}
	}
}

func cleanPaths(ps []string) []string {
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = filepath.Clean(p)
	}
	return out
}

// defaultDirs is Source.Dirs' default.
func defaultDirs(path string) []string {
	if fi, err := os.Stat(path); err == nil && fi.IsDir() {
		return []string{path}
	}
	return []string{filepath.Dir(path)}
}

// notifier forwards the file-system events of a Reloader's directories;
// its zero value never fires.
type notifier struct {
	r      *Reloader
	w      *fsnotify.Watcher // nil: none
	warned bool
}

// notifier starts watching r's directories; a failure is logged once.
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

// rewatch adds the directories not watched yet.
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

// events returns the channel of events; nil without a watcher.
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

// reload reads the config and installs it if it changed (or force),
// reporting whether it did.
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
