package rls

import (
	"github.com/flashgate/flashgate/enforce"
)

// Reloader returns the [enforce.Reloader] of the config directory dir for
// s, watching dir and its config subdirectory. Build one per directory.
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
