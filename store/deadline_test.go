package store

import (
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/contstore/contstore/identity"
	"github.com/contstore/contstore/internal/lua"
	"github.com/contstore/contstore/internal/redisconn"
	"github.com/contstore/contstore/internal/redistest"
	"github.com/contstore/contstore/internal/serverclock"
)

// A call that reaches Redis after its deadline changes nothing and says so
// with the server's clock. When the refusal comes OpTimeout or more after
// the deadline (the store's estimate of the server's clock was that far
// behind, so no copy of the call can have run in time), the store learns
// that clock and, its caller still waiting, sends the call again as a new
// one, which runs; a copy of the refused call that comes later is refused
// as well. A refusal closer to the deadline may follow a copy that ran: it
// is an error, and nothing is sent again.
func TestACallPastItsDeadlineChangesNothing(t *testing.T) {
	servers(t, func(t *testing.T, c redis.UniversalClient) {
		s, b := openRedis(t, c)
		owner, _ := identity.Main("late")
		p, okeys := b.ownerKeys(owner)
		var sent []string
		draw := b.newCallID
		b.newCallID = func(deadline int64) string {
			op := draw(deadline)
			sent = append(sent, op)
			return op
		}
		// behind makes the store's estimate of the server's clock d behind.
		behind := func(d time.Duration) {
			server, err := slice(b.conn.Eval(ctx, lua.Schema, []string{b.keys.meta()}, []string{"0", "0", "", ""}))
			require.NoError(t, err)
			b.servers = serverclock.New(2, nil)
			b.servers.Observe(p, server[4].(int64)-d.Milliseconds())
		}

		behind(redistest.PatientOpTimeout + time.Second)
		res := s.Reserve(ctx, owner, testRequest(t, `{"input":["a"]}`))
		require.ErrorIs(t, res.Err, redisconn.ErrPastDeadline, "a second short of OpTimeout past the deadline")
		assert.Len(t, sent, 1, "not sent again")
		st, err := s.Inspect(ctx, owner)
		require.NoError(t, err)
		assert.False(t, st.Exists, "the refused call changed nothing")

		sent = nil
		behind(redistest.PatientOpTimeout + time.Hour)
		res = s.Reserve(ctx, owner, testRequest(t, `{"input":["a"]}`))
		require.NoError(t, res.Err)
		require.Len(t, sent, 2, "refused an hour past its deadline, then sent again as a new call")
		st, err = s.Inspect(ctx, owner)
		require.NoError(t, err)
		assert.Equal(t, res.Turn, st.Turn, "one turn reserved")
		assert.Zero(t, c.Exists(ctx, b.keys.answer(p, owner, sent[0])).Val(), "the refused call left no answer")

		// The refused call's copy, as a client library re-sends it.
		reply, err := b.conn.Eval(ctx, lua.Reserve, []string{okeys[0], b.keys.answer(p, owner, sent[0])},
			[]string{b.ttl, sent[0], "300", b.limits})
		require.NoError(t, err)
		a, _ := reply.([]any)
		require.Len(t, a, 2)
		assert.Equal(t, "expired", a[0])
		after, err := s.Inspect(ctx, owner)
		require.NoError(t, err)
		assert.Equal(t, st, after, "the copy changed nothing")
	})
}

// A store takes its servers' clock from the namespace's schema check when
// it opens, so a server clock an hour ahead costs nothing. When that clock
// then jumps an hour ahead again, the store loses one round trip to the
// first refusal and carries its deadlines on the new clock after it.
func TestTheStoreLearnsTheServersClock(t *testing.T) {
	mr, c := redistest.Miniredis(t)
	mr.SetTime(time.Now().Add(time.Hour))
	for _, sc := range lua.All() {
		require.NoError(t, c.ScriptLoad(ctx, sc.Source).Err()) // no NOSCRIPT to count
	}
	var calls atomic.Int64 // EVALSHA and EVAL commands
	c.AddHook(redistest.CommandHook(func(cmd redis.Cmder) {
		if name := strings.ToUpper(cmd.Name()); name == "EVALSHA" || name == "EVAL" {
			calls.Add(1)
		}
	}))
	s, err := NewRedis(c, Options{Namespace: "clock", Partitions: 1, OpTimeout: redistest.PatientOpTimeout})
	require.NoError(t, err)
	owner, _ := identity.Main("clock")
	calls.Store(0)
	res := s.Reserve(ctx, owner, testRequest(t, `{"input":["a"]}`))
	require.NoError(t, res.Err)
	assert.Equal(t, int64(1), calls.Load(), "the clock is known from the schema check")

	out, err := s.Record(ctx, res, Result{ResponseID: "resp_1", Socket: Socket{Any: true}})
	require.NoError(t, err)
	assert.Equal(t, OutcomePublished, out)
	assert.Equal(t, int64(2), calls.Load())

	mr.SetTime(time.Now().Add(2 * time.Hour))
	res = s.Reserve(ctx, owner, testRequest(t, `{"input":["a","b"]}`))
	require.NoError(t, res.Err)
	assert.True(t, res.Continues())
	assert.Equal(t, int64(4), calls.Load(), "refused after the jump and sent again")
	_, err = s.Record(ctx, res, Result{ResponseID: "resp_2", Socket: Socket{Any: true}})
	require.NoError(t, err)
	require.NoError(t, s.Reserve(ctx, owner, testRequest(t, `{"input":["a","b","c"]}`)).Err)
	assert.Equal(t, int64(6), calls.Load(), "later calls are not refused")
	b := s.backend.(*redisBackend)
	assert.InDelta(t, time.Now().Add(2*time.Hour+redistest.PatientOpTimeout).UnixMilli()-serverclock.EpochMillis,
		b.servers.Deadline(ctx, 0, redistest.PatientOpTimeout), float64(time.Second.Milliseconds()))
}
