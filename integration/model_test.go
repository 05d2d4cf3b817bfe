package integration

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/contstore/contstore/identity"
	"github.com/contstore/contstore/internal/redistest"
	"github.com/contstore/contstore/store"
	"github.com/contstore/contstore/store/storetest"
)

// serverModel checks a real server against the in-process model, both on
// real time: a real server's clock does not move at a test's command, so
// the check takes no time steps, and the TTL is an hour, which no case
// lasts (miniredis, whose clock a test moves, covers idleness, refreshes
// and evictions by limit against the model in package store, and
// TestRealServersKeepStatesOnTheirClock covers a real server's clock). The
// limits are high enough that nothing is evicted. Every store of the
// check shares one client: the check opens one store per case, hundreds
// when it shrinks a failure.
func serverModel(t *testing.T, newClient func(testing.TB) redis.UniversalClient) {
	c := newClient(t)
	storetest.CheckModel(t, storetest.ModelConfig{
		Options: store.Options{Partitions: 2, TTL: time.Hour, MaxOwners: 1000, MaxTotalBytes: 1 << 20},
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

// A real server keeps states on its own clock: a reserve refreshes a state
// that takes a turn more often than its TTL, so it lives on, and one left
// idle for longer than its TTL is gone, its entry counted as a TTL
// eviction. The TTL is short and the margins wide, for a loaded machine.
func TestRealServersKeepStatesOnTheirClock(t *testing.T) {
	onRealServers(t, func(t *testing.T, c redis.UniversalClient, ns string) {
		const ttl = 2 * time.Second
		s, err := store.NewRedis(c, store.Options{Namespace: ns, Partitions: 1, TTL: ttl, OpTimeout: redistest.PatientOpTimeout})
		require.NoError(t, err)
		ctx := context.Background()
		busy, err := identity.Main("busy")
		require.NoError(t, err)
		idle, err := identity.Main("idle")
		require.NoError(t, err)
		turn := func(o identity.Owner, n int) *store.Reservation {
			res := s.Reserve(ctx, o, nil)
			require.NoError(t, res.Err)
			out, err := s.Record(ctx, res, store.Result{ResponseID: "resp_" + string(rune('a'+n%26)), Socket: store.Socket{ID: 1}})
			require.NoError(t, err)
			require.Equal(t, store.OutcomePublished, out)
			return res
		}
		turn(busy, 0)
		turn(idle, 0)
		start := time.Now()
		for n := 1; time.Since(start) < 2*ttl; n++ {
			time.Sleep(ttl / 8)
			assert.NotEqual(t, store.ReasonMissingState, turn(busy, n).Reason, "a busy state lives on past its first TTL")
		}
		st, err := s.Inspect(ctx, idle)
		require.NoError(t, err)
		assert.False(t, st.Exists, "a state idle for longer than its TTL is gone")
		res := turn(idle, 1)
		assert.Equal(t, store.ReasonMissingState, res.Reason)
		stats, err := s.Stats(ctx)
		require.NoError(t, err)
		assert.Equal(t, int64(1), stats.Total.Evictions.TTL)
	})
}
