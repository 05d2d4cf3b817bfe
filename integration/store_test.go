package integration

import (
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/contstore/contstore/internal/redistest"
	"github.com/contstore/contstore/store"
	"github.com/contstore/contstore/store/storetest"
)

// opener returns a conformance opener whose stores each get a client of
// their own from newClient, as separate replicas would.
func opener(newClient func(t testing.TB) redis.UniversalClient) storetest.Opener {
	return func(t *testing.T, opts store.Options) *store.Store {
		c := newClient(t)
		redistest.CleanupNamespace(t, c, opts.Namespace)
		s, err := store.NewRedis(c, opts)
		require.NoError(t, err)
		return s
	}
}

func standalone(t testing.TB) redis.UniversalClient { return redistest.Standalone(t) }
func cluster(t testing.TB) redis.UniversalClient    { return redistest.Cluster(t) }

func TestRedisConformance(t *testing.T) {
	storetest.Run(t, opener(standalone))
}

func TestClusterConformance(t *testing.T) {
	storetest.Run(t, opener(cluster))
}
