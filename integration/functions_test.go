package integration

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/contstore/contstore/identity"
	"github.com/contstore/contstore/internal/lua"
	"github.com/contstore/contstore/internal/redistest"
	"github.com/contstore/contstore/store"
	"github.com/contstore/contstore/store/storetest"
)

// functionClients opens a store over go-redis and over rueidis on the
// servers c reaches.
var functionClients = map[string]func(t *testing.T, c redis.UniversalClient, opts store.Options) (*store.Store, error){
	"go-redis": func(_ *testing.T, c redis.UniversalClient, opts store.Options) (*store.Store, error) {
		return store.NewRedis(c, opts)
	},
	"rueidis": func(t *testing.T, c redis.UniversalClient, opts store.Options) (*store.Store, error) {
		return store.NewRueidis(rueidisOf(t, c), opts)
	},
}

// takeTurns has each of n owners take a turn and then one that continues
// it, and returns the owners.
func takeTurns(t *testing.T, s *store.Store, n int) []identity.Owner {
	t.Helper()
	ctx := context.Background()
	turn := storetest.NewTurn(t, s, 3)
	owners := make([]identity.Owner, n)
	for i := range owners {
		o, err := identity.Main(fmt.Sprintf("functions-%d", i))
		require.NoError(t, err)
		owners[i] = o
		res := s.Reserve(ctx, o, turn.Recorded)
		require.NoError(t, res.Err)
		got, err := s.Record(ctx, res, store.Result{ResponseID: "resp_1", Socket: store.Socket{Replica: "r", ID: 1}})
		require.NoError(t, err)
		require.Equal(t, store.OutcomePublished, got)
		res = s.Reserve(ctx, o, turn.Next)
		require.True(t, res.Continues(), "%s %v", res.Reason, res.Err)
	}
	return owners
}

// hasLibrary reports whether c's server holds lua.Library.
func hasLibrary(t *testing.T, c *redis.Client) bool {
	t.Helper()
	libs, err := c.FunctionList(context.Background(), redis.FunctionListQuery{LibraryNamePattern: lua.Library.Name}).Result()
	require.NoError(t, err)
	return len(libs) == 1
}

// On Redis 7 the scripts run as the functions of lua.Library (FCALL): a
// store loads the library once on a server that lacks it (new, restarted
// or flushed), through either client, and runs nothing by EVAL or EVALSHA.
func TestScriptsRunAsFunctions(t *testing.T) {
	c := privateServer(t)
	ctx := context.Background()
	for name, open := range functionClients {
		t.Run(name, func(t *testing.T) {
			require.NoError(t, c.FunctionFlush(ctx).Err())
			require.NoError(t, c.ConfigResetStat(ctx).Err())
			s, err := open(t, c, store.Options{Namespace: redistest.Namespace(t), OpTimeout: redistest.PatientOpTimeout})
			require.NoError(t, err)
			takeTurns(t, s, 10)
			require.NoError(t, c.FunctionFlush(ctx).Err()) // as a restart without persistence would
			takeTurns(t, s, 10)
			calls := commandStats(t, c)
			require.Equal(t, int64(2), calls["function|load"].calls, "%v", calls)
			require.Zero(t, calls["evalsha"].calls+calls["eval"].calls, "%v", calls)
			require.GreaterOrEqual(t, calls["fcall"].calls, int64(60), "%v", calls)
			require.True(t, hasLibrary(t, c))
		})
	}
}

// A burst of callers that find no library (as after a restart) loads it
// once between them: those that find none while a load is in flight wait
// for it instead of sending the library again.
func TestABurstLoadsTheLibraryOnce(t *testing.T) {
	c := privateServer(t)
	ctx := context.Background()
	const callers = 64
	for name, open := range functionClients {
		t.Run(name, func(t *testing.T) {
			s, err := open(t, c, store.Options{Namespace: redistest.Namespace(t), OpTimeout: redistest.PatientOpTimeout})
			require.NoError(t, err)
			takeTurns(t, s, 1)
			require.NoError(t, c.FunctionFlush(ctx).Err())
			require.NoError(t, c.ConfigResetStat(ctx).Err())
			turn := storetest.NewTurn(t, s, 3)
			start := make(chan struct{})
			var wg sync.WaitGroup
			for i := range callers {
				wg.Go(func() {
					o, err := identity.Main(fmt.Sprintf("burst-%d", i))
					require.NoError(t, err)
					<-start
					res := s.Reserve(ctx, o, turn.Recorded)
					require.NoError(t, res.Err)
				})
			}
			close(start)
			wg.Wait()
			calls := commandStats(t, c)
			require.GreaterOrEqual(t, calls["fcall"].calls, int64(callers), "%v", calls)
			require.LessOrEqual(t, calls["function|load"].calls, int64(callers/8), "%v", calls)
		})
	}
}

// On a cluster the library is loaded on every master: after a flush, a
// store's first call loads it everywhere, and the owners of every
// partition continue.
func TestScriptsRunAsFunctionsOnACluster(t *testing.T) {
	cc := redistest.Cluster(t)
	ctx := context.Background()
	for name, open := range functionClients {
		t.Run(name, func(t *testing.T) {
			require.NoError(t, cc.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error {
				return n.FunctionFlush(ctx).Err()
			}))
			s, err := open(t, cc, store.Options{Namespace: redistest.Namespace(t), OpTimeout: redistest.PatientOpTimeout})
			require.NoError(t, err)
			redistest.CleanupNamespace(t, cc, s.Options().Namespace)
			takeTurns(t, s, 60)
			require.NoError(t, cc.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error {
				if !hasLibrary(t, n) {
					return fmt.Errorf("%s lacks the library", n.Options().Addr)
				}
				return nil
			}))
		})
	}
}

// A user that may not load functions still has a working store: its
// calls go by EVALSHA once the server refused the library.
func TestScriptsRunByEvalWhereFunctionsAreRefused(t *testing.T) {
	admin := privateServer(t)
	ctx := context.Background()
	require.NoError(t, admin.Do(ctx, "ACL", "SETUSER", "gateway", "on", ">secret", "~*", "&*", "+@all", "-function").Err())
	c := redis.NewClient(&redis.Options{Addr: admin.Options().Addr, Username: "gateway", Password: "secret"})
	t.Cleanup(func() { _ = c.Close() })
	for name, open := range functionClients {
		t.Run(name, func(t *testing.T) {
			require.NoError(t, admin.FunctionFlush(ctx).Err())
			require.NoError(t, admin.ConfigResetStat(ctx).Err())
			s, err := open(t, c, store.Options{Namespace: redistest.Namespace(t), OpTimeout: redistest.PatientOpTimeout})
			require.NoError(t, err)
			takeTurns(t, s, 10)
			calls := commandStats(t, admin)
			require.Positive(t, calls["evalsha"].calls, "%v", calls)
			require.LessOrEqual(t, calls["fcall"].calls, int64(1), "%v", calls)
			require.False(t, hasLibrary(t, admin))
		})
	}
}

// On a server over its maxmemory the functions run as the scripts do by
// EVAL: the readers (no-writes) and the sweep (allow-oom) run, and a
// reservation, whose first write would use memory, is refused and fails
// open.
func TestFunctionsRunOutOfMemoryAsScriptsDo(t *testing.T) {
	c := privateServer(t)
	ctx := context.Background()
	for name, open := range functionClients {
		t.Run(name, func(t *testing.T) {
			require.NoError(t, c.ConfigSet(ctx, "maxmemory", "0").Err())
			s, err := open(t, c, store.Options{Namespace: redistest.Namespace(t), OpTimeout: redistest.PatientOpTimeout})
			require.NoError(t, err)
			owners := takeTurns(t, s, 5)
			require.NoError(t, c.ConfigSet(ctx, "maxmemory", "1").Err())
			defer func() { require.NoError(t, c.ConfigSet(ctx, "maxmemory", "0").Err()) }()
			st, err := s.Inspect(ctx, owners[0])
			require.NoError(t, err)
			require.True(t, st.Exists)
			_, err = s.Sweep(ctx)
			require.NoError(t, err)
			res := s.Reserve(ctx, owners[1], storetest.NewTurn(t, s, 3).Next)
			require.ErrorIs(t, res.Err, store.ErrUnavailable)
			require.Equal(t, store.ReasonStoreUnavailable, res.Reason)
		})
	}
}

// While Redis Cluster moves a partition's slot, an owner script is refused
// before it runs (TRYAGAIN): each declares its answer key, which does not
// exist, so none runs on a half-moved slot, where a key it names itself
// (the partition's LRU and accounting, not in its KEYS) may be gone
// already. Here the accounting has moved: a record fails and publishes
// nothing, and so does a reserve.
func TestOwnerScriptsWaitOutASlotMigration(t *testing.T) {
	nodes := startFaultCluster(t, 0)
	addrs, _ := faultAddrs(nodes)
	ctx := context.Background()
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
	t.Cleanup(func() { _ = cc.Close() })
	opts := store.Options{Namespace: redistest.Namespace(t), Partitions: 16, OpTimeout: redistest.PatientOpTimeout}
	moved := map[int]bool{}
	for name, open := range functionClients {
		t.Run(name, func(t *testing.T) {
			s, err := open(t, cc, opts)
			require.NoError(t, err)
			turn := storetest.NewTurn(t, s, 3)
			var o identity.Owner
			for i := 0; o.IsZero() || moved[o.Partition(opts.Partitions)]; i++ {
				o, err = identity.Main(fmt.Sprintf("migrating-%s-%d", name, i))
				require.NoError(t, err)
			}
			moved[o.Partition(opts.Partitions)] = true
			res := s.Reserve(ctx, o, turn.Recorded)
			require.NoError(t, res.Err)

			// Move the partition's accounting to another master, as a
			// reshard does key by key, and leave the slot half moved.
			keys := ownerKeys(opts, []identity.Owner{o})[0]
			part := strings.TrimSuffix(keys.lru, "lru") + "part"
			slot := int(cc.ClusterKeySlot(ctx, part).Val())
			src, err := cc.MasterForKey(ctx, part)
			require.NoError(t, err)
			var (
				mu  sync.Mutex // ForEachMaster calls at once
				dst *redis.Client
			)
			require.NoError(t, cc.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error {
				mu.Lock()
				defer mu.Unlock()
				if n.Options().Addr != src.Options().Addr && dst == nil {
					dst = n
				}
				return nil
			}))
			require.NotNil(t, dst)
			srcID, dstID := src.ClusterMyID(ctx).Val(), dst.ClusterMyID(ctx).Val()
			require.NoError(t, dst.Do(ctx, "CLUSTER", "SETSLOT", slot, "IMPORTING", srcID).Err())
			require.NoError(t, src.Do(ctx, "CLUSTER", "SETSLOT", slot, "MIGRATING", dstID).Err())
			host, port, _ := strings.Cut(dst.Options().Addr, ":")
			require.NoError(t, src.Migrate(ctx, host, port, part, 0, 5*time.Second).Err())

			_, err = s.Record(ctx, res, store.Result{ResponseID: "resp_1", Socket: store.Socket{Replica: "r", ID: 1}})
			require.ErrorIs(t, err, store.ErrUnavailable)
			t0, err := src.HGet(ctx, keys.state, "t").Result()
			require.NoError(t, err)
			require.NotEqual(t, "-", t0[:1], "the refused record published")
			require.Zero(t, src.Exists(ctx, part).Val())
			asking := dst.Conn()
			defer func() { _ = asking.Close() }()
			require.NoError(t, asking.Do(ctx, "ASKING").Err())
			require.Equal(t, int64(1), asking.Exists(ctx, part).Val(), "the accounting stays where the reshard moved it")

			again := s.Reserve(ctx, o, turn.Next)
			require.ErrorIs(t, again.Err, store.ErrUnavailable)
			t1, err := src.HGet(ctx, keys.state, "t").Result()
			require.NoError(t, err)
			require.Equal(t, t0, t1, "the refused reserve changed the state")
		})
	}
}
