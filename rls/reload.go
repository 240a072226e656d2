package rls

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// DefaultPollInterval is how often WatchDir reads the directory.
const DefaultPollInterval = time.Second

// ErrNoDir is returned by Reload when the config did not come from a
// directory.
var ErrNoDir = errors.New("the ratelimit config did not come from a directory: nothing to reload")

// Reload reloads the config from the directory it came from (serve calls
// it on SIGHUP). A bad directory keeps the old config: the error is logged,
// counted as flashgate_rls_config_reloads_total{result="error"} and
// returned.
func (s *Server) Reload() error {
	dir := s.cfg.Load().Dir
	if dir == "" {
		return ErrNoDir
	}
	_, err := s.reloadFrom(dir, true)
	return err
}

// reloadFrom reads dir and installs it if its files changed (or force);
// it reports whether the config changed.
func (s *Server) reloadFrom(dir string, force bool) (bool, error) {
	s.reloadMu.Lock()
	defer s.reloadMu.Unlock()
	files, err := ReadDir(dir)
	if err != nil {
		if !force && err.Error() == s.badRead {
			return false, nil // reported when it first happened
		}
		s.badRead = err.Error()
		return false, s.reloadFailedLocked(dir, [32]byte{}, err)
	}
	s.badRead = ""
	sum := sumOf(files)
	if !force && (sum == s.cfg.Load().sum || sum == s.badSum) {
		return false, nil
	}
	cfg, err := ParseFiles(files)
	if err != nil {
		return false, s.reloadFailedLocked(dir, sum, err)
	}
	cfg.Dir = dir
	s.badSum = [32]byte{}
	s.install(cfg)
	s.metrics.reloads.WithLabelValues("success").Inc()
	return true, nil
}

func (s *Server) reloadFailedLocked(dir string, sum [32]byte, err error) error {
	s.badSum = sum
	s.metrics.reloads.WithLabelValues("error").Inc()
	s.log.Error("ratelimit config reload failed; the previous config stays in force", "dir", dir, "error", err)
	return fmt.Errorf("reload: %w", err)
}

// WatchDir reloads the config from dir whenever its files change, until
// ctx ends (then it returns nil). Every interval (0 means
// DefaultPollInterval) it reads the files (following symlinks, so
// Kubernetes ConfigMap swaps are seen) and compares their hash with the
// config in force; a bad directory is reported once per content, an
// unreadable one once per error.
func (s *Server) WatchDir(ctx context.Context, dir string, interval time.Duration) error {
	if interval <= 0 {
		interval = DefaultPollInterval
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		if changed, err := s.reloadFrom(dir, false); err == nil && changed {
			s.log.Info("ratelimit config reloaded", "dir", dir)
		}
	}
}
