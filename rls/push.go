package rls

import (
	"sync"
	"sync/atomic"

	"github.com/flashgate/flashgate/enforce"
)

// Pusher installs configs pushed from elsewhere than a directory (an xDS
// server) the way a directory reload does; a bad config keeps the one in
// force. Push is safe for concurrent use, one push at a time.
type Pusher struct {
	rel *enforce.Reloader
	// mu orders pushes: the config Reload reads is the one its Push set.
	mu    sync.Mutex
	files atomic.Pointer[[]File]
}

// Pusher returns a Pusher of configs from source, named in logs and as the
// Config's Dir.
func (s *Server) Pusher(source string) *Pusher {
	p := &Pusher{}
	p.rel = enforce.NewReloader(s.core, source, enforce.Source[[]File]{
		What:    "ratelimit config",
		PathKey: "source",
		Read: func(string) ([]File, [32]byte, error) {
			var files []File
			if f := p.files.Load(); f != nil {
				files = *f
			}
			return files, sumOf(files), nil
		},
		InForce: func() [32]byte { return s.Config().sum },
		Install: func(source string, files []File) error {
			cfg, err := ParseFiles(files)
			if err != nil {
				return err
			}
			cfg.Dir = source
			return s.SetConfig(cfg)
		},
	})
	return p
}

// Push installs files as the whole config: a domain not among them is
// gone. On an error the config in force stays.
func (p *Pusher) Push(files []File) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.files.Store(&files)
	return p.rel.Reload()
}
