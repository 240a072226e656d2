package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/flashgate/flashgate/window/overrides"
	"github.com/flashgate/flashgate/window/redisstore"
)

// fleetOverrides is the daemon's share of the fleet's overrides (flashgate
// limits; Redis backend only): the Book the core reads at check time, the
// follower that keeps it in step, its own client, and the metrics.
type fleetOverrides struct {
	client   interface{ Close() error }
	book     *overrides.Book
	follower *redisstore.Follower
	sets     *prometheus.CounterVec
	clears   *prometheus.CounterVec
	skipped  *prometheus.CounterVec
	labels   ruleLabels
}

// newFleetOverrides opens the overrides' client (one connection and the
// subscription's) and makes the follower.
func newFleetOverrides(cc redisstore.ClientConfig, c *Options, log *slog.Logger) (*fleetOverrides, error) {
	cc.PoolSize, cc.MinIdleConns, cc.Timeout, cc.Name = 1, -1, fleetBansTimeout, redisstore.ClientName+"-overrides"
	client, err := redisstore.NewClient(cc)
	if err != nil {
		return nil, fmt.Errorf("overrides: %w", err)
	}
	store, err := redisstore.NewOverrides(client, c.Keys)
	if err != nil {
		client.Close()
		return nil, err
	}
	f := &fleetOverrides{
		client: client,
		book:   overrides.NewBook(nil),
		sets: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "flashgate_override_sets_total",
			Help: "Overrides (flashgate limits set) this sidecar learnt as they took effect, by domain and rule. Every sidecar counts each: for the fleet take the max, not the sum.",
		}, []string{"domain", "rule"}),
		clears: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "flashgate_override_clears_total",
			Help: "Overrides in force cleared before their end (flashgate limits clear), by domain and rule, as this sidecar learnt them.",
		}, []string{"domain", "rule"}),
		skipped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "flashgate_override_skipped_total",
			Help: "Overrides in Redis this sidecar does not apply because they break an override's bounds, by reason (malformed, mode, duration, end, limit, raise, bound, revision); each stored value counts once.",
		}, []string{"reason"}),
		labels: ruleLabels{seen: make(map[overrides.Target]struct{})},
	}
	f.book.OnSkip(func(s overrides.Skip) {
		f.skipped.WithLabelValues(skipReason(s.Reason)).Inc()
		log.Warn("overrides: an override in redis is not applied", "override", s.What, "reason", s.Reason, "error", s.Err)
	})
	f.follower, err = store.NewFollower(f.book, redisstore.FollowerOptions{
		Events: f,
		OnError: func(err error) {
			log.Warn("overrides: redis unreachable; the overrides known stay in force until their end", "error", err)
		},
	})
	if err != nil {
		client.Close()
		return nil, err
	}
	return f, nil
}

// Set implements redisstore.OverrideEvents.
func (f *fleetOverrides) Set(o *overrides.Override) {
	d, r := f.labels.of(o.Target)
	f.sets.WithLabelValues(d, r).Inc()
}

// Cleared implements redisstore.OverrideEvents.
func (f *fleetOverrides) Cleared(o *overrides.Override) {
	d, r := f.labels.of(o.Target)
	f.clears.WithLabelValues(d, r).Inc()
}

// synced waits for the follower's first read, or ctx.
func (f *fleetOverrides) synced(ctx context.Context) error {
	select {
	case <-f.follower.Synced():
		return nil
	case <-ctx.Done():
		return fmt.Errorf("overrides: first read: %w", ctx.Err())
	}
}

// collectors are the overrides' metrics.
func (f *fleetOverrides) collectors() []prometheus.Collector {
	return []prometheus.Collector{f.sets, f.clears, f.skipped, overridesInForce{f}}
}

// skipReason bounds the reason label to the overrides.Skip reasons.
func skipReason(r string) string {
	switch r {
	case overrides.SkipMalformed, overrides.SkipMode, overrides.SkipDuration, overrides.SkipEnd, overrides.SkipLimit,
		overrides.SkipRaise, overrides.SkipBound, overrides.SkipRevision:
		return r
	}
	return "other"
}

// ruleLabels bounds the rule labels of the override metrics to
// maxBanRules targets; further ones (which a sane fleet never has) share
// "other".
type ruleLabels struct {
	// mu guards seen.
	mu   sync.Mutex
	seen map[overrides.Target]struct{}
}

func (l *ruleLabels) of(t overrides.Target) (domain, rule string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.seen[t]; !ok {
		if len(l.seen) >= maxBanRules {
			return "other", "other"
		}
		l.seen[t] = struct{}{}
	}
	return t.Domain, t.Rule
}

// overridesInForce is flashgate_overrides_in_force{domain,rule,mode}, read
// from the Book at each scrape.
type overridesInForce struct{ f *fleetOverrides }

var overridesInForceDesc = prometheus.NewDesc("flashgate_overrides_in_force",
	"Overrides in force that this sidecar applies (flashgate limits set), by domain, rule and mode (limit, shadow, enforce, dry-run): 1 each.",
	[]string{"domain", "rule", "mode"}, nil)

func (c overridesInForce) Describe(ch chan<- *prometheus.Desc) { ch <- overridesInForceDesc }

func (c overridesInForce) Collect(ch chan<- prometheus.Metric) {
	type key struct{ domain, rule, mode string }
	counts := make(map[key]int)
	for _, o := range c.f.book.List() {
		d, r := c.f.labels.of(o.Target)
		counts[key{d, r, o.Mode.String()}]++
	}
	for k, n := range counts {
		ch <- prometheus.MustNewConstMetric(overridesInForceDesc, prometheus.GaugeValue, float64(n), k.domain, k.rule, k.mode)
	}
}
