package storetest

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/contstore/contstore/store"
)

// testGuess: a store that keeps guesses (Options.GuessOwners) guesses,
// without a round trip, what Reserve decides when the owner's state is its
// own last record: a reservation that continues alike and reserves
// nothing. A continuation is guessed once, and not after a reserve took
// it; a store that did not make the record, or keeps no guesses, guesses
// nothing; a record on another store makes Reserve disagree with the
// guess; a stale record or abort leaves the later turn's guess.
func testGuess(t *testing.T, open Opener) {
	s := open(t, store.Options{GuessOwners: 2})
	other := open(t, store.Options{GuessOwners: 2}) // another replica on the same state
	plain := open(t, store.Options{})
	owner := mainOwner(t, "session-guess")
	publish(t, s, owner, req(t, "one"), "resp_1")
	next := req(t, "one", "two")
	assert.Nil(t, other.Guess(owner, next), "another store's record")
	assert.Nil(t, plain.Guess(owner, next), "a store without GuessOwners")
	assert.Nil(t, s.Guess(owner, req(t, "other")), "a request the continuation does not continue")
	assert.Nil(t, s.Guess(owner, next), "the continuation was taken by the guess that did not continue")

	publish(t, s, owner, req(t, "one"), "resp_1")
	guess := s.Guess(owner, next)
	require.True(t, guess.Continues(), "%+v", guess)
	assert.Zero(t, guess.Turn, "a guess reserves nothing")
	assert.Nil(t, s.Guess(owner, next), "a continuation is guessed once")
	out, err := s.Record(ctx, guess, store.Result{ResponseID: "resp_guess", Socket: socket(1)})
	require.NoError(t, err)
	assert.Equal(t, store.OutcomeIgnored, out, "a guess records nothing")

	res := s.Reserve(ctx, owner, next)
	require.True(t, res.Continues(), "%+v", res)
	assert.True(t, res.Agrees(guess))
	assert.Equal(t, res.PreviousResponseID, guess.PreviousResponseID)
	assert.Equal(t, res.Delta, guess.Delta)
	assert.Equal(t, string(res.UpstreamBody()), string(guess.UpstreamBody()))
	out, err = s.Record(ctx, res, store.Result{ResponseID: "resp_2", Socket: socket(1)})
	require.NoError(t, err)
	require.Equal(t, store.OutcomePublished, out)

	third := req(t, "one", "two", "three")
	require.True(t, s.Reserve(ctx, owner, third).Continues())
	assert.Nil(t, s.Guess(owner, third), "the reserve took the continuation")

	publish(t, s, owner, third, "resp_3")
	publish(t, other, owner, third, "resp_4")
	fourth := req(t, "one", "two", "three", "four")
	guess = s.Guess(owner, fourth)
	require.True(t, guess.Continues())
	assert.Equal(t, "resp_3", guess.PreviousResponseID)
	res = s.Reserve(ctx, owner, fourth)
	assert.Equal(t, "resp_4", res.PreviousResponseID)
	assert.False(t, res.Agrees(guess), "another store recorded since")

	// A turn's late record or abort, stale, keeps the later turn's guess.
	late := s.Reserve(ctx, owner, fourth)
	later := publish(t, s, owner, fourth, "resp_5")
	out, err = s.Record(ctx, late, store.Result{ResponseID: "resp_late", Socket: socket(1)})
	require.NoError(t, err)
	require.Equal(t, store.OutcomeStale, out)
	aborted, err := s.Abort(ctx, late)
	require.NoError(t, err)
	require.False(t, aborted)
	fifth := req(t, "one", "two", "three", "four", "five")
	guess = s.Guess(owner, fifth)
	require.True(t, guess.Continues(), "the guess of the later turn, %d", later.Turn)
	assert.Equal(t, "resp_5", guess.PreviousResponseID)
	aborted, err = s.Abort(ctx, publish(t, s, owner, fifth, "resp_6"))
	require.NoError(t, err)
	require.True(t, aborted)
	assert.Nil(t, s.Guess(owner, req(t, "one", "two", "three", "four", "five", "six")),
		"nothing to guess once the state is aborted")

	owners := numbered(t, "guessed", 3)
	for _, o := range owners {
		publish(t, s, o, req(t, "one"), "resp_1")
	}
	assert.Nil(t, s.Guess(owners[0], next), "the least recently recorded of three, over GuessOwners")
	assert.True(t, s.Guess(owners[2], next).Continues())
}
