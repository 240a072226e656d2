package host

import (
	"context"
	"sync"
	"sync/atomic"

	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// watches is grpc.health.v1 as grpc-go serves it, except that on shutdown
// a Watch stream ends once it has sent NOT_SERVING, so an idle watcher
// cannot hold a graceful stop.
type watches struct {
	*health.Server
	closing atomic.Bool
	// mu guards streams.
	mu      sync.Mutex
	streams map[*watchStream]struct{}
}

// watchStream is one Watch call's stream; its context ends with the watch.
type watchStream struct {
	healthpb.Health_WatchServer
	ctx    context.Context
	cancel context.CancelFunc
	w      *watches
	// notServing: the last status sent was NOT_SERVING.
	notServing atomic.Bool
}

func (s *watchStream) Context() context.Context { return s.ctx }

// Send sends m, ending the watch after NOT_SERVING on shutdown.
func (s *watchStream) Send(m *healthpb.HealthCheckResponse) error {
	if err := s.Health_WatchServer.Send(m); err != nil {
		return err
	}
	s.notServing.Store(m.GetStatus() == healthpb.HealthCheckResponse_NOT_SERVING)
	if s.notServing.Load() && s.w.closing.Load() {
		s.cancel()
	}
	return nil
}

// Watch implements service Health.
func (w *watches) Watch(in *healthpb.HealthCheckRequest, stream healthpb.Health_WatchServer) error {
	ctx, cancel := context.WithCancel(stream.Context())
	defer cancel()
	s := &watchStream{Health_WatchServer: stream, ctx: ctx, cancel: cancel, w: w}
	w.mu.Lock()
	w.streams[s] = struct{}{}
	w.mu.Unlock()
	defer func() {
		w.mu.Lock()
		delete(w.streams, s)
		w.mu.Unlock()
	}()
	err := w.Server.Watch(in, s)
	if w.closing.Load() && stream.Context().Err() == nil && ctx.Err() != nil {
		return nil // ended by the shutdown, not by the client
	}
	return err
}

// shutdown turns every status NOT_SERVING for good and ends each stream
// once it has sent that.
func (w *watches) shutdown() {
	w.closing.Store(true)
	w.Server.Shutdown()
	w.mu.Lock()
	defer w.mu.Unlock()
	for s := range w.streams {
		if s.notServing.Load() {
			s.cancel()
		}
	}
}
