package store

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/contstore/contstore/fingerprint"
	"github.com/contstore/contstore/identity"
	"github.com/contstore/contstore/internal/redistest"
)

// servers runs f against miniredis, with its clock stopped, and, when make
// test started one, a real Redis.
func servers(t *testing.T, f func(t *testing.T, c redis.UniversalClient)) {
	t.Run("miniredis", func(t *testing.T) {
		mr, c := redistest.Miniredis(t)
		mr.SetTime(time.Now())
		f(t, c)
	})
	t.Run("redis", func(t *testing.T) {
		c := redistest.Standalone(t)
		f(t, c)
	})
}

func openRedis(t *testing.T, c redis.UniversalClient) (*Store, *redisBackend) {
	ns := redistest.Namespace(t)
	redistest.CleanupNamespace(t, c, ns)
	s, err := NewRedis(c, Options{Namespace: ns, Partitions: 2, OpTimeout: redistest.PatientOpTimeout})
	require.NoError(t, err)
	return s, s.backend.(*redisBackend)
}

// testParser parses the tests' requests; each store parses them again under
// its namespace's key.
var testParser, _ = fingerprint.New(fingerprint.V4(), fingerprint.Key{})

func testRequest(t testing.TB, body string) *fingerprint.Request {
	r, err := testParser.Parse([]byte(body))
	require.NoError(t, err)
	return r
}

// Losing the partition's sequence (a failover to a stale replica, a restart
// without persistence) never makes an owner's tokens go backwards.
func TestTurnsKeepIncreasingAfterSequenceLoss(t *testing.T) {
	servers(t, func(t *testing.T, c redis.UniversalClient) {
		ctx := context.Background()
		s, b := openRedis(t, c)
		owner, _ := identity.Main("seq-loss")
		r := testRequest(t, `{"input":["a"]}`)
		p := owner.Partition(2)
		var last *Reservation
		// Many reservations in a burst run the sequence ahead of the clock
		// (on miniredis, whose clock is stopped, by all 500).
		for range 500 {
			last = s.Reserve(ctx, owner, r)
			require.NoError(t, last.Err)
		}
		require.NoError(t, c.Del(ctx, b.keys.seq(p)).Err(), "the partition's clock")
		after := s.Reserve(ctx, owner, r)
		require.NoError(t, after.Err)
		assert.Greater(t, after.Turn, last.Turn)

		require.NoError(t, c.Del(ctx, b.keys.seq(p), b.keys.part(p)).Err(), "the clock and the accounting")
		again := s.Reserve(ctx, owner, r)
		assert.Greater(t, again.Turn, after.Turn)

		// The turn reserved before the loss cannot publish over the new one.
		out, err := s.Record(ctx, last, Result{ResponseID: "resp_old", Socket: Socket{ID: 1}})
		require.NoError(t, err)
		assert.Equal(t, OutcomeStale, out)
		out, err = s.Record(ctx, again, Result{ResponseID: "resp_new", Socket: Socket{ID: 1}})
		require.NoError(t, err)
		assert.Equal(t, OutcomePublished, out)
	})
}

// A reserve that finds its owner's state idle makes it again, smaller (its
// continuation goes), and evicts idle owners only: its bytes fell, so it
// checks no byte limit, as the in-process model checks none, even when a
// replica with a lower limit finds the partition over it. Time moves
// through the server: miniredis's clock.
func TestReserveOfAnIdleStateChecksNoByteLimit(t *testing.T) {
	mr, c := redistest.Miniredis(t)
	ctx := context.Background()
	ns := redistest.Namespace(t)
	// Half the TTL, which the server's clock jumps, is well below the
	// stores' OpTimeout: a call's deadline, on the store's estimate of the
	// server's clock from before the jump, is still after the server's time.
	// (A jump of the whole OpTimeout left it no later, within a millisecond,
	// and the call was refused.)
	const ttl = 40 * time.Second
	clock := redistest.ServerClock(mr, time.UnixMilli(time.Now().UnixMilli()))
	roomy, err := NewRedis(c, Options{Namespace: ns, Partitions: 1, TTL: ttl, OpTimeout: redistest.PatientOpTimeout})
	require.NoError(t, err)
	r := testRequest(t, `{"input":["a"]}`)
	owners := make([]identity.Owner, 5)
	for i := range owners {
		owners[i], err = identity.Main("idle-bytes-" + string(rune('a'+i)))
		require.NoError(t, err)
		res := roomy.Reserve(ctx, owners[i], r)
		require.NoError(t, res.Err)
		out, err := roomy.Record(ctx, res, Result{ResponseID: "resp_1", Socket: Socket{ID: 1}})
		require.NoError(t, err)
		require.Equal(t, OutcomePublished, out)
		if i == 0 {
			clock.Add(ttl / 2)
		}
	}
	clock.Add(ttl/2 + time.Millisecond) // owners[0] is idle, the others are not
	before, err := roomy.Stats(ctx)
	require.NoError(t, err)

	tight, err := NewRedis(c, Options{Namespace: ns, Partitions: 1, TTL: ttl, MaxTotalBytes: before.Total.StoredBytes / 2, OpTimeout: redistest.PatientOpTimeout})
	require.NoError(t, err)
	res := tight.Reserve(ctx, owners[0], r)
	require.NoError(t, res.Err)
	assert.Equal(t, ReasonMissingState, res.Reason)
	after, err := tight.Stats(ctx)
	require.NoError(t, err)
	assert.Zero(t, after.Total.Evictions.Bytes, "evictions for bytes")
	assert.Equal(t, int64(1), after.Total.Evictions.TTL, "the reserving owner's own idle state")
	assert.Equal(t, int64(len(owners)), after.Total.Owners)
}
