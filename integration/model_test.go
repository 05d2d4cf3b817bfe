package integration

import (
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/contstore/contstore/internal/redistest"
	"github.com/contstore/contstore/store"
	"github.com/contstore/contstore/store/storetest"
)

// serverModel checks a real server against the in-process model, both on
// a clock the test moves: the store passes it to the scripts, which judge
// idleness by it. Redis's own key expiry runs on the wall clock, so the TTL
// is an hour, which no case lasts, and the clock's steps keep the default
// ones' proportions to the TTL (a millisecond, 0.3, 0.6 and 2 TTLs). The
// limits are high enough that evictions come from idleness only (miniredis
// covers evictions by limit against the model in package store).
// Every store of the check shares one client: the check opens one store per
// case, hundreds when it shrinks a failure.
func serverModel(t *testing.T, newClient func(testing.TB) redis.UniversalClient) {
	c := newClient(t)
	storetest.CheckModel(t, storetest.ModelConfig{
		Options: store.Options{Partitions: 2, TTL: time.Hour, MaxOwners: 1000, MaxTotalBytes: 1 << 20},
		Steps:   []time.Duration{time.Millisecond, 18 * time.Minute, 36 * time.Minute, 2 * time.Hour},
		Open: func(t *testing.T, opts store.Options) *store.Store {
			redistest.CleanupNamespace(t, c, opts.Namespace)
			s, err := store.NewRedis(c, opts)
			require.NoError(t, err)
			return s
		},
	})
}

func TestRedisMatchesTheModel(t *testing.T)   { serverModel(t, standalone) }
func TestClusterMatchesTheModel(t *testing.T) { serverModel(t, cluster) }
