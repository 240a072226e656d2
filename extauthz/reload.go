package extauthz

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"
)

// DefaultPollInterval is how often WatchFile looks at the file.
const DefaultPollInterval = 500 * time.Millisecond

// ErrNoFile is returned by Reload when the rules did not come from a file
// (the built-in example).
var ErrNoFile = errors.New("the rules did not come from a file: nothing to reload")

// Reload reloads the rules from the file they were last loaded from (the
// CLI calls it on SIGHUP). A bad file keeps the old rules: the error
// (FILE:LINE:COL: sentence) is logged, counted as
// flashgate_config_reloads_total{result="error"} and returned. Reload is
// safe to call concurrently with checks and with itself.
func (s *Server) Reload() error {
	s.reloadMu.Lock()
	path := s.path
	s.reloadMu.Unlock()
	if path == "" {
		return ErrNoFile
	}
	_, err := s.reloadFrom(path, true)
	return err
}

// reloadFrom loads path and swaps the rules in if its content changed (or
// force). It reports whether the rules changed.
func (s *Server) reloadFrom(path string, force bool) (bool, error) {
	s.reloadMu.Lock()
	defer s.reloadMu.Unlock()
	data, err := readFile(path)
	if err != nil {
		return false, s.reloadFailedLocked(path, [32]byte{}, err)
	}
	sum := sha256.Sum256(data)
	same := sum == s.rules.Load().cfg.sum && path == s.path
	known := sum == s.badHash
	if same && !force || known && !force {
		return false, nil
	}
	cfg, err := ParseConfig(path, data)
	if err != nil {
		return false, s.reloadFailedLocked(path, sum, err)
	}
	cfg.path = path
	s.badHash = [32]byte{}
	s.installLocked(cfg)
	s.metrics.reloads.WithLabelValues("success").Inc()
	return true, nil
}

// unreadable counts and logs a failed reload of a descriptors file that
// cannot be read.
func (s *Server) unreadable(path string, err error) {
	s.reloadMu.Lock()
	defer s.reloadMu.Unlock()
	_ = s.reloadFailedLocked(path, [32]byte{}, fmt.Errorf("read descriptors file: %w", err))
}

func (s *Server) reloadFailedLocked(path string, sum [32]byte, err error) error {
	s.badHash = sum
	s.metrics.reloads.WithLabelValues("error").Inc()
	s.log.Error("descriptors file reload failed; the previous rules stay in force", "file", path, "error", err)
	return fmt.Errorf("reload: %w", err)
}

// WatchFile reloads the rules from path whenever its content changes, until
// ctx ends (then it returns nil). It polls every interval (0 means
// DefaultPollInterval): it resolves symlinks and stats the target, and
// re-reads and hashes the file when the target, size or modification time
// moved, so Kubernetes ConfigMap updates (an atomic swap of the ..data
// symlink) are seen. If path differs from the file the rules came from, the
// first poll loads it. A bad file is handled as in Reload; the same bad
// content is reported once. A file that cannot be read (vanished, a
// directory, a symlink loop) is a failed reload too, counted and logged
// once per error, and retried on every poll. A file is refused before it is
// parsed if it is beyond yamlguard's bounds, so no file holds the watcher
// for long.
func (s *Server) WatchFile(ctx context.Context, path string, interval time.Duration) error {
	if interval <= 0 {
		interval = DefaultPollInterval
	}
	type stamp struct {
		target  string
		size    int64
		modTime time.Time
	}
	var last stamp
	lastErr := ""
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		cur := stamp{}
		target, err := filepath.EvalSymlinks(path)
		if err == nil {
			var fi os.FileInfo
			if fi, err = os.Stat(target); err == nil {
				cur = stamp{target, fi.Size(), fi.ModTime()}
			}
		}
		switch {
		case err != nil:
			if msg := err.Error(); msg != lastErr {
				lastErr = msg
				s.unreadable(path, err)
			}
			last = stamp{}
		case cur != last:
			last, lastErr = cur, ""
			if changed, err := s.reloadFrom(path, false); err == nil && changed {
				s.log.Info("descriptors file reloaded", "file", path)
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}
