package store

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/contstore/contstore/identity"
	"github.com/contstore/contstore/internal/lua"
	"github.com/contstore/contstore/internal/redistest"
)

// lossyReplicas opens two stores on one namespace, as two gateway replicas
// with clients of their own: the first one's client loses the replies loss
// selects and re-sends the command once, as the settings of
// docs/operating.md allow.
// Each of with changes their options.
func lossyReplicas(t *testing.T, addr string, with ...func(*Options)) (*Store, *Store, *redistest.ReplyLoss) {
	loss := &redistest.ReplyLoss{}
	lossy := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: 1, Dialer: loss.Dial})
	plain := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { _ = lossy.Close(); _ = plain.Close() })
	// Loaded first, so that the reply lost is the script's own and not a
	// NOSCRIPT or a "Function not found" before it. A server without
	// functions refuses the library, and one that has it says so.
	for _, s := range lua.All() {
		require.NoError(t, plain.ScriptLoad(ctx, s.Source).Err())
	}
	_ = plain.FunctionLoad(ctx, lua.Library.Source).Err()
	ns := redistest.Namespace(t)
	redistest.CleanupNamespace(t, plain, ns)
	opts := Options{Namespace: ns, Partitions: 2, OpTimeout: 5 * time.Second}
	for _, w := range with {
		w(&opts)
	}
	a, err := NewRedis(lossy, opts)
	require.NoError(t, err)
	b, err := NewRedis(plain, opts)
	require.NoError(t, err)
	return a, b, loss
}

// replyServers runs f against miniredis and, when make test started one, a
// real Redis, with the address a test's clients dial.
func replyServers(t *testing.T, f func(t *testing.T, addr string)) {
	t.Run("miniredis", func(t *testing.T) {
		mr := miniredis.RunT(t)
		f(t, mr.Addr())
	})
	t.Run("redis", func(t *testing.T) {
		f(t, redistest.Standalone(t).Options().Addr)
	})
}

// ownerIn returns a main owner, named after prefix, of partition p of
// partitions.
func ownerIn(t *testing.T, p, partitions int, prefix string) identity.Owner {
	for i := 0; ; i++ {
		o, err := identity.Main(fmt.Sprintf("%s-%d", prefix, i))
		require.NoError(t, err)
		if o.Partition(partitions) == p {
			return o
		}
	}
}

// published reserves and records a turn of owner on s, answered by resp.
func publishedTurn(t *testing.T, s *Store, owner identity.Owner, body, resp string) *Reservation {
	t.Helper()
	res := s.Reserve(ctx, owner, testRequest(t, body))
	require.NoError(t, res.Err)
	out, err := s.Record(ctx, res, Result{ResponseID: resp, Socket: Socket{Any: true}})
	require.NoError(t, err)
	require.Equal(t, OutcomePublished, out)
	return res
}

var ctx = context.Background()

// Each mutating script whose reply is lost after it ran, and which the
// client sends again after another replica changed the owner, answers as
// its first run did and changes nothing the second time.
func TestLostRepliesAnswerAsTheFirstRun(t *testing.T) {
	owner, _ := identity.Main("lost-reply")
	one, two := `{"input":["a"]}`, `{"input":["a","x","b"]}`

	t.Run("reserve", func(t *testing.T) {
		replyServers(t, func(t *testing.T, addr string) {
			a, b, loss := lossyReplicas(t, addr)
			publishedTurn(t, b, owner, one, "resp_1")
			var other *Reservation
			loss.Lose(1, redistest.Calling(lua.Reserve), func() {
				other = b.Reserve(ctx, owner, testRequest(t, two))
			})
			res := a.Reserve(ctx, owner, testRequest(t, two))
			require.Equal(t, int64(1), loss.Lost())
			require.NoError(t, res.Err)
			assert.Equal(t, ReasonSupersededTurn, other.Reason, "the first run consumed the continuation")
			assert.Less(t, res.Turn, other.Turn)
			assert.Equal(t, "resp_1", res.PreviousResponseID, "the re-sent reserve answers the first run's continuation")
			cur, err := b.IsCurrent(ctx, other)
			require.NoError(t, err)
			assert.True(t, cur, "the re-sent reserve changed nothing")
		})
	})
	t.Run("record", func(t *testing.T) {
		replyServers(t, func(t *testing.T, addr string) {
			a, b, loss := lossyReplicas(t, addr)
			res := a.Reserve(ctx, owner, testRequest(t, one))
			require.NoError(t, res.Err)
			var next *Reservation
			loss.Lose(1, redistest.Calling(lua.Record), func() {
				next = b.Reserve(ctx, owner, testRequest(t, two))
			})
			out, err := a.Record(ctx, res, Result{ResponseID: "resp_1", Socket: Socket{Any: true}})
			require.NoError(t, err)
			require.Equal(t, int64(1), loss.Lost())
			assert.Equal(t, "resp_1", next.PreviousResponseID, "another replica continued from the first run")
			assert.Equal(t, OutcomePublished, out, "the re-sent record answers as the first run did")
		})
	})
	t.Run("abort", func(t *testing.T) {
		replyServers(t, func(t *testing.T, addr string) {
			a, _, loss := lossyReplicas(t, addr)
			res := a.Reserve(ctx, owner, testRequest(t, one))
			require.NoError(t, res.Err)
			loss.Lose(1, redistest.Calling(lua.Abort), nil)
			ok, err := a.Abort(ctx, res)
			require.NoError(t, err)
			require.Equal(t, int64(1), loss.Lost())
			assert.True(t, ok, "the re-sent abort answers that it removed the state")
			st, err := a.Inspect(ctx, owner)
			require.NoError(t, err)
			assert.False(t, st.Exists)
		})
	})
	t.Run("clear", func(t *testing.T) {
		replyServers(t, func(t *testing.T, addr string) {
			a, b, loss := lossyReplicas(t, addr)
			publishedTurn(t, b, owner, one, "resp_1")
			var next *Reservation
			loss.Lose(1, redistest.Calling(lua.Clear), func() {
				next = b.Reserve(ctx, owner, testRequest(t, two))
			})
			require.NoError(t, a.Clear(ctx, owner))
			require.Equal(t, int64(1), loss.Lost())
			assert.Equal(t, ReasonMissingState, next.Reason, "the first run cleared")
			cur, err := b.IsCurrent(ctx, next)
			require.NoError(t, err)
			assert.True(t, cur, "the re-sent clear leaves the turn reserved after its first run")
		})
	})
	t.Run("clear of an owner with no state", func(t *testing.T) {
		replyServers(t, func(t *testing.T, addr string) {
			a, b, loss := lossyReplicas(t, addr)
			var next *Reservation
			loss.Lose(1, redistest.Calling(lua.Clear), func() {
				next = b.Reserve(ctx, owner, testRequest(t, one))
			})
			require.NoError(t, a.Clear(ctx, owner))
			require.Equal(t, int64(1), loss.Lost())
			cur, err := b.IsCurrent(ctx, next)
			require.NoError(t, err)
			assert.True(t, cur, "the re-sent clear, whose first run found nothing, leaves the turn reserved since")
		})
	})
	t.Run("record after the next publish", func(t *testing.T) {
		replyServers(t, func(t *testing.T, addr string) {
			a, b, loss := lossyReplicas(t, addr)
			res := a.Reserve(ctx, owner, testRequest(t, one))
			require.NoError(t, res.Err)
			loss.Lose(1, redistest.Calling(lua.Record), func() {
				next := b.Reserve(ctx, owner, testRequest(t, two))
				require.Equal(t, "resp_1", next.PreviousResponseID, "another replica continued from the first run")
				out, err := b.Record(ctx, next, Result{ResponseID: "resp_2", Socket: Socket{Any: true}})
				require.NoError(t, err)
				require.Equal(t, OutcomePublished, out)
			})
			out, err := a.Record(ctx, res, Result{ResponseID: "resp_1", Socket: Socket{Any: true}})
			require.NoError(t, err)
			require.Equal(t, int64(1), loss.Lost())
			assert.Equal(t, OutcomePublished, out, "the re-sent record answers as the first run did")
			st, err := b.Inspect(ctx, owner)
			require.NoError(t, err)
			assert.Equal(t, "resp_2", st.ResponseID, "and changed nothing")
		})
	})
	t.Run("reserve of an owner evicted since", func(t *testing.T) {
		replyServers(t, func(t *testing.T, addr string) {
			a, b, loss := lossyReplicas(t, addr, func(o *Options) { o.MaxOwners = 2 }) // one owner a partition
			publishedTurn(t, b, owner, one, "resp_1")
			neighbour := ownerIn(t, owner.Partition(2), 2, "neighbour")
			loss.Lose(1, redistest.Calling(lua.Reserve), func() {
				publishedTurn(t, b, neighbour, one, "resp_n")
			})
			res := a.Reserve(ctx, owner, testRequest(t, two))
			require.Equal(t, int64(1), loss.Lost())
			require.NoError(t, res.Err)
			assert.Equal(t, "resp_1", res.PreviousResponseID, "the answer of the evicted state's reserve")
			st, err := b.Inspect(ctx, owner)
			require.NoError(t, err)
			assert.False(t, st.Exists, "and the re-sent reserve changed nothing")
		})
	})
	t.Run("reserve after the next publish", func(t *testing.T) {
		replyServers(t, func(t *testing.T, addr string) {
			a, b, loss := lossyReplicas(t, addr)
			publishedTurn(t, b, owner, one, "resp_1")
			loss.Lose(1, redistest.Calling(lua.Reserve), func() {
				publishedTurn(t, b, owner, two, "resp_2")
			})
			res := a.Reserve(ctx, owner, testRequest(t, two))
			require.Equal(t, int64(1), loss.Lost())
			require.NoError(t, res.Err)
			assert.Equal(t, "resp_1", res.PreviousResponseID, "the answer keeps the continuation the first run consumed")
			st, err := b.Inspect(ctx, owner)
			require.NoError(t, err)
			assert.Equal(t, "resp_2", st.ResponseID, "and the re-sent reserve changed nothing")
		})
	})
}
