package store

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/contstore/contstore/identity"
	"github.com/contstore/contstore/internal/redistest"
	"github.com/contstore/contstore/internal/serverclock"
	"github.com/contstore/contstore/lua"
)

// scriptCalls counts the EVALSHA and EVAL commands a client sends.
type scriptCalls struct{ n atomic.Int64 }

func (s *scriptCalls) DialHook(next redis.DialHook) redis.DialHook { return next }
func (s *scriptCalls) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (s *scriptCalls) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if name := strings.ToUpper(cmd.Name()); name == "EVALSHA" || name == "EVAL" {
			s.n.Add(1)
		}
		return next(ctx, cmd)
	}
}

// A call that reaches Redis after its deadline changes nothing and says so
// with the server's clock; the store, whose caller still waits, learns that
// clock and sends the call again as a new one, which runs. A copy of the
// refused call that comes later is refused as well.
func TestACallPastItsDeadlineChangesNothing(t *testing.T) {
	servers(t, func(t *testing.T, c redis.UniversalClient) {
		s, b := openRedis(t, c)
		owner, _ := identity.Main("late")
		p, okeys := b.ownerKeys(owner)
		var sent []string
		draw := b.newOp
		b.newOp = func(p int) string {
			op := draw(p)
			if len(sent) == 0 {
				op = lua.NewOp(b.servers.Deadline(p, -time.Hour)) // an hour past its deadline
			}
			sent = append(sent, op)
			return op
		}
		res := s.Reserve(ctx, owner, testRequest(t, `{"input":["a"]}`))
		require.NoError(t, res.Err)
		require.Len(t, sent, 2, "refused, then sent again as a new call")
		st, err := s.Inspect(ctx, owner)
		require.NoError(t, err)
		assert.Equal(t, res.Turn, st.Turn, "one turn reserved")
		assert.Zero(t, c.Exists(ctx, b.keys.answer(p, owner, sent[0])).Val(), "the refused call left no answer")

		// The refused call's copy, as a client library re-sends it.
		reply, err := b.conn.eval(ctx, lua.Reserve, append(okeys, b.keys.answer(p, owner, sent[0]), b.keys.seq(p)),
			[]string{b.clock(), b.ttl, sent[0], "300", b.limits})
		require.NoError(t, err)
		a, _ := reply.([]any)
		require.Len(t, a, 2)
		assert.Equal(t, "expired", a[0])
		after, err := s.Inspect(ctx, owner)
		require.NoError(t, err)
		assert.Equal(t, st, after, "the copy changed nothing")
	})
}

// A store whose estimate of the server's clock is far behind (a server
// clock an hour ahead) loses one round trip to the first refusal, then
// carries deadlines on the server's clock.
func TestTheStoreLearnsTheServersClock(t *testing.T) {
	mr, c := redistest.Miniredis(t)
	mr.SetTime(time.Now().Add(time.Hour))
	for _, sc := range lua.All() {
		require.NoError(t, c.ScriptLoad(ctx, sc.Source).Err()) // no NOSCRIPT to count
	}
	calls := &scriptCalls{}
	c.AddHook(calls)
	s, err := NewRedis(c, Options{Namespace: "clock", Partitions: 1, OpTimeout: redistest.PatientOpTimeout})
	require.NoError(t, err)
	owner, _ := identity.Main("clock")
	calls.n.Store(0)
	res := s.Reserve(ctx, owner, testRequest(t, `{"input":["a"]}`))
	require.NoError(t, res.Err)
	assert.Equal(t, int64(2), calls.n.Load(), "the first call is refused and sent again")
	out, err := s.Record(ctx, res, Result{ResponseID: "resp_1", Socket: Socket{Any: true}})
	require.NoError(t, err)
	assert.Equal(t, OutcomePublished, out)
	assert.Equal(t, int64(3), calls.n.Load(), "later calls are not refused")
	b := s.backend.(*redisBackend)
	assert.InDelta(t, time.Now().Add(time.Hour+redistest.PatientOpTimeout).UnixMilli()-serverclock.EpochMillis,
		b.servers.Deadline(0, redistest.PatientOpTimeout), float64(time.Second.Milliseconds()))
}
