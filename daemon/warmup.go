package daemon

import (
	"cmp"
	"context"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/flashgate/flashgate/window/redisstore"
)

// pingBackoff bounds the pause between PINGs of an unreachable backend.
const (
	pingBackoffMin = 100 * time.Millisecond
	pingBackoffMax = 5 * time.Second
)

// keepWarmEvery is how often a warm Redis backend touches its idle
// connections (see backend.keepWarm): well below the idle cut-offs met
// between a sidecar and Redis (Redis's own timeout, a proxy's, a cloud load
// balancer's of a few minutes, go-redis's own of 30 minutes).
const keepWarmEvery = 10 * time.Second

// warmup is the state of the backend's warm-up, for /metrics.
type warmup struct {
	// timeout is --warmup-timeout (0: none).
	timeout time.Duration
	// keepEvery is how often the warm backend is kept warm; 0 means
	// keepWarmEvery.
	keepEvery time.Duration
	// warm is set once the backend warmed up; expired once health turned
	// SERVING without it.
	warm, expired atomic.Bool
}

func (w *warmup) collectors() []prometheus.Collector {
	bit := func(b *atomic.Bool) float64 {
		if b.Load() {
			return 1
		}
		return 0
	}
	return []prometheus.Collector{
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "flashgate_backend_warm",
			Help: "1 once the backend warmed up (Redis answered, script loaded, fleet counted), else 0.",
		}, func() float64 { return bit(&w.warm) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "flashgate_warmup_expired_total",
			Help: "1 when health turned SERVING at --warmup-timeout with the backend not warm (checks then take the failure mode while Redis fails), else 0.",
		}, func() float64 { return bit(&w.expired) }),
	}
}

// servingSetter is what waitBackend turns SERVING: the host's health.
type servingSetter interface{ SetServing(bool) }

// waitBackend warms the backend up (see backend.warm) until it succeeds,
// with exponential backoff between pingBackoffMin and pingBackoffMax, then
// turns health SERVING and keeps the backend warm until ctx ends (see
// backend.keepWarm). When w.timeout passes first, health turns SERVING
// then (logged once, counted), the failure mode deciding while Redis
// fails, and the warm-up goes on. The memory backend is ready at once.
func waitBackend(ctx context.Context, srv servingSetter, b *backend, w *warmup, failureMode string, log *slog.Logger) {
	var expiry time.Time
	if w.timeout > 0 {
		expiry = time.Now().Add(w.timeout)
	}
	serving := false
	// remaining cuts d to what is left of the warm-up's bound (1ms at
	// least) while health is not SERVING yet; d itself once it is, or
	// without a bound.
	remaining := func(d time.Duration) time.Duration {
		if serving || expiry.IsZero() {
			return d
		}
		return max(min(d, time.Until(expiry)), time.Millisecond)
	}
	pause := pingBackoffMin
	for attempt := 1; ; attempt++ {
		pctx, cancel := context.WithTimeout(ctx, remaining(2*time.Second))
		err := b.warm(pctx)
		cancel()
		if ctx.Err() != nil {
			return
		}
		if err == nil {
			w.warm.Store(true)
			switch {
			case b.redis == nil:
				srv.SetServing(true)
				log.Info("memory backend ready; serving")
			case serving:
				log.Info("redis warm (script loaded, connections open, fleet counted), after --warmup-timeout",
					"attempts", attempt, "fleet_size", b.fleetSize())
			default:
				srv.SetServing(true)
				log.Info("redis warm (script loaded, connections open, fleet counted); serving",
					"attempts", attempt, "fleet_size", b.fleetSize())
			}
			b.keepWarm(ctx, cmp.Or(w.keepEvery, keepWarmEvery), log)
			return
		}
		switch {
		case !serving && !expiry.IsZero() && !time.Now().Before(expiry):
			serving = true
			w.expired.Store(true)
			srv.SetServing(true)
			log.Warn("redis warm-up did not finish within --warmup-timeout; serving anyway, by the failure mode while Redis fails, and warming on",
				"warmup_timeout", w.timeout.String(), "failure_mode", failureMode, "backend", b.describe,
				"attempts", attempt, "error", err)
		case serving:
			log.Warn("redis warm-up failed; serving by the failure mode, will retry", "backend", b.describe,
				"attempt", attempt, "retry_in", pause.String(), "error", err)
		default:
			log.Error("redis is not ready; not serving, will retry", "backend", b.describe,
				"attempt", attempt, "retry_in", remaining(pause).String(), "error", err)
		}
		t := time.NewTimer(remaining(pause))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		pause = min(2*pause, pingBackoffMax)
	}
}

// keepWarm keeps a warm Redis backend's checks ready for a step after a
// quiet spell until ctx ends: every interval it reloads the script and
// PINGs the pool's floor of idle connections at once. A connection that a
// quiet spell would leave idle past a cut-off (Redis's timeout, a proxy's
// or a load balancer's, go-redis's own) is thus used before it, or found
// cut and re-dialled in the background, rather than by the checks of the
// step. A failure is logged at debug level: the checks and the circuit
// breaker report an outage. The memory backend has nothing to keep warm.
func (b *backend) keepWarm(ctx context.Context, interval time.Duration, log *slog.Logger) {
	if b.redis == nil {
		return
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		wctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		err := b.redis.Warm(wctx, redisstore.DefaultMinIdleConns)
		cancel()
		if err != nil && ctx.Err() == nil {
			log.Debug("redis keep-warm failed", "backend", b.describe, "error", err)
		}
	}
}
