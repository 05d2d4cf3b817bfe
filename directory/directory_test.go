package directory

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/contstore/contstore/internal/names"
	"github.com/contstore/contstore/internal/redistest"
)

// backends returns a directory of each kind, with the clock now drives
// (Redis keeps its own: only the cache follows now there).
func backends(t *testing.T, now func() time.Time) map[string]*Directory {
	t.Helper()
	opts := Options{TTL: time.Minute, CacheTTL: time.Second, Now: now}
	mem, err := NewMemory(opts)
	require.NoError(t, err)
	out := map[string]*Directory{"memory": mem}
	_, mr := redistest.Miniredis(t)
	clients := map[string]redis.UniversalClient{"miniredis": mr}
	if !testing.Short() {
		clients["redis"] = redistest.Standalone(t)
		clients["cluster"] = redistest.Cluster(t)
	}
	for name, c := range clients {
		ns := redistest.Namespace(t)
		redistest.CleanupNamespace(t, c, ns)
		d, err := NewRedis(c, ns, opts)
		require.NoError(t, err)
		out[name] = d
	}
	return out
}

func TestAnnouncedReplicasAreFound(t *testing.T) {
	clock := redistest.NewClock(time.Unix(1_800_000_000, 0))
	for name, d := range backends(t, clock.Now) {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			require.NoError(t, d.Announce(ctx, "gw-1", "10.0.0.1:8080"))
			addr, err := d.Lookup(ctx, "gw-1")
			require.NoError(t, err)
			assert.Equal(t, "10.0.0.1:8080", addr)
			addr, err = d.Lookup(ctx, "gw-2")
			require.NoError(t, err)
			assert.Empty(t, addr, "never announced")
			require.NoError(t, d.Announce(ctx, "gw-2", "10.0.0.2:8080"))
			addr, err = d.Lookup(ctx, "gw-2")
			require.NoError(t, err)
			assert.Equal(t, "10.0.0.2:8080", addr, "an absent replica is not cached: announced again, it is found at once")

			require.NoError(t, d.Withdraw(ctx, "gw-1"))
			addr, _ = d.Lookup(ctx, "gw-1")
			assert.Equal(t, "10.0.0.1:8080", addr, "cached for CacheTTL")
			clock.Add(2 * time.Second)
			addr, err = d.Lookup(ctx, "gw-1")
			require.NoError(t, err)
			assert.Empty(t, addr, "withdrawn")
		})
	}
}

func TestAnnouncementsExpireWithoutRenewal(t *testing.T) {
	clock := redistest.NewClock(time.Unix(1_800_000_000, 0))
	d, err := NewMemory(Options{TTL: 3 * time.Second, Now: clock.Now})
	require.NoError(t, err)
	ctx := context.Background()
	require.NoError(t, d.Announce(ctx, "gw-1", "a:1"))
	clock.Add(2 * time.Second)
	addr, _ := d.Lookup(ctx, "gw-1")
	assert.Equal(t, "a:1", addr)
	clock.Add(2 * time.Second)
	addr, _ = d.Lookup(ctx, "gw-1")
	assert.Empty(t, addr, "3 s without renewal")

	// On Redis the announcement is a key with the TTL.
	_, c := redistest.Miniredis(t)
	rd, err := NewRedis(c, "ns", Options{TTL: 3 * time.Second})
	require.NoError(t, err)
	require.NoError(t, rd.Announce(ctx, "gw-1", "a:1"))
	ttl, err := c.PTTL(ctx, "ns:{ns}:replica:"+names.ReplicaRef(names.ReplicaDigest("gw-1"))).Result()
	require.NoError(t, err)
	assert.Equal(t, 3*time.Second, ttl)
}

// A replica is found by its name and by its reference, which is how a
// store names another replica's socket.
func TestLookupTakesAReference(t *testing.T) {
	_, c := redistest.Miniredis(t)
	d, err := NewRedis(c, "ns", Options{})
	require.NoError(t, err)
	ctx := context.Background()
	require.NoError(t, d.Announce(ctx, "gw-1", "a:1"))
	for _, replica := range []string{"gw-1", names.ReplicaRef(names.ReplicaDigest("gw-1"))} {
		addr, err := d.Lookup(ctx, replica)
		require.NoError(t, err)
		assert.Equal(t, "a:1", addr, replica)
	}
	addr, err := d.Lookup(ctx, names.ReplicaRef(names.ReplicaDigest("gw-2")))
	require.NoError(t, err)
	assert.Empty(t, addr)
	require.ErrorIs(t, d.Announce(ctx, "#gw", "a:1"), ErrInvalid, "a name cannot look like a reference")
}

// A failed announcement is retried every TTL/24, not at the next renewal:
// a directory Redis lost names the replica again soon.
func TestRunRetriesAFailedAnnouncementSoon(t *testing.T) {
	mr, c := redistest.Miniredis(t)
	d, err := NewRedis(c, "ns", Options{TTL: 48 * time.Second})
	require.NoError(t, err)
	mr.SetError("CLUSTERDOWN The cluster is down")
	ctx, cancel := context.WithCancel(context.Background())
	failures := make(chan error, 64)
	done := make(chan error, 1)
	go func() {
		done <- d.Run(ctx, "gw-1", "10.0.0.1:8080", func(err error) {
			select {
			case failures <- err:
			default:
			}
		})
	}()
	<-failures
	mr.SetError("")
	key := "ns:{ns}:replica:" + names.ReplicaRef(names.ReplicaDigest("gw-1"))
	assert.Eventually(t, func() bool { return mr.Exists(key) }, 8*time.Second, 50*time.Millisecond,
		"announced within TTL/24 (2 s) of Redis answering, not at the next renewal (16 s)")
	cancel()
	require.NoError(t, <-done)
}

func TestRunRenewsThenWithdraws(t *testing.T) {
	_, c := redistest.Miniredis(t)
	d, err := NewRedis(c, "ns", Options{TTL: 30 * time.Millisecond, CacheTTL: time.Nanosecond})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx, "gw-1", "a:1", nil) }()
	require.Eventually(t, func() bool { addr, _ := d.Lookup(context.Background(), "gw-1"); return addr == "a:1" },
		5*time.Second, time.Millisecond)
	cancel()
	require.NoError(t, <-done)
	n, err := c.Exists(context.Background(), "ns:{ns}:replica:"+names.ReplicaRef(names.ReplicaDigest("gw-1"))).Result()
	require.NoError(t, err)
	assert.Zero(t, n, "withdrawn when Run ends")
}

func TestInvalidArgumentsChangeNothing(t *testing.T) {
	for name, d := range backends(t, time.Now) {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			require.NoError(t, d.Announce(ctx, "gw-1", "a:1"))
			for _, bad := range []struct{ replica, addr string }{
				{"", "a:1"}, {strings.Repeat("r", 257), "a:1"}, {"gw\n1", "a:1"}, {"gw-1", ""}, {"gw-1", "a b"},
			} {
				assert.ErrorIs(t, d.Announce(ctx, bad.replica, bad.addr), ErrInvalid, "%q %q", bad.replica, bad.addr)
			}
			assert.ErrorIs(t, d.Withdraw(ctx, ""), ErrInvalid)
			_, err := d.Lookup(ctx, "")
			assert.ErrorIs(t, err, ErrInvalid)
			addr, err := d.Lookup(ctx, "gw-1")
			require.NoError(t, err)
			assert.Equal(t, "a:1", addr)
		})
	}
	for _, ns := range []string{"", "a b", "{x}", strings.Repeat("n", 65)} {
		_, err := NewRedis(redis.NewClient(&redis.Options{}), ns, Options{})
		assert.ErrorIs(t, err, ErrInvalid, ns)
	}
	for _, o := range []Options{{TTL: -1}, {CacheTTL: -1}, {StaleFor: -1}, {OpTimeout: -1}} {
		_, err := NewMemory(o)
		assert.ErrorIs(t, err, ErrInvalid, "%+v", o)
	}
}

func TestUnreachableRedisIsUnavailable(t *testing.T) {
	d, err := NewRedis(redistest.Failing(t), "ns", Options{OpTimeout: 50 * time.Millisecond})
	require.NoError(t, err)
	assert.ErrorIs(t, d.Announce(context.Background(), "gw-1", "a:1"), ErrUnavailable)
	_, err = d.Lookup(context.Background(), "gw-1")
	assert.ErrorIs(t, err, ErrUnavailable)
}

// While the directory cannot be reached, a lookup answers the address it
// read within StaleFor, and fails once that is older, or when it found
// none.
func TestALookupOfAnUnreachableDirectoryAnswersWhatItReadWithinTTL(t *testing.T) {
	mr, d, now := staleDirectory(t, 6*time.Second)
	ctx := context.Background()
	for _, name := range []string{"gw-1", "gw-2"} {
		_, err := d.Lookup(ctx, name)
		require.NoError(t, err)
	}

	mr.SetError("ERR the directory fails")
	*now = now.Add(5 * time.Second)
	addr, err := d.Lookup(ctx, "gw-1")
	require.NoError(t, err)
	assert.Equal(t, "10.0.0.1:8080", addr)
	for _, name := range []string{"gw-2", "gw-3"} {
		_, err = d.Lookup(ctx, name)
		assert.ErrorIs(t, err, ErrUnavailable, "%s: found absent, or never read", name)
	}

	*now = now.Add(time.Second)
	_, err = d.Lookup(ctx, "gw-1")
	assert.ErrorIs(t, err, ErrUnavailable, "read StaleFor ago")

	mr.SetError("")
	addr, err = d.Lookup(ctx, "gw-1")
	require.NoError(t, err)
	assert.Equal(t, "10.0.0.1:8080", addr)
}

// A replica the directory was last found not to hold (withdrawn, expired)
// does not come back from a stale answer while the directory cannot be
// reached.
func TestAReplicaFoundGoneIsNotAnsweredStale(t *testing.T) {
	mr, d, now := staleDirectory(t, 30*time.Second)
	ctx := context.Background()
	addr, err := d.Lookup(ctx, "gw-1")
	require.NoError(t, err)
	require.Equal(t, "10.0.0.1:8080", addr)
	require.NoError(t, d.Withdraw(ctx, "gw-1"))
	*now = now.Add(2 * time.Second)
	addr, err = d.Lookup(ctx, "gw-1")
	require.NoError(t, err)
	require.Empty(t, addr)

	mr.SetError("CLUSTERDOWN failover")
	*now = now.Add(time.Second)
	addr, err = d.Lookup(ctx, "gw-1")
	assert.ErrorIs(t, err, ErrUnavailable)
	assert.Empty(t, addr, "found gone at the last read")
}

// A stale answer stands for CacheTTL, as a read one does: lookups during
// an outage do not each wait OpTimeout for the directory.
func TestAStaleAnswerStandsForCacheTTL(t *testing.T) {
	mr, d, now := staleDirectory(t, 30*time.Second)
	ctx := context.Background()
	_, err := d.Lookup(ctx, "gw-1")
	require.NoError(t, err)

	mr.SetError("CLUSTERDOWN failover")
	*now = now.Add(2 * time.Second)
	addr, err := d.Lookup(ctx, "gw-1")
	require.NoError(t, err)
	require.Equal(t, "10.0.0.1:8080", addr, "stale")
	mr.SetError("")
	require.NoError(t, d.Announce(ctx, "gw-1", "10.0.0.2:8080"))
	*now = now.Add(time.Second / 2)
	addr, err = d.Lookup(ctx, "gw-1")
	require.NoError(t, err)
	assert.Equal(t, "10.0.0.1:8080", addr, "the stale answer stands, unasked, for CacheTTL")
	*now = now.Add(time.Second)
	addr, err = d.Lookup(ctx, "gw-1")
	require.NoError(t, err)
	assert.Equal(t, "10.0.0.2:8080", addr, "then the directory is asked again")
}

// Run tells failed of one failed announcement every TTL/3 at most, though
// it tries again every TTL/24.
func TestRunReportsFailuresEveryTTLOverThreeAtMost(t *testing.T) {
	mr, c := redistest.Miniredis(t)
	d, err := NewRedis(c, "ns", Options{TTL: 2400 * time.Millisecond})
	require.NoError(t, err)
	mr.SetError("CLUSTERDOWN failover")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	var failures atomic.Int64
	_ = d.Run(ctx, "gw-1", "10.0.0.1:8080", func(error) { failures.Add(1) })
	assert.InDelta(t, 2, failures.Load(), 1, "at 0, 0.8 and 1.6 s at most; tried about 20 times")
}

// staleDirectory returns a directory on Redis (miniredis) with a TTL of
// 2 s, a CacheTTL of 1 s and staleFor, on the clock now, which has gw-1
// announced at 10.0.0.1:8080.
func staleDirectory(t *testing.T, staleFor time.Duration) (*miniredis.Miniredis, *Directory, *time.Time) {
	mr, c := redistest.Miniredis(t)
	now := time.Unix(1_700_000_000, 0)
	d, err := NewRedis(c, "ns", Options{TTL: 2 * time.Second, CacheTTL: time.Second, StaleFor: staleFor, OpTimeout: time.Second,
		Now: func() time.Time { return now }})
	require.NoError(t, err)
	require.NoError(t, d.Announce(context.Background(), "gw-1", "10.0.0.1:8080"))
	return mr, d, &now
}
