package extauthz

import (
	"crypto/sha256"

	"github.com/flashgate/flashgate/descriptors"
	"github.com/flashgate/flashgate/enforce"
)

// Reloader returns the [enforce.Reloader] of the descriptors file at path
// for s; a file beyond descriptors.MaxFileSize is refused unparsed. Build
// one per path.
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
