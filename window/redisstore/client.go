package redisstore

import (
	"cmp"
	"crypto/tls"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
)

// Redis deployment modes for [ClientConfig.Mode].
const (
	ModeStandalone = "standalone"
	ModeSentinel   = "sentinel"
	ModeCluster    = "cluster"
)

// DefaultRedisTimeout is the default budget of one Redis round trip.
const DefaultRedisTimeout = 25 * time.Millisecond

// DefaultMinIdleConns is the default of ClientConfig.MinIdleConns: the
// auto-pipeline's round trips in flight plus room for heartbeats and checks
// sent on their own.
const DefaultMinIdleConns = DefaultPipelineWorkers + 2

// minDialTimeout is the least time a new connection may take: a TLS
// handshake does not fit a 25 ms budget on every network.
const minDialTimeout = 250 * time.Millisecond

// ClientName is the connection name (CLIENT SETNAME) of every connection
// NewClient opens.
const ClientName = "flashgate"

// ClientConfig describes how to reach Redis. The zero value is invalid: at
// least one address is needed.
type ClientConfig struct {
	// Addrs: one "host:port" for standalone; the sentinels for sentinel;
	// some or all nodes (seeds) for cluster.
	Addrs []string
	// Mode: ModeStandalone, ModeSentinel or ModeCluster. Empty means
	// sentinel when MasterName is set, standalone for one address and
	// cluster for several.
	Mode string
	// MasterName is the Sentinel master name; required for sentinel, an
	// error otherwise.
	MasterName string
	// Username and Password authenticate (ACL or requirepass); they are also
	// used for the sentinels.
	Username string
	Password string
	// DB selects a database; standalone and sentinel only (cluster has
	// only database 0).
	DB int
	// TLS connects with TLS (system roots, server name from the address).
	TLS bool
	// PoolSize bounds the connections to each node: go-redis opens no more
	// (MaxActiveConns), and pipelines (Cluster mode) share that pool instead
	// of a dedicated one. 0 means go-redis's default.
	PoolSize int
	// Name is the connection name (CLIENT SETNAME); empty means ClientName.
	Name string
	// MinIdleConns is how many connections per node the client keeps open
	// while idle (re-dialled in the background after a reconnect), so that
	// a burst after a quiet spell does not wait on dials. 0 means
	// DefaultMinIdleConns, bounded by the pool size; negative means none.
	MinIdleConns int
	// Timeout is the budget of one round trip: it bounds reads, writes and
	// waits for a pooled connection (dials get a floor of their own). 0
	// means DefaultRedisTimeout; a shorter context deadline cuts a command.
	Timeout time.Duration
	// Restarts, if not nil, is told when a new connection finds Redis
	// restarted or failed over, and that connection fails with
	// [ErrRestarted] (see [RestartListener]): each new connection asks
	// INFO server once. Standalone and Sentinel only; on a Cluster, whose
	// masters each have a run id of their own, it is not used.
	Restarts RestartListener
}

// ModeInUse is the mode a client of cfg runs in: Mode, else the one the
// other fields imply.
func (cfg ClientConfig) ModeInUse() string {
	switch {
	case cfg.Mode != "":
		return cfg.Mode
	case cfg.MasterName != "":
		return ModeSentinel
	case len(cfg.Addrs) == 1:
		return ModeStandalone
	}
	return ModeCluster
}

// NewClient validates cfg and returns a go-redis client for it: a
// *redis.Client (standalone or sentinel failover) or a *redis.ClusterClient.
// It does not connect; the caller closes the client.
//
// With cfg.Restarts, every new connection first compares Redis's run id
// with the one found before (see [RestartListener]).
//
// The client honours context deadlines (ContextTimeoutEnabled) and retries a
// failed command at most once with no backoff, so that a decision stays
// within its budget. A retried [Redis] script cannot count a request twice:
// its member id makes it idempotent.
func NewClient(cfg ClientConfig) (redis.UniversalClient, error) {
	if len(cfg.Addrs) == 0 {
		return nil, errors.New("redis client: no address given")
	}
	for _, a := range cfg.Addrs {
		if strings.TrimSpace(a) == "" {
			return nil, errors.New("redis client: an address is empty")
		}
	}
	mode := cfg.ModeInUse()
	switch mode {
	case ModeStandalone:
		if len(cfg.Addrs) != 1 {
			return nil, fmt.Errorf("redis client: standalone mode takes one address, got %d", len(cfg.Addrs))
		}
		if cfg.MasterName != "" {
			return nil, errors.New("redis client: a master name is only for sentinel mode")
		}
	case ModeSentinel:
		if cfg.MasterName == "" {
			return nil, errors.New("redis client: sentinel mode needs a master name")
		}
	case ModeCluster:
		if cfg.MasterName != "" {
			return nil, errors.New("redis client: a master name is only for sentinel mode")
		}
		if cfg.DB != 0 {
			return nil, fmt.Errorf("redis client: cluster mode has only database 0, got %d", cfg.DB)
		}
	default:
		return nil, fmt.Errorf("redis client: unknown mode %q: want standalone, sentinel or cluster", cfg.Mode)
	}
	if cfg.DB < 0 {
		return nil, fmt.Errorf("redis client: database %d is negative", cfg.DB)
	}
	if cfg.PoolSize < 0 {
		return nil, fmt.Errorf("redis client: pool size %d is negative", cfg.PoolSize)
	}
	if cfg.Timeout < 0 {
		return nil, fmt.Errorf("redis client: timeout %s is negative", cfg.Timeout)
	}
	timeout := cfg.Timeout
	if timeout == 0 {
		timeout = DefaultRedisTimeout
	}
	poolSize := cfg.PoolSize
	if poolSize == 0 {
		poolSize = 10 * runtime.GOMAXPROCS(0)
	}
	minIdle := cfg.MinIdleConns
	switch {
	case minIdle == 0:
		minIdle = min(DefaultMinIdleConns, poolSize)
	case minIdle < 0:
		minIdle = 0
	case minIdle > poolSize:
		return nil, fmt.Errorf("redis client: %d idle connections exceed the pool size of %d", minIdle, poolSize)
	}
	o := &redis.UniversalOptions{
		MinIdleConns:          minIdle,
		Addrs:                 cfg.Addrs,
		MasterName:            cfg.MasterName,
		Username:              cfg.Username,
		Password:              cfg.Password,
		SentinelUsername:      cfg.Username,
		SentinelPassword:      cfg.Password,
		DB:                    cfg.DB,
		PoolSize:              poolSize,
		MaxActiveConns:        poolSize,
		PipelinePoolSize:      -1, // pipelines share the bounded main pool
		ContextTimeoutEnabled: true,
		DialTimeout:           max(timeout, minDialTimeout),
		DialerRetries:         1,
		ReadTimeout:           timeout,
		WriteTimeout:          timeout,
		PoolTimeout:           timeout,
		MaxRetries:            1,
		MinRetryBackoff:       -1, // no backoff: the budget is milliseconds
		MaxRetryBackoff:       -1,
		DisableIdentity:       true, // no CLIENT SETINFO round trips (Redis < 7.2 rejects it)
		// CLIENT SETNAME on connect (once per connection): operators and
		// tests tell flashgate's connections apart in CLIENT LIST.
		ClientName: cmp.Or(cfg.Name, ClientName),
		// RESP2: the script's reply reads the same, and go-redis skips the
		// RESP3 push-notification checks around every command (~15% of a
		// decision's client CPU).
		Protocol: 2,
		MaintNotificationsConfig: &maintnotifications.Config{
			Mode: maintnotifications.ModeDisabled,
		},
		IsClusterMode: mode == ModeCluster,
	}
	if cfg.Restarts != nil && mode != ModeCluster {
		o.OnConnect = (&runIDWatch{to: cfg.Restarts}).onConnect
	}
	if cfg.TLS {
		o.TLSConfig = &tls.Config{MinVersion: tls.VersionTLS12}
	}
	switch mode {
	case ModeStandalone:
		return redis.NewClient(o.Simple()), nil
	case ModeSentinel:
		return redis.NewFailoverClient(o.Failover()), nil
	default:
		return redis.NewClusterClient(o.Cluster()), nil
	}
}
