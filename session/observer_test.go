package session_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/contstore/contstore/session"
	"github.com/contstore/contstore/session/sessiontest"
)

// events is an Observer that keeps what it sees.
type events struct {
	mu   sync.Mutex
	seen []session.Event
}

func (e *events) ObserveSession(ev session.Event) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.seen = append(e.seen, ev)
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
	shared := map[string]session.Store{}
	sessiontest.Run(t, func(t *testing.T, opts session.StoreOptions) session.Store {
		key := opts.Namespace + opts.Mode.String() + opts.TTL.String()
		if st, ok := shared[key]; ok {
			return st
		}
		opts.Observer = obs
		st, err := session.NewMemoryStore(opts)
		require.NoError(t, err)
		shared[key] = st
		return st
	})
	assert.NotEmpty(t, obs.take())
}

// Each operation is reported with the session id, the version the caller
// holds afterwards and the error.
func TestObserverSeesEachOperation(t *testing.T) {
	ctx := context.Background()
	obs := &events{}
	st, err := session.NewMemoryStore(session.StoreOptions{MinReplicas: 1, Observer: obs})
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

// Counting failed operations with an ObserverFunc.
func ExampleObserverFunc() {
	var mu sync.Mutex
	failed := map[session.Op]int{}
	st, _ := session.NewMemoryStore(session.StoreOptions{Observer: session.ObserverFunc(func(ev session.Event) {
		if ev.Err != nil {
			mu.Lock()
			failed[ev.Op]++
			mu.Unlock()
		}
	})})

	ctx := context.Background()
	s := session.New("m", "", "")
	stale := s.Clone()
	_ = st.Save(ctx, s)
	_ = st.Save(ctx, stale) // ErrConflict: another writer saved first
	_, _ = st.Load(ctx, "no-such-session")
	fmt.Println(failed)
	// Output: map[load:1 save:1]
}
