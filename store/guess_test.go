package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/contstore/contstore/identity"
	"github.com/contstore/contstore/internal/redistest"
	"github.com/contstore/contstore/internal/storehooks"
	"github.com/contstore/contstore/store"
	"github.com/contstore/contstore/store/storetest"
)

// A store guesses from its record only while the owner's state surely
// lives: 15/16 of the TTL (Options.TTL) from the turn's reserve, as a
// record does not refresh the state.
func TestAGuessLivesWhileTheStateSurelyDoes(t *testing.T) {
	const ttl = time.Hour
	clock := redistest.NewClock(time.UnixMilli(time.Now().UnixMilli()))
	s, err := store.NewMemory(storehooks.WithClock(store.Options{TTL: ttl, GuessOwners: 4}, clock.Now))
	require.NoError(t, err)
	storetest.OwnersStay(t, s)
	owner, err := identity.Main("session-guess-ttl")
	require.NoError(t, err)
	one, err := s.ParseRequest([]byte(`{"input":[{"role":"user","content":"one"}]}`))
	require.NoError(t, err)
	two, err := s.ParseRequest([]byte(`{"input":[{"role":"user","content":"one"},{"role":"user","content":"two"}]}`))
	require.NoError(t, err)
	for _, c := range []struct {
		idle  time.Duration
		lives bool
	}{{ttl - ttl/16 - time.Millisecond, true}, {ttl - ttl/16, false}} {
		res := s.Reserve(context.Background(), owner, one)
		clock.Add(c.idle / 2) // the upstream answers
		_, err = s.Record(context.Background(), res, store.Result{ResponseID: "resp_1", Socket: store.Socket{Any: true}})
		require.NoError(t, err)
		clock.Add(c.idle - c.idle/2)
		assert.Equal(t, c.lives, s.Guess(owner, two) != nil, "idle %v", c.idle)
	}
}
