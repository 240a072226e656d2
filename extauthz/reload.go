package extauthz

import (
	"crypto/sha256"

	"github.com/flashgate/flashgate/descriptors"
	"github.com/flashgate/flashgate/enforce"
)

// Reloader returns the reloader of the descriptors file at path for s
// (enforce.Reloader: on file-system notifications of its directory,
// polled, ConfigMap symlink swaps included, and on
// SIGHUP; a bad file keeps the rules in force, its FILE:LINE:COL error
// logged and counted in flashgate_config_reloads_total{result="error"}).
// A file beyond descriptors.MaxFileSize or yamlguard's bounds is refused before it is
// parsed. An empty path (the built-in example) has nothing to reload.
// Build one per path: a Reloader's watch and its Reload share what they
// have reported.
func (s *Server) Reloader(path string) *enforce.Reloader {
	return enforce.NewReloader(s.core, path, enforce.Source[[]byte]{
		What:    "descriptors file",
		PathKey: "file",
		Read: func(path string) ([]byte, [32]byte, error) {
			data, err := descriptors.ReadFile(path)
			return data, sha256.Sum256(data), err
		},
		InForce: func() [32]byte { return s.Config().Sum() },
		Install: func(path string, data []byte) error {
			cfg, err := descriptors.ParseConfig(path, data)
			if err != nil {
				return err
			}
			return s.SetConfig(cfg)
		},
	})
}
