package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/flashgate/flashgate/enforce"
	"github.com/flashgate/flashgate/window"
	"github.com/flashgate/flashgate/window/fallback"
	"github.com/flashgate/flashgate/window/guard"
	"github.com/flashgate/flashgate/window/lease"
	"github.com/flashgate/flashgate/window/memory"
	"github.com/flashgate/flashgate/window/redisstore"
)

// backend is the limiter stack the daemon builds from its options, once:
//
//	memory: Guard(Memory)
//	redis:  Guard(Fallback.Watch(Breaker(Budget(Redis)))), failure mode
//	        local decided by the Fallback, N from the Fleet heartbeat
type backend struct {
	limiter  window.Limiter     // the whole stack
	fallback *fallback.Fallback // failure mode local's limiter
	memory   *memory.Memory     // the memory backend; nil for redis
	redis    *redisstore.Redis
	breaker  *guard.Breaker // nil when disabled or for memory
	budget   *guard.Budget
	fleet    *fallback.Fleet // nil for memory or a fixed --fleet-size
	bans     *fleetBans      // the fleet-wide bans; nil for memory
	// overrides are the fleet's overrides (flashgate limits); nil for memory
	overrides *fleetOverrides
	leases    *lease.Holder // leased rules' admissions; nil for memory
	// fleetSize returns N for the fallback (fixed or discovered).
	fleetSize func() int
	describe  string
	// closers release what the stack holds, run last to first by close.
	closers []func()
}

// onClose adds fn to what close runs; fn runs before the ones added before.
func (b *backend) onClose(fn func()) { b.closers = append(b.closers, fn) }

// close releases the stack: the guard's sweeper, the stores, their clients.
func (b *backend) close() {
	for i := len(b.closers) - 1; i >= 0; i-- {
		b.closers[i]()
	}
	b.closers = nil
}

// fleetTimeout bounds one heartbeat (its own connection).
const fleetTimeout = time.Second

// newBackend builds the stack of o; domain names the fleet. On an error
// it has released what it acquired.
func newBackend(o *Options, domain string, log *slog.Logger) (*backend, error) {
	b := &backend{}
	store, err := b.store(o, domain, log)
	if err != nil {
		b.close()
		return nil, err
	}
	gopts := guard.GuardOptions{Budget: o.LocalCacheSize, Ban: o.Ban}
	if b.bans != nil {
		gopts.Reporter = b.bans.reporter
	}
	g, err := guard.NewGuard(store, gopts)
	if err != nil {
		b.close()
		return nil, fmt.Errorf("local cache: %w", err)
	}
	b.onClose(g.Close)
	if b.bans != nil {
		if err := b.bans.attach(g, log); err != nil {
			b.close()
			return nil, fmt.Errorf("fleet bans: %w", err)
		}
	}
	b.limiter = g
	return b, nil
}

// store builds the stack below the guard: Memory, or the Redis stack.
func (b *backend) store(o *Options, domain string, log *slog.Logger) (window.Limiter, error) {
	if o.Backend == BackendRedis {
		return b.redisStack(o, domain, log)
	}
	mem, err := memory.New(memory.Options{MaxKeys: o.MemoryMaxKeys})
	if err != nil {
		return nil, fmt.Errorf("memory backend: %w", err)
	}
	b.memory, b.describe = mem, "memory"
	b.fleetSize = func() int { return 1 }
	// Memory fails only on an invalid hit (which loaded rules never make)
	// or a check whose caller gave up; a fallback of one process keeps
	// "local" meaning local.
	if b.fallback, err = fallback.New(fallback.Options{MaxKeys: o.MemoryMaxKeys}); err != nil {
		return nil, fmt.Errorf("local failure-mode limiter: %w", err)
	}
	b.onClose(b.fallback.Close)
	return mem, nil
}

// redisStack builds Fallback.Watch(Breaker(Budget(Redis))) and the fleet.
func (b *backend) redisStack(c *Options, domain string, log *slog.Logger) (window.Limiter, error) {
	cc := c.Redis
	// go-redis logs dial failures through a package-level logger of its
	// own; route it into ours so --log-format json stays JSON. SetLogger is
	// atomic, and the last serve to start wins, which is the only one in a
	// real process. It is set before the client dials its first connections.
	redis.SetLogger(redisLogger{log})
	// The checks' connections tell the fallback (built below, after the
	// store it writes back to) when one finds Redis restarted.
	restarts := &restartRelay{}
	checks := cc
	checks.Restarts = restarts
	client, err := redisstore.NewClient(checks)
	if err != nil {
		return nil, fmt.Errorf("redis backend: %w", err)
	}
	b.onClose(func() { client.Close() })
	r, err := redisstore.New(client, redisstore.Options{Clock: c.Clock, AutoPipeline: c.RedisAutoPipeline, BatchWindow: c.RedisBatchWindow})
	if err != nil {
		return nil, fmt.Errorf("redis backend: %w", err)
	}
	b.redis = r
	b.onClose(func() { r.Close() }) // stops the auto-pipeline before its client
	if b.bans, err = newFleetBans(cc, c); err != nil {
		return nil, err
	}
	b.onClose(func() { b.bans.client.Close() })
	if b.overrides, err = newFleetOverrides(cc, c, log); err != nil {
		return nil, err
	}
	b.onClose(func() { b.overrides.client.Close() })
	// The store's id names this sidecar's leases in a key (flashgate inspect).
	b.describe = fmt.Sprintf("redis %s (%s), sidecar id %s", strings.Join(cc.Addrs, ","), cc.ModeInUse(), r.ID())
	if c.RedisAutoPipeline {
		b.describe += ", auto-pipelined"
		if cc.ModeInUse() == redisstore.ModeCluster {
			b.describe += " per master"
		}
		if c.RedisBatchWindow > 0 {
			b.describe += ", batch window " + c.RedisBatchWindow.String()
		}
	}
	if b.budget, err = guard.NewBudget(r, guard.BudgetOptions{Min: c.RedisTimeout, Max: cc.Timeout}); err != nil {
		return nil, fmt.Errorf("redis budget: %w", err)
	}
	var stack window.Limiter = b.budget
	if c.BreakerFailures >= 0 {
		b.breaker, err = guard.NewBreaker(b.budget, guard.BreakerOptions{
			ConnFailures: c.BreakerFailures, FailureRate: c.BreakerRate, MinCalls: c.BreakerMinCalls,
			Cooldown: c.BreakerCooldown,
			OnChange: func(open bool, cause error) {
				if open {
					log.Warn("circuit breaker open: checks take their failure mode without calling Redis",
						"cooldown", c.BreakerCooldown, "cause", cause)
				} else {
					log.Info("circuit breaker closed: Redis decides again")
				}
			},
		})
		if err != nil {
			return nil, fmt.Errorf("circuit breaker: %w", err)
		}
		stack = b.breaker
	}
	if c.FleetSize > 0 {
		n := c.FleetSize
		b.fleetSize = func() int { return n }
	} else {
		// The heartbeat has a connection of its own, with a timeout of its
		// own: the checks' client cuts every call at the checks' budget
		// (tens of ms), and a beat that a busy moment delays must not be
		// lost for that.
		hb := cc
		hb.PoolSize, hb.MinIdleConns, hb.Timeout, hb.Name = 1, -1, fleetTimeout, redisstore.ClientName+"-fleet"
		// A restart tells the fleet that Redis may have lost its set.
		fleetRestarts := &restartRelay{}
		hb.Restarts = fleetRestarts
		hbClient, err := redisstore.NewClient(hb)
		if err != nil {
			return nil, fmt.Errorf("fleet heartbeat: %w", err)
		}
		b.onClose(func() { hbClient.Close() })
		if b.fleet, err = fallback.NewFleet(redisstore.NewHeartbeat(hbClient), fallback.FleetOptions{Key: c.Keys.Fleet(domain), TTL: c.FleetTTL, Timeout: fleetTimeout}); err != nil {
			return nil, fmt.Errorf("fleet heartbeat: %w", err)
		}
		fleetRestarts.set(b.fleet)
		b.fleetSize = func() int { n, _ := b.fleet.Size(); return n }
	}
	// What failure mode local admits is written back to Redis before this
	// sidecar's checks go to it again (window/fallback's doc.go). The fleet
	// agrees on the settle's end in Redis, and the breaker closes as the
	// settle begins (the write-back found Redis answering).
	fo := fallback.Options{
		Size: b.fleetSize, MaxKeys: c.MemoryMaxKeys,
		WriteBack: r, Settle: max(fallback.DefaultRestoreSettle, 4*c.BreakerCooldown),
		SharedSettle: redisstore.NewSettles(client, c.Keys.Settle(domain)),
	}
	if b.breaker != nil {
		fo.OnReturn = b.breaker.Reset
	}
	b.fallback, err = fallback.New(fo)
	if err != nil {
		return nil, fmt.Errorf("local failure-mode limiter: %w", err)
	}
	b.onClose(b.fallback.Close) // its write-back rounds end before the store and its client close
	if c.FailureMode == enforce.FailureLocal || c.FailureMode == enforce.FailureDefault {
		// Held as an outage only where failure mode local decides: in
		// allow or deny the settle would only lengthen the outage. (A
		// rule of mode local under another default is held by its
		// check's connection error instead.)
		restarts.set(b.fallback)
	}
	return b.leased(b.fallback.Watch(stack))
}

// leased wraps the Redis stack in the lease holder: a leased rule's hits
// are admitted from reserved batches, its reservations held off as the
// fallback and the breaker hold the checks off.
func (b *backend) leased(next window.Limiter) (window.Limiter, error) {
	size := func() (int, bool) { return b.fleetSize(), true }
	if b.fleet != nil {
		size = b.fleet.Size
	}
	h, err := lease.New(next, lease.Options{
		Store: b.redis, Size: size, Timeout: b.budget.Current,
		Gate: func(hits []window.Hit) error {
			if b.breaker != nil && b.breaker.Open() {
				return window.ErrBreakerOpen
			}
			return b.fallback.Gate(hits)
		},
	})
	if err != nil {
		return nil, fmt.Errorf("lease holder: %w", err)
	}
	b.leases = h
	// After an outage the fallback writes the slots the holder used back
	// too: a Redis that came back empty forgot them.
	b.fallback.WriteBackAlso(h)
	b.onClose(h.Close) // its returns end before the store closes
	return h, nil
}

// restartRelay passes a restart a client finds on to the part built after
// it on that client (the fallback, the fleet); before it is set, the part
// has not used Redis.
type restartRelay struct {
	to atomic.Pointer[redisstore.RestartListener]
}

// set makes l the listener.
func (r *restartRelay) set(l redisstore.RestartListener) { r.to.Store(&l) }

// Restarted implements redisstore.RestartListener.
func (r *restartRelay) Restarted() {
	if l := r.to.Load(); l != nil {
		(*l).Restarted()
	}
}

// warm readies the backend before health turns SERVING: PING, the script
// loaded, the pool's idle connections dialled, (unless --fleet-size is
// fixed) a first heartbeat, so that the fallback knows N from the first
// check on, and the fleet's bans in force learnt (the subscriber's first
// sync), so that a banned key is refused from the first check on, and the
// overrides in force learnt, so that they apply from the first check on.
// The memory backend is ready at once.
func (b *backend) warm(ctx context.Context) error {
	if b.redis == nil {
		return nil
	}
	if err := b.redis.Warm(ctx, redisstore.DefaultMinIdleConns); err != nil { // PINGs
		return err
	}
	if b.fleet != nil {
		if _, err := b.fleet.Beat(ctx); err != nil {
			return err
		}
	}
	if err := b.bans.synced(ctx); err != nil {
		return err
	}
	return b.overrides.synced(ctx)
}

// run keeps what the backend runs in the background (the fleet heartbeat,
// the fleet bans' reporter and subscriber, the overrides' follower) going
// until ctx ends; the fleet then leaves. Each failed beat is logged (under
// the log limit).
func (b *backend) run(ctx context.Context, log *slog.Logger) {
	var wg sync.WaitGroup
	defer wg.Wait()
	if b.bans != nil {
		wg.Go(func() { b.bans.run(ctx) })
	}
	if b.overrides != nil {
		wg.Go(func() { b.overrides.follower.Run(ctx) })
	}
	if b.fleet == nil {
		return
	}
	b.fleet.Run(ctx, func(err error) {
		n, _ := b.fleet.Size()
		log.Warn("fleet heartbeat failed; keeping the last fleet size", "fleet_size", n, "error", err)
	})
}

// collectors are the backend's gauges and counters for /metrics.
func (b *backend) collectors() []prometheus.Collector {
	cs := []prometheus.Collector{
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "flashgate_fleet_size",
			Help: "Live sidecars sharing the Redis (heartbeats, or --fleet-size); failure mode local enforces ceil(limit / this) per sidecar.",
		}, func() float64 { return float64(b.fleetSize()) }),
	}
	mem := func() (int, uint64) {
		if b.memory != nil {
			return b.memory.Len(), b.memory.Evictions()
		}
		return b.fallback.Len(), b.fallback.Evictions()
	}
	cs = append(cs,
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "flashgate_memory_evictions_total",
			Help: "Live keys the in-process limiter (memory backend or local fallback) evicted at --memory-max-keys; each forgot its history.",
		}, func() float64 { _, e := mem(); return float64(e) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "flashgate_memory_keys",
			Help: "Keys the in-process limiter (memory backend or local fallback) holds.",
		}, func() float64 { n, _ := mem(); return float64(n) }))
	if b.budget != nil {
		cs = append(cs, prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "flashgate_redis_budget_seconds",
			Help: "The deadline a Redis call gets now: it follows the observed latency between --redis-timeout and --check-deadline.",
		}, func() float64 { return b.budget.Current().Seconds() }))
	}
	if b.redis != nil {
		wb := func() fallback.WriteBackStats { return b.fallback.WriteBack() }
		cs = append(cs,
			prometheus.NewCounterFunc(prometheus.CounterOpts{
				Name: "flashgate_writeback_rounds_total", Help: "Rounds that wrote failure mode local's admissions back to Redis and landed.",
				ConstLabels: prometheus.Labels{"result": "landed"},
			}, func() float64 { return float64(wb().Landed) }),
			prometheus.NewCounterFunc(prometheus.CounterOpts{
				Name: "flashgate_writeback_rounds_total", Help: "Rounds that wrote failure mode local's admissions back to Redis and landed.",
				ConstLabels: prometheus.Labels{"result": "failed"},
			}, func() float64 { return float64(wb().Failed) }),
			prometheus.NewCounterFunc(prometheus.CounterOpts{
				Name: "flashgate_writeback_entries_total",
				Help: "Entries (request costs) admitted locally in an outage and written back to Redis's windows.",
			}, func() float64 { return float64(wb().Written) }),
			prometheus.NewCounterFunc(prometheus.CounterOpts{
				Name: "flashgate_writeback_unremembered_total",
				Help: "Entries admitted locally on a new key while --memory-max-keys keys waited to be written back: never written back.",
			}, func() float64 { return float64(wb().Unremembered) }),
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{
				Name: "flashgate_writeback_pending_keys",
				Help: "Keys whose local admissions wait to be written back to Redis; their checks take the failure mode until then.",
			}, func() float64 { return float64(wb().Pending) }))
	}
	if b.bans != nil {
		cs = append(cs, b.bans.collectors()...)
	}
	if b.overrides != nil {
		cs = append(cs, b.overrides.collectors()...)
	}
	if b.leases != nil {
		cs = append(cs, leaseCollectors(b.leases)...)
	}
	if b.breaker != nil {
		cs = append(cs,
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{
				Name: "flashgate_breaker_open",
				Help: "1 while Redis is held off (the circuit breaker is open, an outage has not ended, or the fleet settles after one): checks take their failure mode, else 0.",
			}, func() float64 {
				if b.breaker.Open() {
					return 1
				}
				if b.fallback != nil {
					if st := b.fallback.WriteBack(); st.Down || st.SettleEnd.After(time.Now()) {
						return 1
					}
				}
				return 0
			}),
			prometheus.NewCounterFunc(prometheus.CounterOpts{
				Name: "flashgate_breaker_opened_total",
				Help: "Times the circuit breaker opened.",
			}, func() float64 { return float64(b.breaker.Opened()) }))
	}
	return cs
}

// redisLogger adapts go-redis's internal log lines to slog, at warn level,
// all of one kind ("redis client") for the log limit.
type redisLogger struct{ log *slog.Logger }

func (l redisLogger) Printf(ctx context.Context, format string, v ...any) {
	l.log.WarnContext(ctx, "redis client", "detail", fmt.Sprintf(format, v...))
}
