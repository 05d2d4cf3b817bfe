package integration

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"

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

// commandCalls returns the calls INFO commandstats counts for each command
// since the last CONFIG RESETSTAT.
func commandCalls(t *testing.T, c *redis.Client) map[string]int {
	t.Helper()
	info, err := c.Info(context.Background(), "commandstats").Result()
	require.NoError(t, err)
	calls := map[string]int{}
	for _, line := range strings.Split(info, "\n") {
		name, stats, ok := strings.Cut(strings.TrimPrefix(strings.TrimSpace(line), "cmdstat_"), ":calls=")
		if !ok {
			continue
		}
		n, err := strconv.Atoi(stats[:strings.IndexByte(stats, ',')])
		require.NoError(t, err)
		calls[name] = n
	}
	return calls
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
	srv := startFaultServer(t, false)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { _ = c.Close() })
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
			calls := commandCalls(t, c)
			require.Equal(t, 2, calls["function|load"], "%v", calls)
			require.Zero(t, calls["evalsha"]+calls["eval"], "%v", calls)
			require.GreaterOrEqual(t, calls["fcall"], 60, "%v", calls)
			require.True(t, hasLibrary(t, c))
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
	srv := startFaultServer(t, false)
	admin := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { _ = admin.Close() })
	ctx := context.Background()
	require.NoError(t, admin.Do(ctx, "ACL", "SETUSER", "gateway", "on", ">secret", "~*", "&*", "+@all", "-function").Err())
	c := redis.NewClient(&redis.Options{Addr: srv.Addr(), Username: "gateway", Password: "secret"})
	t.Cleanup(func() { _ = c.Close() })
	for name, open := range functionClients {
		t.Run(name, func(t *testing.T) {
			require.NoError(t, admin.FunctionFlush(ctx).Err())
			require.NoError(t, admin.ConfigResetStat(ctx).Err())
			s, err := open(t, c, store.Options{Namespace: redistest.Namespace(t), OpTimeout: redistest.PatientOpTimeout})
			require.NoError(t, err)
			takeTurns(t, s, 10)
			calls := commandCalls(t, admin)
			require.Positive(t, calls["evalsha"], "%v", calls)
			require.LessOrEqual(t, calls["fcall"], 1, "%v", calls)
			require.False(t, hasLibrary(t, admin))
		})
	}
}
