package storetest

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/contstore/contstore/identity"
	"github.com/contstore/contstore/store"
)

// numbered returns n main owners whose keys sort in creation order and have
// equal lengths, so the LRU order among states touched within the same
// millisecond is still their touch order.
func numbered(t testing.TB, prefix string, n int) []identity.Owner {
	out := make([]identity.Owner, n)
	for i := range out {
		out[i] = mainOwner(t, fmt.Sprintf("%s-%05d", prefix, i))
	}
	return out
}

func exists(t testing.TB, s *store.Store, o identity.Owner) bool {
	t.Helper()
	st, err := s.Inspect(ctx, o)
	require.NoError(t, err)
	return st.Exists
}

// assertSurvivors fails the test unless exactly owners[from:] have state.
func assertSurvivors(t testing.TB, s *store.Store, owners []identity.Owner, from int) {
	t.Helper()
	var wrong []string
	for i, o := range owners {
		if got := exists(t, s, o); got != (i >= from) {
			wrong = append(wrong, fmt.Sprintf("owner %d exists=%v", i, got))
		}
	}
	if len(wrong) > 0 {
		t.Errorf("owners %d to %d should have state and the %d before them none: %s",
			from, len(owners)-1, from, firstOf("owners wrong", wrong, 5))
	}
}

func stats(t testing.TB, s *store.Store) store.Stats {
	t.Helper()
	st, err := s.Stats(ctx)
	require.NoError(t, err)
	return st
}

func testEvictionKeepsMostRecent(t *testing.T, open Opener) {
	s := open(t, store.Options{Partitions: 1, MaxOwners: 100})
	owners := numbered(t, "lru", 150)
	r := req(t, "one")
	for _, o := range owners {
		require.NoError(t, s.Reserve(ctx, o, r).Err)
	}
	assertSurvivors(t, s, owners, 50)
	st := stats(t, s)
	assert.Equal(t, int64(100), st.Total.Owners)
	assert.Equal(t, int64(50), st.Total.Evictions.Owners)
	assert.Zero(t, st.Total.Evictions.TTL+st.Total.Evictions.Bytes)
	assert.Equal(t, 100, st.OwnerLimit)
}

func testTouchMovesToTheBack(t *testing.T, open Opener, clocked Clocked) {
	opts, clock := clocked(t, store.Options{Partitions: 1, MaxOwners: 3})
	s := open(t, opts)
	owners := numbered(t, "touch", 4)
	r := req(t, "one")
	publish(t, s, owners[0], r, "resp_0")
	publish(t, s, owners[1], r, "resp_1")
	publish(t, s, owners[2], r, "resp_2")
	// The oldest takes a turn once its entry is due for a refresh (a
	// sixteenth of the default TTL of 30 minutes): the next eviction takes
	// owners[1].
	clock.Add(30 * time.Minute / 16)
	publish(t, s, owners[0], req(t, "one", "two"), "resp_0b")
	publish(t, s, owners[3], r, "resp_3")
	assert.True(t, exists(t, s, owners[0]))
	assert.False(t, exists(t, s, owners[1]))
	assert.True(t, exists(t, s, owners[2]))
	assert.True(t, exists(t, s, owners[3]))
	assert.Equal(t, int64(3), stats(t, s).Total.Published)
}

func testByteBudgetEvictsOldest(t *testing.T, open Opener) {
	probe := open(t, store.Options{Partitions: 1})
	owners := numbered(t, "bytes", 10)
	r := req(t, "one")
	publish(t, probe, owners[0], r, "resp_probe")
	one := stats(t, probe).Total.StoredBytes
	require.Positive(t, one)
	require.NoError(t, probe.Clear(ctx, owners[0]))
	require.Zero(t, stats(t, probe).Total.StoredBytes, "clearing gives the bytes back")

	// Room for four published owners.
	s := open(t, store.Options{Partitions: 1, MaxTotalBytes: 4*one + one/2})
	for i, o := range owners {
		publish(t, s, o, r, fmt.Sprintf("resp_%05d", i)[:len("resp_probe")])
	}
	assertSurvivors(t, s, owners, 6)
	st := stats(t, s)
	assert.Equal(t, int64(4), st.Total.Owners)
	assert.Equal(t, 4*one, st.Total.StoredBytes)
	assert.Equal(t, int64(6), st.Total.Evictions.Bytes)
	assert.LessOrEqual(t, st.Total.StoredBytes, st.ByteLimit)
}

func testSweepPrunesIdleStates(t *testing.T, open Opener, clocked Clocked) {
	const ttl = time.Hour
	opts, clock := clocked(t, store.Options{Partitions: 4, TTL: ttl})
	s := open(t, opts)
	owners := numbered(t, "sweep", 20)
	r := req(t, "one")
	for _, o := range owners {
		publish(t, s, o, r, "resp_1")
	}
	before := stats(t, s)
	require.Equal(t, int64(20), before.Total.Owners)
	require.Equal(t, int64(20), before.Total.Published)
	require.Len(t, before.Partitions, 4)

	clock.Add(2 * ttl)
	assert.Equal(t, int64(20), stats(t, s).Total.Owners, "idle states stay counted until pruned")
	swept, err := s.Sweep(ctx)
	require.NoError(t, err)
	assert.Equal(t, int64(20), swept.TTL)
	after := stats(t, s)
	assert.Zero(t, after.Total.Owners)
	assert.Zero(t, after.Total.StoredBytes)
	assert.Zero(t, after.Total.Published)
	assert.Equal(t, int64(20), after.Total.Evictions.TTL)

	again, err := s.Sweep(ctx)
	require.NoError(t, err)
	assert.Zero(t, again.Total())
}

func testWritingPrunesIdleStates(t *testing.T, open Opener, clocked Clocked) {
	const ttl = time.Hour
	opts, clock := clocked(t, store.Options{Partitions: 1, TTL: ttl})
	s := open(t, opts)
	owners := numbered(t, "idle", 5)
	r := req(t, "one")
	for _, o := range owners {
		publish(t, s, o, r, "resp_1")
	}
	clock.Add(2 * ttl)
	// Reserving an idle owner again finds its state gone and counts it.
	res := s.Reserve(ctx, owners[0], r)
	assert.Equal(t, store.ReasonMissingState, res.Reason)
	st := stats(t, s)
	assert.Equal(t, int64(1), st.Total.Owners, "the write pruned every idle state")
	assert.Equal(t, int64(5), st.Total.Evictions.TTL)
	assert.Zero(t, st.Total.Published)
}
