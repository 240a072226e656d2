package main

// The operator commands (inspect, bans, limits) share serve's Redis flags,
// key prefix, penalty box flags and rules, so that daemon/keyadmin names
// the keys the sidecars use.

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/flashgate/flashgate/daemon/keyadmin"
)

// opsTimeout is --redis-timeout's default for the operator commands.
const opsTimeout = 2 * time.Second

// opsOptions are the flags every operator command takes.
type opsOptions struct {
	redisOptions
	banOptions
	backend   string
	config    string
	rlsConfig string
	json      bool
}

// register adds the flags to cmd: serve's, which serve's environment
// variables (FLASHGATE_<FLAG>) set too, and --json.
func (o *opsOptions) register(cmd *cobra.Command, e env) {
	shared := pflag.NewFlagSet(cmd.Name(), pflag.ContinueOnError)
	o.redisOptions.addFlags(shared, opsTimeout)
	o.banOptions.addFlags(shared)
	shared.StringVar(&o.backend, "backend", "redis", "serve's backend: redis (memory keeps windows and bans inside each serve process, out of reach)")
	shared.StringVar(&o.config, "config", "", "serve's descriptors file (default: the built-in example)")
	shared.StringVar(&o.rlsConfig, "rls-config", "", "serve's ratelimit config directory, for --domain and --entry")
	cmd.Flags().AddFlagSet(shared)
	withEnvOf(cmd, shared, e)
	cmd.Flags().BoolVar(&o.json, "json", false, "print JSON instead of a table")
}

// keyOptions name one limit key: a rule of the descriptors file and its
// values, or a domain of the ratelimit config and a descriptor's entries.
type keyOptions struct {
	rule    string
	values  []string
	domain  string
	entries []string
}

func (k *keyOptions) addFlags(f *pflag.FlagSet) {
	f.StringVar(&k.rule, "rule", "", "rule of the descriptors file")
	f.StringArrayVar(&k.values, "value", nil, "the request value the rule keys (repeat for a rule that keys several, in the file's order)")
	f.StringVar(&k.domain, "domain", "", "ratelimit service: the domain of --rls-config (instead of --rule)")
	f.StringArrayVar(&k.entries, "entry", nil, "ratelimit service: a descriptor entry key=value (repeat, in order)")
}

// ref is the key k names.
func (k *keyOptions) ref() keyadmin.Ref {
	return keyadmin.Ref{Rule: k.rule, Values: k.values, Domain: k.domain, Entries: k.entries}
}

// ops is an operator command's connection to serve's Redis and rules.
type ops struct {
	*keyadmin.Admin
	now func() time.Time
}

// openOps validates o and connects to Redis (lazily: the first command
// dials). The caller closes it.
func openOps(o *opsOptions) (*ops, error) {
	keys, err := o.keys()
	if err != nil {
		return nil, err
	}
	// go-redis logs a failed dial through its one package-level logger
	// before the call returns the error, which the command reports itself:
	// an operator command is the whole process, so nothing else is lost.
	redis.SetLogger(quietRedis{})
	a, err := keyadmin.Open(keyadmin.Options{Backend: o.backend, Redis: o.clientConfig(o.redisTimeout), Keys: keys, Ban: o.ban(),
		Config: o.config, RLSConfig: o.rlsConfig})
	if err != nil {
		return nil, err
	}
	return &ops{Admin: a, now: time.Now}, nil
}

func (p *ops) close() { p.Close() }

// quietRedis is a go-redis logger that writes nothing.
type quietRedis struct{}

func (quietRedis) Printf(context.Context, string, ...any) {}

// run opens serve's Redis and rules for o, does f and prints its result
// to e.stdout: JSON with --json, else a table.
func (o *opsOptions) run(e env, f func(*ops) (keyadmin.Table, error)) error {
	p, err := openOps(o)
	if err != nil {
		return err
	}
	defer p.close()
	r, err := f(p)
	if err != nil {
		return err
	}
	if o.json {
		return keyadmin.WriteJSON(e.stdout, r)
	}
	return r.WriteTable(e.stdout, p.now())
}
