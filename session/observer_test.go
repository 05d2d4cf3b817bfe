package session_test

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/contstore/contstore/internal/redistest"
	"github.com/contstore/contstore/session"
	"github.com/contstore/contstore/session/sessiontest"
)

// events is an Observer that keeps what it sees.
type events struct {
	mu       sync.Mutex
	seen     []session.Event
	breakers []session.BreakerStatus
}

func (e *events) Observe(ev session.Event) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.seen = append(e.seen, ev)
}

func (e *events) BreakerChanged(st session.BreakerStatus) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.breakers = append(e.breakers, st)
}

func (e *events) take() []session.Event {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := e.seen
	e.seen = nil
	return out
}

// A store with an observer behaves exactly as one without.
func TestObservedConformance(t *testing.T) {
	obs := &events{}
	clock := redistest.NewClock(time.Now())
	sessiontest.Run(t, memoryOpener(clock, obs), clock.Add)
	assert.NotEmpty(t, obs.take())
}

// Each operation is reported with the session id, the version the caller
// holds afterwards and the error.
func TestObserverSeesEachOperation(t *testing.T) {
	ctx := context.Background()
	obs := &events{}
	st, err := session.NewMemory(session.Options{MinReplicas: 1, Observer: obs})
	require.NoError(t, err)

	s := session.New("m", "", "")
	s.Messages = []json.RawMessage{json.RawMessage(`{"role":"user","content":"hi"}`)}
	stale := s.Clone()
	require.NoError(t, st.Save(ctx, s))
	require.ErrorIs(t, st.Save(ctx, stale), session.ErrConflict)
	require.ErrorIs(t, st.SaveDurable(ctx, s), session.ErrNotDurable)
	loaded, err := st.Load(ctx, s.ID)
	require.NoError(t, err)
	_, err = st.Load(ctx, "missing")
	require.ErrorIs(t, err, session.ErrNotFound)
	require.NoError(t, st.Delete(ctx, s.ID))
	require.ErrorIs(t, st.Save(ctx, nil), session.ErrInvalid)

	got := obs.take()
	require.Len(t, got, 7)
	for i, want := range []struct {
		op      session.Op
		id      string
		version uint64
		err     error
	}{
		{session.OpSave, s.ID, 1, nil},
		{session.OpSave, s.ID, 0, session.ErrConflict},
		{session.OpSaveDurable, s.ID, 2, session.ErrNotDurable},
		{session.OpLoad, s.ID, loaded.Version, nil},
		{session.OpLoad, "missing", 0, session.ErrNotFound},
		{session.OpDelete, s.ID, 0, nil},
		{session.OpSave, "", 0, session.ErrInvalid},
	} {
		assert.Equal(t, want.op, got[i].Op, "event %d", i)
		assert.Equal(t, want.id, got[i].ID, "event %d", i)
		assert.Equal(t, want.version, got[i].Version, "event %d", i)
		if want.err == nil {
			assert.NoError(t, got[i].Err, "event %d", i)
		} else {
			assert.ErrorIs(t, got[i].Err, want.err, "event %d", i)
		}
	}
	assert.Equal(t, uint64(2), loaded.Version)
}

// After BreakerFailures failed operations in a row the breaker opens: the
// next operations fail at once, without a command sent, until the cooldown
// lets one probe through; the observer sees each change.
func TestBreakerStopsCallingAFailingRedis(t *testing.T) {
	ctx := context.Background()
	obs := &events{}
	var sent atomic.Int64
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:0"})
	t.Cleanup(func() { _ = c.Close() })
	c.AddHook(down{&sent})
	st, err := session.NewRedis(c, session.Options{BreakerFailures: 2, BreakerCooldown: time.Hour, Observer: obs})
	require.NoError(t, err)
	for range 2 {
		_, err := st.Load(ctx, "s")
		require.ErrorIs(t, err, session.ErrUnavailable)
	}
	before := sent.Load()
	require.NotZero(t, before)
	_, err = st.Load(ctx, "s")
	require.ErrorIs(t, err, session.ErrUnavailable)
	assert.Contains(t, err.Error(), "circuit breaker open")
	assert.Equal(t, before, sent.Load(), "no command sent while the breaker is open")
	obs.mu.Lock()
	defer obs.mu.Unlock()
	require.Len(t, obs.breakers, 1)
	assert.EqualValues(t, "open", obs.breakers[0].State)
	assert.Equal(t, 2, obs.breakers[0].ConsecutiveFailures)
}

// Conflicts, missing sessions and invalid input are answers, not failures:
// they never open the breaker.
func TestAnswersDoNotOpenTheBreaker(t *testing.T) {
	ctx := context.Background()
	obs := &events{}
	st, err := session.NewMemory(session.Options{BreakerFailures: 1, Observer: obs})
	require.NoError(t, err)
	s := session.New("m", "", "")
	stale := s.Clone()
	require.NoError(t, st.Save(ctx, s))
	for range 3 {
		require.ErrorIs(t, st.Save(ctx, stale), session.ErrConflict)
		_, err := st.Load(ctx, "missing")
		require.ErrorIs(t, err, session.ErrNotFound)
		bad := s.Clone()
		bad.Messages = append(bad.Messages, json.RawMessage(`{`))
		require.ErrorIs(t, st.Save(ctx, bad), session.ErrInvalid)
	}
	obs.mu.Lock()
	defer obs.mu.Unlock()
	assert.Empty(t, obs.breakers)
}

// down is a go-redis hook that fails every command at once, as for a Redis
// that cannot be reached, and counts them.
type down struct{ sent *atomic.Int64 }

var errDown = errors.New("redis down")

func (d down) DialHook(next redis.DialHook) redis.DialHook { return next }

func (d down) ProcessHook(redis.ProcessHook) redis.ProcessHook {
	return func(_ context.Context, cmd redis.Cmder) error {
		d.sent.Add(1)
		cmd.SetErr(errDown)
		return errDown
	}
}

func (d down) ProcessPipelineHook(redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(_ context.Context, cmds []redis.Cmder) error {
		d.sent.Add(int64(len(cmds)))
		for _, cmd := range cmds {
			cmd.SetErr(errDown)
		}
		return errDown
	}
}
