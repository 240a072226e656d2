package rls

import (
	"github.com/flashgate/flashgate/enforce"
)

// Reloader returns the reloader of the config directory dir for s
// (enforce.Reloader: on file-system notifications of dir and of its
// config subdirectory, polled, ConfigMap symlink swaps included, and on
// SIGHUP; a bad directory keeps the config in force, its FILE:LINE:COL
// error logged and counted in flashgate_rls_config_reloads_total). Files
// beyond MaxFiles, MaxFileSize or yamlguard's bounds are refused before
// they are parsed. Build one per directory: a Reloader's watch and its
// Reload share what they have reported.
func (s *Server) Reloader(dir string) *enforce.Reloader {
	return enforce.NewReloader(s.core, dir, enforce.Source[[]File]{
		What:    "ratelimit config",
		PathKey: "dir",
		Read: func(dir string) ([]File, [32]byte, error) {
			files, err := ReadDir(dir)
			return files, sumOf(files), err
		},
		InForce: func() [32]byte { return s.Config().sum },
		Install: func(dir string, files []File) error {
			cfg, err := ParseFiles(files)
			if err != nil {
				return err
			}
			cfg.Dir = dir
			return s.SetConfig(cfg)
		},
		Dirs: func(dir string) []string {
			if sub := ConfigDir(dir); sub != dir {
				return []string{dir, sub}
			}
			return []string{dir}
		},
	})
}
