package store_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/contstore/contstore/internal/redistest"
	"github.com/contstore/contstore/store"
	"github.com/contstore/contstore/store/storetest"
)

func TestMemoryConformance(t *testing.T) {
	// Stores opened in one namespace with the same options but the replica
	// share one in-process backend, as replicas share one Redis.
	shared := map[string]*store.Store{}
	storetest.Run(t, func(t *testing.T, opts store.Options) *store.Store {
		same := opts
		same.Replica, same.Now = "", nil
		key := fmt.Sprintf("%+v", same)
		if s, ok := shared[key]; ok {
			return s.WithReplica(opts.Replica)
		}
		s, err := store.NewMemory(opts)
		require.NoError(t, err)
		shared[key] = s
		return s
	})
}

func TestMiniredisConformance(t *testing.T) {
	mr, _ := redistest.Miniredis(t)
	redistest.FollowRealTime(t, mr)
	storetest.Run(t, func(t *testing.T, opts store.Options) *store.Store {
		c := redis.NewClient(&redis.Options{Addr: mr.Addr()})
		t.Cleanup(func() { _ = c.Close() })
		redistest.CleanupNamespace(t, c, opts.Namespace)
		s, err := store.NewRedis(c, opts)
		require.NoError(t, err)
		return s
	})
}

// The Redis scripts on miniredis, its keys expiring as the store's clock
// moves, behave as the in-process model, limits and evictions included.
// The server's clock (TIME) keeps real time, as a server's does while the
// store's clock jumps: the scripts take the store's (ARGV[1]) for states.
func TestMiniredisMatchesTheModel(t *testing.T) {
	mr, c := redistest.Miniredis(t)
	storetest.CheckModel(t, storetest.ModelConfig{
		Options: store.Options{Partitions: 2, TTL: 10*time.Second + 7*time.Millisecond, MaxOwners: 6, MaxTotalBytes: 1400},
		Open: func(t *testing.T, opts store.Options) *store.Store {
			s, err := store.NewRedis(c, opts)
			require.NoError(t, err)
			return s
		},
		Advance: func(_ time.Time, d time.Duration) { mr.FastForward(d) },
	})
}
