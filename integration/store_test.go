package integration

import (
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"
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
	storetest.Run(t, opener(standalone), nil)
}

func TestClusterConformance(t *testing.T) {
	storetest.Run(t, opener(cluster), nil)
}

// rueidisOpener returns a conformance opener whose stores each get a rueidis
// client of their own, on the servers that newClient's clients reach.
func rueidisOpener(newClient func(t testing.TB) redis.UniversalClient) storetest.Opener {
	return func(t *testing.T, opts store.Options) *store.Store {
		c := newClient(t)
		redistest.CleanupNamespace(t, c, opts.Namespace)
		s, err := store.NewRueidis(rueidisOf(t, c), opts)
		require.NoError(t, err)
		return s
	}
}

// newRueidis returns a rueidis client of the servers at addrs, with the
// client cache off as the store wants it, closed when the test ends.
func newRueidis(t testing.TB, addrs ...string) rueidis.Client {
	return newRueidisAs(t, "", "", addrs...)
}

// newRueidisAs is newRueidis for the user username.
func newRueidisAs(t testing.TB, username, password string, addrs ...string) rueidis.Client {
	t.Helper()
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: addrs, DisableCache: true, Username: username, Password: password})
	require.NoError(t, err)
	t.Cleanup(c.Close)
	return c
}

// rueidisOf returns a rueidis client of the servers c reaches, as c's
// user, closed when t ends.
func rueidisOf(t testing.TB, c redis.UniversalClient) rueidis.Client {
	switch c := c.(type) {
	case *redis.Client:
		return newRueidisAs(t, c.Options().Username, c.Options().Password, c.Options().Addr)
	case *redis.ClusterClient:
		return newRueidisAs(t, c.Options().Username, c.Options().Password, c.Options().Addrs...)
	}
	return newRueidis(t)
}

// onRealServers runs f in parallel subtests on a standalone server and on
// a cluster, each with a client and a namespace of its own, which is
// removed when f ends.
func onRealServers(t *testing.T, f func(t *testing.T, c redis.UniversalClient, ns string)) {
	for name, newClient := range map[string]func(testing.TB) redis.UniversalClient{"standalone": standalone, "cluster": cluster} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			c := newClient(t)
			ns := redistest.Namespace(t)
			redistest.CleanupNamespace(t, c, ns)
			f(t, c, ns)
		})
	}
}

func TestRueidisConformance(t *testing.T) {
	storetest.Run(t, rueidisOpener(standalone), nil)
}

func TestRueidisClusterConformance(t *testing.T) {
	storetest.Run(t, rueidisOpener(cluster), nil)
}
