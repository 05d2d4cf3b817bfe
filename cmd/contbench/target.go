package main

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"

	"github.com/contstore/contstore/directory"
	"github.com/contstore/contstore/internal/embedded"
	"github.com/contstore/contstore/internal/rediskeys"
	"github.com/contstore/contstore/internal/storehooks"
	"github.com/contstore/contstore/store"
)

// Timeouts of reaching the target and of removing a namespace's keys;
// adminTimeout bounds the other set-up calls.
const (
	connectTimeout = 10 * time.Second
	cleanupTimeout = 60 * time.Second
)

// target is the deployment under test: one store per replica and, on
// Redis, the client behind each.
type target struct {
	// desc names the target in the report; no password appears in it.
	desc string
	// embedded: the Redis is a miniredis started by this process.
	embedded bool
	// ns is the key namespace; owned once it is known to be this run's.
	ns    string
	owned bool
	// admin reads INFO and removes the namespace; newClient makes the
	// replicas' clients. Both are nil for the memory backend.
	admin     redis.UniversalClient
	newClient func() redis.UniversalClient
	// newRueidis, with -client rueidis, makes the rueidis client of a
	// replica's store (which keeps its go-redis client for the rest).
	newRueidis func() (rueidis.Client, error)
	// clients holds each replica's client, rclients each replica's rueidis
	// client (with -client rueidis), stores each replica's store.
	clients  []redis.UniversalClient
	rclients []rueidis.Client
	stores   []*store.Store
	// state reads the namespace's state with adminTimeout: on Redis, the
	// store that set the namespace up; on the memory backend, the shared
	// store.
	state *store.Store
	// notes holds what the set-up found that the report should say.
	notes []string
	// stopEmbedded stops the embedded Redis and its clock.
	stopEmbedded func()
}

// openTarget reaches the target cfg names. On Redis the namespace must hold
// no continuation state yet, so that the figures are this run's and the
// clean-up removes nothing else; connect then opens the replicas' stores.
// The memory backend's stores are open at once.
func openTarget(ctx context.Context, cfg *config) (*target, error) {
	if cfg.backend == backendMemory {
		base, err := store.NewMemory(cfg.storeOptions(replicaName(0)))
		if err != nil {
			return nil, err
		}
		t := &target{desc: "in-process store shared by all replicas", state: base}
		for i := range cfg.replicas {
			t.stores = append(t.stores, storehooks.WithReplica(base, replicaName(i)))
		}
		return t, nil
	}

	t := &target{ns: cfg.namespace}
	// Connections are made on demand, so a generous pool costs nothing; it
	// covers every worker on one replica, each with two calls in flight.
	pool := 2*cfg.concurrency + 4
	var rueidisOpts func() (rueidis.ClientOption, error)
	switch {
	case cfg.redisURL != "":
		t.desc = "redis " + redactURL(cfg.redisURL)
		t.newClient = func() redis.UniversalClient {
			opts, _ := redis.ParseURL(cfg.redisURL) // validated with the flags
			opts.PoolSize = pool
			return redis.NewClient(opts)
		}
		rueidisOpts = func() (rueidis.ClientOption, error) { return rueidis.ParseURL(cfg.redisURL) }
	case len(cfg.cluster) > 0:
		t.desc = "cluster " + strings.Join(cfg.cluster, ",")
		t.newClient = func() redis.UniversalClient {
			return redis.NewClusterClient(&redis.ClusterOptions{Addrs: cfg.cluster, PoolSize: pool})
		}
		rueidisOpts = func() (rueidis.ClientOption, error) { return rueidis.ClientOption{InitAddress: cfg.cluster}, nil }
	default:
		mr, stop, err := startEmbedded()
		if err != nil {
			return nil, fmt.Errorf("starting the embedded Redis: %w", err)
		}
		t.desc = "embedded miniredis"
		t.embedded = true
		t.stopEmbedded = stop
		t.newClient = func() redis.UniversalClient {
			return redis.NewClient(&redis.Options{Addr: mr.Addr(), PoolSize: pool})
		}
		rueidisOpts = func() (rueidis.ClientOption, error) {
			return rueidis.ClientOption{InitAddress: []string{mr.Addr()}}, nil
		}
	}
	if cfg.client == clientRueidis {
		t.desc += " through rueidis"
		t.newRueidis = func() (rueidis.Client, error) {
			opts, err := rueidisOpts()
			if err != nil {
				return nil, err
			}
			opts.DisableCache = true
			return rueidis.NewClient(opts)
		}
	}

	t.admin = t.newClient()
	if err := ping(ctx, t.admin); err != nil {
		return nil, errors.Join(fmt.Errorf("cannot reach %s: %w", t.desc, err), t.close(ctx, true))
	}
	s, err := t.openAdmin(ctx, cfg, t.ns)
	if err != nil {
		return nil, errors.Join(err, t.close(ctx, true))
	}
	t.owned, t.state = true, s
	if err := warmUp(ctx, s); err != nil {
		return nil, errors.Join(fmt.Errorf("warming %s up: %w", t.desc, err), t.close(ctx, true))
	}
	return t, nil
}

// ping checks that c reaches its server within connectTimeout.
func ping(ctx context.Context, c redis.UniversalClient) error {
	ctx, cancel := context.WithTimeout(ctx, connectTimeout)
	defer cancel()
	return c.Ping(ctx).Err()
}

// connect opens each replica's client and store on Redis; it does nothing
// for the memory backend.
func (t *target) connect(ctx context.Context, cfg *config) error {
	if t.newClient == nil {
		return nil
	}
	for i := range cfg.replicas {
		c := t.newClient()
		t.clients = append(t.clients, c)
		if err := ping(ctx, c); err != nil {
			return fmt.Errorf("cannot reach %s: %w", t.desc, err)
		}
		if t.newRueidis != nil {
			rc, err := t.newRueidis()
			if err != nil {
				return fmt.Errorf("cannot reach %s: %w", t.desc, err)
			}
			t.rclients = append(t.rclients, rc)
		}
		s, err := t.openStore(i, cfg.storeOptions(replicaName(i)))
		if err != nil {
			return err
		}
		t.stores = append(t.stores, s)
	}
	return t.awaitSchema(ctx, t.stores, t.state)
}

// awaitSchema gives stores, opened on the namespace admin set up, time to
// read its schema (see awaitSchema), and notes how many have not.
func (t *target) awaitSchema(ctx context.Context, stores []*store.Store, admin *store.Store) error {
	behind, err := awaitSchema(ctx, stores, admin)
	if behind > 0 {
		t.notes = append(t.notes, fmt.Sprintf("%d of %d replica stores of namespace %q had not read its schema %v after opening "+
			"(their checks run within -op-timeout): until they do, their turns do not continue",
			behind, len(stores), admin.Options().Namespace, schemaWait))
	}
	return err
}

// openStore opens a store with opts on replica i's client.
func (t *target) openStore(i int, opts store.Options) (*store.Store, error) {
	if t.newRueidis != nil {
		return store.NewRueidis(t.rclients[i], opts)
	}
	return store.NewRedis(t.clients[i], opts)
}

// directory returns the directory the replicas of namespace ns announce
// themselves in, as the proxy's do: on Redis, the directory of ns on the
// first replica's client; on the memory backend, one in process.
func (t *target) directory(cfg *config, ns string) (*directory.Directory, error) {
	opts := directory.Options{OpTimeout: cfg.opTimeout}
	if t.newClient == nil {
		return directory.NewMemory(opts)
	}
	if len(t.clients) == 0 {
		return nil, fmt.Errorf("%s: the replicas are not connected", t.desc)
	}
	return directory.NewRedis(t.clients[0], ns, opts)
}

// oneReplica returns the deployment of one replica of cfg on the target's
// backend, with state of its own: on Redis, in a fresh namespace, which
// remove deletes (the embedded Redis goes with the run).
func (t *target) oneReplica(ctx context.Context, cfg *config) (_ deployment, remove func() error, _ error) {
	opts := cfg.storeOptions(replicaName(0))
	remove = func() error { return nil }
	if t.newClient == nil {
		s, err := store.NewMemory(opts)
		if err != nil {
			return deployment{}, nil, err
		}
		dir, err := t.directory(cfg, opts.Namespace)
		return deployment{stores: []*store.Store{s}, state: s, dir: dir}, remove, err
	}
	if len(t.clients) == 0 {
		return deployment{}, nil, fmt.Errorf("%s: the replicas are not connected", t.desc)
	}
	opts.Namespace = freshNamespace()
	admin, err := t.openAdmin(ctx, cfg, opts.Namespace)
	if err != nil {
		return deployment{}, nil, err
	}
	if !t.embedded {
		remove = func() error {
			ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
			defer cancel()
			return rediskeys.DeletePrefix(ctx, t.admin, opts.Namespace+":")
		}
	}
	s, err := t.openStore(0, opts)
	if err != nil {
		return deployment{}, remove, err
	}
	if err := t.awaitSchema(ctx, []*store.Store{s}, admin); err != nil {
		return deployment{}, remove, err
	}
	dir, err := t.directory(cfg, opts.Namespace)
	if err != nil {
		return deployment{}, remove, err
	}
	return deployment{stores: []*store.Store{s}, state: admin, dir: dir}, remove, nil
}

// disconnect closes the replicas' clients and forgets their stores.
func (t *target) disconnect() {
	for _, c := range t.clients {
		_ = c.Close()
	}
	for _, c := range t.rclients {
		c.Close()
	}
	t.clients, t.rclients, t.stores = nil, nil, nil
}

// memoryStores returns one in-process store per replica: what gateways
// that each keep their own state do.
func memoryStores(cfg *config) ([]*store.Store, error) {
	stores := make([]*store.Store, cfg.replicas)
	for i := range stores {
		s, err := store.NewMemory(cfg.storeOptions(replicaName(i)))
		if err != nil {
			return nil, err
		}
		stores[i] = s
	}
	return stores, nil
}

// close removes the namespace's keys unless keep is set, the namespace is
// not this run's or the Redis is the embedded one, then closes the clients
// and the embedded Redis.
func (t *target) close(ctx context.Context, keep bool) error {
	var err error
	if t.owned && !keep && !t.embedded {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
		err = rediskeys.DeletePrefix(ctx, t.admin, t.ns+":")
		cancel()
	}
	t.disconnect()
	if t.admin != nil {
		_ = t.admin.Close()
	}
	if t.stopEmbedded != nil {
		t.stopEmbedded()
	}
	return err
}

// hasServerInfo reports whether the target is a Redis whose INFO figures
// mean something.
func (t *target) hasServerInfo() bool { return t.admin != nil && !t.embedded }

// redactURL returns u without its password.
func redactURL(u string) string {
	p, err := url.Parse(u)
	if err != nil {
		return "(unparsable URL)"
	}
	return p.Redacted()
}

// serverSample is what INFO says at one moment, summed over masters.
type serverSample struct {
	// usedMemory is used_memory; scriptMemory is used_memory_scripts,
	// the part of it that cached scripts and function libraries take.
	usedMemory, scriptMemory int64
	// clients is connected_clients.
	clients int64
	// scriptCalls and scriptUsec count FCALL, EVALSHA and EVAL calls and
	// the microseconds the server spent in them.
	scriptCalls, scriptUsec int64
}

// sample reads used memory, connected clients and the script command
// statistics. It reads INFO commandstats rather than resetting it, so an
// operator's statistics are left alone.
func (t *target) sample(ctx context.Context) (serverSample, error) {
	if !t.hasServerInfo() {
		return serverSample{}, nil
	}
	var (
		mu  sync.Mutex
		sum serverSample
	)
	err := rediskeys.EachServer(ctx, t.admin, func(ctx context.Context, c redis.Cmdable) error {
		var s serverSample
		for _, section := range []string{"memory", "clients", "commandstats"} {
			info, err := c.Info(ctx, section).Result()
			if err != nil {
				return fmt.Errorf("INFO %s: %w", section, err)
			}
			s.parseInfo(info)
		}
		mu.Lock()
		defer mu.Unlock()
		sum.usedMemory += s.usedMemory
		sum.scriptMemory += s.scriptMemory
		sum.clients += s.clients
		sum.scriptCalls += s.scriptCalls
		sum.scriptUsec += s.scriptUsec
		return nil
	})
	return sum, err
}

// parseInfo adds the figures of an INFO reply to s.
func (s *serverSample) parseInfo(info string) {
	for line := range strings.Lines(info) {
		name, value, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok {
			continue
		}
		n, _ := strconv.ParseInt(value, 10, 64)
		switch name {
		case "used_memory":
			s.usedMemory += n
		case "used_memory_scripts":
			s.scriptMemory += n
		case "connected_clients":
			s.clients += n
		case "cmdstat_fcall", "cmdstat_evalsha", "cmdstat_eval":
			for field := range strings.SplitSeq(value, ",") {
				k, v, _ := strings.Cut(field, "=")
				n, _ := strconv.ParseInt(v, 10, 64)
				switch k {
				case "calls":
					s.scriptCalls += n
				case "usec":
					s.scriptUsec += n
				}
			}
		}
	}
}

// dataMemory is used memory less the scripts'.
func (s serverSample) dataMemory() int64 { return s.usedMemory - s.scriptMemory }

// scriptsSince returns the script time spent between an earlier sample
// and s.
func (s serverSample) scriptsSince(earlier serverSample) scriptTime {
	st := scriptTime{Calls: s.scriptCalls - earlier.scriptCalls, Usec: s.scriptUsec - earlier.scriptUsec}
	if st.Calls > 0 {
		st.UsecPerCall = float64(st.Usec) / float64(st.Calls)
	}
	return st
}

// startEmbedded starts the embedded Redis, its clock the wall clock, and
// returns it with the function that stops it.
var startEmbedded = func() (*miniredis.Miniredis, func(), error) {
	mr, err := miniredis.Run()
	if err != nil {
		return nil, nil, err
	}
	stopClock := embedded.FollowRealTime(mr)
	return mr, func() { stopClock(); mr.Close() }, nil
}
