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
	"github.com/contstore/contstore/identity"
	"github.com/contstore/contstore/internal/embedded"
	"github.com/contstore/contstore/internal/rediskeys"
	"github.com/contstore/contstore/store"
)

// Timeouts of the set-up and clean-up steps.
const (
	connectTimeout = 5 * time.Second
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
		t := &target{desc: "in-process store shared by all replicas"}
		for i := range cfg.replicas {
			t.stores = append(t.stores, base.WithReplica(replicaName(i)))
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
		mr, err := miniredis.Run()
		if err != nil {
			return nil, fmt.Errorf("starting the embedded Redis: %w", err)
		}
		t.desc = "embedded miniredis"
		t.embedded = true
		stopClock := embedded.FollowRealTime(mr)
		t.stopEmbedded = func() { stopClock(); mr.Close() }
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

	ctx, cancel := context.WithTimeout(ctx, connectTimeout)
	defer cancel()
	t.admin = t.newClient()
	if err := t.admin.Ping(ctx).Err(); err != nil {
		return nil, errors.Join(fmt.Errorf("cannot reach %s: %w", t.desc, err), t.close(ctx, true))
	}
	s, err := store.NewRedis(t.admin, cfg.storeOptions("contbench"))
	if err != nil {
		return nil, errors.Join(err, t.close(ctx, true))
	}
	if err := checkEmpty(ctx, s, t.ns); err != nil {
		return nil, errors.Join(err, t.close(ctx, true))
	}
	t.owned = true
	if err := warmUp(ctx, s); err != nil {
		return nil, errors.Join(fmt.Errorf("warming %s up: %w", t.desc, err), t.close(ctx, true))
	}
	return t, nil
}

// checkEmpty returns an error unless the store s of namespace ns holds no
// continuation state.
func checkEmpty(ctx context.Context, s *store.Store, ns string) error {
	st, err := s.Stats(ctx)
	if err != nil {
		return fmt.Errorf("reading namespace %q: %w", ns, err)
	}
	if tot := st.Total; tot.Owners > 0 || tot.StoredBytes > 0 || tot.Evictions.Total() > 0 {
		return fmt.Errorf("namespace %q already holds continuation state (%d owners): give contbench a namespace of its own",
			ns, tot.Owners)
	}
	return nil
}

// warmUp runs each store operation once in every partition, on throwaway
// owners it then removes: a server allocates some memory on its first use
// of each command (the scripts' included), and that is no owner's.
func warmUp(ctx context.Context, s *store.Store) error {
	req, err := s.ParseRequest(probeBody)
	if err != nil {
		return err
	}
	partitions := s.Options().Partitions
	warm := make([]bool, partitions)
	for i, left := 0, partitions; left > 0; i++ {
		owner, err := identity.Main(fmt.Sprintf("contbench-warm-up-%d", i))
		if err != nil {
			return err
		}
		p := owner.Partition(partitions)
		if warm[p] {
			continue
		}
		warm[p] = true
		left--
		if _, err := s.Record(ctx, s.Reserve(ctx, owner, req), probeResult); err != nil {
			return err
		}
		if _, err := s.Abort(ctx, s.Reserve(ctx, owner, req)); err != nil {
			return err
		}
		s.Reserve(ctx, owner, req)
		if err := s.Clear(ctx, owner); err != nil {
			return err
		}
	}
	_, err = s.Sweep(ctx)
	return err
}

// connect opens each replica's client and store on Redis; it does nothing
// for the memory backend.
func (t *target) connect(ctx context.Context, cfg *config) error {
	if t.newClient == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, connectTimeout)
	defer cancel()
	for i := range cfg.replicas {
		c := t.newClient()
		t.clients = append(t.clients, c)
		if err := c.Ping(ctx).Err(); err != nil {
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
	return nil
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

// oneReplica returns the store and the directory of one replica of cfg on
// the target's backend, with state of its own: on Redis, in a fresh
// namespace, which remove deletes (the embedded Redis goes with the run).
func (t *target) oneReplica(ctx context.Context, cfg *config) (_ []*store.Store, _ *directory.Directory, remove func() error, _ error) {
	opts := cfg.storeOptions(replicaName(0))
	remove = func() error { return nil }
	if t.newClient == nil {
		s, err := store.NewMemory(opts)
		if err != nil {
			return nil, nil, nil, err
		}
		dir, err := t.directory(cfg, opts.Namespace)
		return []*store.Store{s}, dir, remove, err
	}
	if len(t.clients) == 0 {
		return nil, nil, nil, fmt.Errorf("%s: the replicas are not connected", t.desc)
	}
	opts.Namespace = freshNamespace()
	s, err := t.openStore(0, opts)
	if err != nil {
		return nil, nil, nil, err
	}
	cctx, cancel := context.WithTimeout(ctx, connectTimeout)
	defer cancel()
	if err := checkEmpty(cctx, s, opts.Namespace); err != nil {
		return nil, nil, nil, err
	}
	dir, err := t.directory(cfg, opts.Namespace)
	if err != nil {
		return nil, nil, nil, err
	}
	if !t.embedded {
		remove = func() error {
			ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
			defer cancel()
			return rediskeys.DeletePrefix(ctx, t.admin, opts.Namespace+":")
		}
	}
	return []*store.Store{s}, dir, remove, nil
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
	// usedMemory is used_memory; scriptMemory is used_memory_scripts_eval,
	// the part of it that cached scripts take.
	usedMemory, scriptMemory int64
	// clients is connected_clients.
	clients int64
	// scriptCalls and scriptUsec count EVALSHA and EVAL calls and the
	// microseconds the server spent in them.
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
		case "used_memory_scripts_eval":
			s.scriptMemory += n
		case "connected_clients":
			s.clients += n
		case "cmdstat_evalsha", "cmdstat_eval":
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

// dataMemory is used memory less the script cache.
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
