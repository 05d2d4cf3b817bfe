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
	"github.com/contstore/contstore/lua"
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
	s, err := NewRedis(c, Options{Namespace: ns, Partitions: 2})
	require.NoError(t, err)
	return s, s.backend.(*redisBackend)
}

// testParser parses the tests' requests; each store parses them again under
// its namespace's key.
var testParser, _ = fingerprint.New(fingerprint.V2(), fingerprint.Key{})

func testRequest(t testing.TB, body string) *fingerprint.Request {
	r, err := testParser.Parse([]byte(body))
	require.NoError(t, err)
	return r
}

// go-redis re-sends a command whose reply timed out, so a script can run
// twice: each must leave the same state, and a repeated reserve must give
// the first run's answer.
func TestScriptsRunTwiceGiveTheFirstAnswer(t *testing.T) {
	servers(t, func(t *testing.T, c redis.UniversalClient) {
		ctx := context.Background()
		s, b := openRedis(t, c)
		owner, _ := identity.Main("twice")
		first := testRequest(t, `{"input":["a"]}`)
		next := testRequest(t, `{"input":["a","b"]}`)
		res := s.Reserve(ctx, owner, first)
		_, err := s.Record(ctx, res, Result{ResponseID: "resp_1", Socket: Socket{ID: 3}})
		require.NoError(t, err)

		// Reserve: the same nonce twice.
		got1, err := b.reserve(ctx, owner, freshStateBytes(owner), 42)
		require.NoError(t, err)
		got2, err := b.reserve(ctx, owner, freshStateBytes(owner), 42)
		require.NoError(t, err)
		assert.Equal(t, got1.Turn, got2.Turn, "same turn")
		require.NotNil(t, got2.Prev, "the continuation is answered again, not consumed twice")
		assert.Equal(t, got1.Prev, got2.Prev)
		assert.Equal(t, "resp_1", got2.Prev.ResponseID)
		assert.True(t, got2.Existed)
		// A new call (another nonce) sees the state the first run left.
		got3, err := b.reserve(ctx, owner, freshStateBytes(owner), 43)
		require.NoError(t, err)
		assert.Greater(t, got3.Turn, got1.Turn)
		assert.Nil(t, got3.Prev)
		assert.True(t, got3.Existed)

		// Record twice: published both times, one state, accounting once.
		fp, err := next.Transcript(nil)
		require.NoError(t, err)
		cont := continuation{ResponseID: "resp_2", Origin: Socket{Replica: "r", ID: 1}, Signature: next.Signature(), Transcript: fp}
		for range 2 {
			p, err := b.publish(ctx, owner, got3.Turn, cont, publishedStateBytes(owner, cont))
			require.NoError(t, err)
			assert.Equal(t, OutcomePublished, p.Outcome)
		}
		st, err := s.Stats(ctx)
		require.NoError(t, err)
		assert.Equal(t, int64(1), st.Total.Owners)
		assert.Equal(t, int64(1), st.Total.Published)
		assert.Equal(t, publishedStateBytes(owner, cont), st.Total.StoredBytes)
		a, err := s.Audit(ctx)
		require.NoError(t, err)
		assert.Empty(t, a.Problems)

		// Abort twice, clear twice: the state is gone once, accounting intact.
		ok1, err := b.abort(ctx, owner, got3.Turn)
		require.NoError(t, err)
		ok2, err := b.abort(ctx, owner, got3.Turn)
		require.NoError(t, err)
		assert.True(t, ok1)
		assert.False(t, ok2, "the second run finds nothing to abort")
		res = s.Reserve(ctx, owner, first)
		for range 2 {
			_, err := b.clear(ctx, owner)
			require.NoError(t, err)
		}
		st, err = s.Stats(ctx)
		require.NoError(t, err)
		assert.Zero(t, st.Total.Owners)
		assert.Zero(t, st.Total.StoredBytes)
		assert.Zero(t, st.Total.Published)
	})
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
		require.NoError(t, c.HDel(ctx, b.keys.part(p), "seq").Err())
		after := s.Reserve(ctx, owner, r)
		require.NoError(t, after.Err)
		assert.Greater(t, after.Turn, last.Turn)

		require.NoError(t, c.Del(ctx, b.keys.part(p)).Err(), "the whole partition hash")
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

func TestScriptHeadersMatchTheirCallers(t *testing.T) {
	// Every script call goes through lua.Script.Run, which refuses a call
	// whose counts differ from the header; the conformance suite runs every
	// call. This checks the counts themselves did not drift.
	for _, c := range []struct {
		s          *lua.Script
		keys, args int
	}{
		{lua.Reserve, 3, 8}, {lua.Record, 3, 13}, {lua.Abort, 3, 1}, {lua.Clear, 3, 0},
		{lua.Inspect, 2, 0}, {lua.Prune, 2, 4}, {lua.Schema, 1, 4},
	} {
		assert.Equal(t, c.keys, c.s.Keys, c.s.Name)
		assert.Equal(t, c.args, c.s.Args, c.s.Name)
	}
}
