package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/flashgate/flashgate/window/bans"
	"github.com/flashgate/flashgate/window/guard"
	"github.com/flashgate/flashgate/window/redisstore"
)

// fleetBansTimeout bounds one call of the fleet bans' own client: a flush
// of denials, a sync; they are off the check path and may take longer than
// a check's budget.
const fleetBansTimeout = time.Second

// maxBanRules bounds the rule labels of the ban metrics; further rules
// (which a sane config never has) share "other".
const maxBanRules = 256

// fleetBans is the daemon's share of the fleet's ban list (Redis backend only):
// the reporter its Guard hands denials to, the subscriber that applies the
// fleet's bans to the Guard, their own client, and the metrics.
type fleetBans struct {
	client   interface{ Close() error }
	list     *redisstore.FleetBans
	reporter *redisstore.Reporter
	sub      *redisstore.Subscriber
	metrics  *banMetrics
}

// newFleetBans opens the fleet bans' client (one connection and the
// subscription's) and makes the reporter; attach makes the subscriber once
// the Guard exists.
func newFleetBans(cc redisstore.ClientConfig, c *Options) (*fleetBans, error) {
	cc.PoolSize, cc.MinIdleConns, cc.Timeout, cc.Name = 2, -1, fleetBansTimeout, redisstore.ClientName+"-bans"
	client, err := redisstore.NewClient(cc)
	if err != nil {
		return nil, fmt.Errorf("fleet bans: %w", err)
	}
	fb, err := redisstore.NewFleetBans(client, c.Keys, redisstore.FleetBansOptions{Clock: c.Clock})
	if err != nil {
		client.Close()
		return nil, err
	}
	rep, err := fb.NewReporter(redisstore.ReporterOptions{})
	if err != nil {
		client.Close()
		return nil, err
	}
	return &fleetBans{client: client, list: fb, reporter: rep, metrics: newBanMetrics()}, nil
}

// attach makes the subscriber that applies the fleet's bans to g.
func (f *fleetBans) attach(g *guard.Guard, log *slog.Logger) error {
	sub, err := f.list.NewSubscriber(g, redisstore.SubscriberOptions{
		Events:  f.metrics,
		OnError: func(err error) { log.Warn("fleet bans: redis unreachable; the bans known stay in force", "error", err) },
	})
	if err != nil {
		return err
	}
	f.sub = sub
	return nil
}

// run flushes denials and follows the fleet's bans until ctx ends.
func (f *fleetBans) run(ctx context.Context) {
	var wg sync.WaitGroup
	wg.Go(func() { f.reporter.Run(ctx) })
	wg.Go(func() { f.sub.Run(ctx) })
	wg.Wait()
}

// synced waits for the subscriber's first sync, or ctx.
func (f *fleetBans) synced(ctx context.Context) error {
	select {
	case <-f.sub.Synced():
		return nil
	case <-ctx.Done():
		return fmt.Errorf("fleet bans: first sync: %w", ctx.Err())
	}
}

// collectors are the fleet bans' metrics.
func (f *fleetBans) collectors() []prometheus.Collector {
	stat := func(result string, v func(redisstore.ReporterStats) uint64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name:        "flashgate_ban_reports_total",
			Help:        "Denials toward a fleet-wide ban by what became of them: sent (counted on Redis), dropped (too many keys pending), failed (Redis failed).",
			ConstLabels: prometheus.Labels{"result": result},
		}, func() float64 { return float64(v(f.reporter.Stats())) })
	}
	return []prometheus.Collector{
		f.metrics.raised, f.metrics.lifted, inForce{f},
		stat("sent", func(s redisstore.ReporterStats) uint64 { return s.Sent }),
		stat("dropped", func(s redisstore.ReporterStats) uint64 { return s.Dropped }),
		stat("failed", func(s redisstore.ReporterStats) uint64 { return s.Failed }),
	}
}

// banMetrics counts the subscriber's events by rule (redisstore.BanEvents).
type banMetrics struct {
	raised, lifted *prometheus.CounterVec
	// mu guards rules.
	mu    sync.Mutex
	rules map[string]struct{}
}

func newBanMetrics() *banMetrics {
	return &banMetrics{
		raised: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "flashgate_bans_raised_total",
			Help: "Fleet-wide bans this sidecar learnt as they were raised, by rule and by: threshold (the fleet's denials) or hand (flashgate bans add). Every sidecar counts each ban: for the fleet take the max, not the sum.",
		}, []string{"rule", "by"}),
		lifted: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "flashgate_bans_lifted_total",
			Help: "Fleet-wide bans in force lifted (flashgate bans lift), by rule, as this sidecar learnt them.",
		}, []string{"rule"}),
		rules: make(map[string]struct{}),
	}
}

// label bounds the rule labels to maxBanRules.
func (m *banMetrics) label(rule string) string {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.rules[rule]; ok {
		return rule
	}
	if len(m.rules) >= maxBanRules {
		return "other"
	}
	m.rules[rule] = struct{}{}
	return rule
}

// Raised implements redisstore.BanEvents.
func (m *banMetrics) Raised(rule string, by bans.Origin) {
	m.raised.WithLabelValues(m.label(rule), by.String()).Inc()
}

// Lifted implements redisstore.BanEvents.
func (m *banMetrics) Lifted(rule string) { m.lifted.WithLabelValues(m.label(rule)).Inc() }

// inForce is flashgate_bans_in_force{rule}, read from the subscriber at
// each scrape.
type inForce struct{ f *fleetBans }

var inForceDesc = prometheus.NewDesc("flashgate_bans_in_force",
	"Fleet-wide bans in force that this sidecar enforces, by rule.", []string{"rule"}, nil)

func (c inForce) Describe(ch chan<- *prometheus.Desc) { ch <- inForceDesc }

func (c inForce) Collect(ch chan<- prometheus.Metric) {
	counts := make(map[string]int)
	c.f.sub.InForce(func(rule string, n int) { counts[c.f.metrics.label(rule)] += n })
	for rule, n := range counts {
		ch <- prometheus.MustNewConstMetric(inForceDesc, prometheus.GaugeValue, float64(n), rule)
	}
}

var (
	_ guard.BanReporter     = (*redisstore.Reporter)(nil)
	_ redisstore.BanApplier = (*guard.Guard)(nil)
)
