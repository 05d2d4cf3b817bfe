package storetest

import (
	"encoding/json"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/contstore/contstore/fingerprint"
	"github.com/contstore/contstore/store"
)

// testGuess: a store that keeps guesses (Options.GuessOwners) guesses,
// without a round trip, what Reserve decides when the owner's state is its
// own last record: a reservation that continues alike and reserves
// nothing. A continuation is guessed once, and not after a reserve took
// it; a store that did not make the record, or keeps no guesses, guesses
// nothing; a record on another store makes Reserve disagree with the
// guess, and the owner is guessed again only once two turns in a row found
// it as this store left it; a stale record or abort leaves the later
// turn's continuation, and an abort that removed the state leaves nothing.
func testGuess(t *testing.T, open Opener) {
	s := open(t, store.Options{GuessOwners: 2})
	other := open(t, store.Options{GuessOwners: 2}) // another replica on the same state
	plain := open(t, store.Options{})
	OwnersStay(t, s)
	OwnersStay(t, other)
	owner := mainOwner(t, "session-guess")
	turn := func(n int) *fingerprint.Request { return opening(t, n) }
	record := func(s *store.Store, res *store.Reservation, id string) store.Outcome {
		t.Helper()
		out, err := s.Record(ctx, res, store.Result{ResponseID: id, Socket: socket(1)})
		require.NoError(t, err)
		return out
	}

	publish(t, s, owner, turn(1), "resp_1")
	assert.Nil(t, other.Guess(owner, turn(2)), "another store's record")
	assert.Nil(t, plain.Guess(owner, turn(2)), "a store without GuessOwners")
	assert.Nil(t, s.Guess(owner, req(t, "other")), "a request the continuation does not continue")
	assert.Nil(t, s.Guess(owner, turn(2)), "the guess that did not continue was the one")

	publish(t, s, owner, turn(1), "resp_1")
	guess := s.Guess(owner, turn(2))
	require.True(t, guess.Continues(), "%+v", guess)
	assert.Zero(t, guess.Turn, "a guess reserves nothing")
	assert.Nil(t, s.Guess(owner, turn(2)), "a continuation is guessed once")
	assert.Equal(t, store.OutcomeIgnored, record(s, guess, "resp_guess"), "a guess records nothing")

	res := s.Reserve(ctx, owner, turn(2))
	require.True(t, res.Continues(), "%+v", res)
	assert.True(t, res.Agrees(guess))
	assert.Equal(t, res.PreviousResponseID, guess.PreviousResponseID)
	assert.Equal(t, res.Delta, guess.Delta)
	assert.Equal(t, string(res.UpstreamBody()), string(guess.UpstreamBody()))
	require.Equal(t, store.OutcomePublished, record(s, res, "resp_2"))

	res = s.Reserve(ctx, owner, turn(3))
	require.True(t, res.Continues())
	assert.Nil(t, s.Guess(owner, turn(3)), "the reserve took the continuation")
	require.Equal(t, store.OutcomePublished, record(s, res, "resp_3"))

	// The owner moves to another store and back.
	publish(t, other, owner, turn(3), "resp_4")
	guess = s.Guess(owner, turn(4))
	require.True(t, guess.Continues())
	assert.Equal(t, "resp_3", guess.PreviousResponseID)
	res = s.Reserve(ctx, owner, turn(4))
	assert.Equal(t, "resp_4", res.PreviousResponseID)
	assert.False(t, res.Agrees(guess), "another store recorded since")
	require.Equal(t, store.OutcomePublished, record(s, res, "resp_5"))
	assert.Nil(t, s.Guess(owner, turn(5)), "the turn that recorded it found another store's record")
	publish(t, s, owner, turn(5), "resp_6")
	assert.Nil(t, s.Guess(owner, turn(6)), "moved once, an owner stays after two turns in a row")
	publish(t, s, owner, turn(6), "resp_7")
	require.True(t, s.Guess(owner, turn(7)).Continues(), "two turns found the owner as this store left it")

	// Two turns at once: the first one's late record and abort, stale,
	// leave the second's continuation, which the next turn finds.
	late := s.Reserve(ctx, owner, turn(7))
	later := s.Reserve(ctx, owner, turn(7))
	require.Equal(t, store.OutcomePublished, record(s, later, "resp_8"))
	require.Equal(t, store.OutcomeStale, record(s, late, "resp_late"))
	aborted, err := s.Abort(ctx, late)
	require.NoError(t, err)
	require.False(t, aborted)
	publish(t, s, owner, turn(8), "resp_9")
	guess = s.Guess(owner, turn(9))
	require.True(t, guess.Continues(), "the stale record left the later turn's continuation")
	assert.Equal(t, "resp_9", guess.PreviousResponseID)

	aborted, err = s.Abort(ctx, publish(t, s, owner, turn(9), "resp_10"))
	require.NoError(t, err)
	require.True(t, aborted)
	assert.Nil(t, s.Guess(owner, turn(10)), "nothing to guess once the state is aborted")

	owners := numbered(t, "guessed", 3)
	for _, o := range owners {
		publish(t, s, o, turn(1), "resp_1")
	}
	assert.Nil(t, s.Guess(owners[0], turn(2)), "the least recently recorded of three, over GuessOwners")
	assert.True(t, s.Guess(owners[2], turn(2)).Continues())
}

// testGuessWhileOwnersStay: a store guesses only while owners stay on it.
// A new store guesses nothing until a few turns in a row found an owner as
// it had left it. Once a few turns in a row found another store's record,
// or that of an owner it forgot, it guesses no owner, not even one that
// stays, until owners have stayed again.
func testGuessWhileOwnersStay(t *testing.T, open Opener) {
	s := open(t, store.Options{GuessOwners: 8})
	other := open(t, store.Options{GuessOwners: 8}) // another replica on the same state
	first := mainOwner(t, "session-first")
	publish(t, s, first, opening(t, 1), "resp_1")
	assert.Nil(t, s.Guess(first, opening(t, 2)), "a new store")
	OwnersStay(t, s)
	for _, o := range numbered(t, "moving", 3) {
		publish(t, s, o, opening(t, 1), "resp_1")
		publish(t, other, o, opening(t, 2), "resp_2")
		res := publish(t, s, o, opening(t, 3), "resp_3")
		require.Equal(t, "resp_2", res.PreviousResponseID, "the owner moved")
	}
	owner := mainOwner(t, "session-staying")
	publish(t, s, owner, opening(t, 1), "resp_1")
	assert.Nil(t, s.Guess(owner, opening(t, 2)), "owners moved: a new owner is not guessed")
	publish(t, s, owner, opening(t, 2), "resp_2")
	assert.Nil(t, s.Guess(owner, opening(t, 3)), "one turn stayed since")
	for n := 3; n < 24; n++ {
		publish(t, s, owner, opening(t, n), fmt.Sprint("resp_", n))
	}
	assert.True(t, s.Guess(owner, opening(t, 24)).Continues(), "owners stay again")

	// Owners a store no longer remembers (GuessOwners over) count as
	// moved: it cannot tell where their last turns ran.
	small := open(t, store.Options{GuessOwners: 1})
	OwnersStay(t, small)
	forgotten := numbered(t, "forgotten", 3)
	for n := 1; n <= 2; n++ {
		for _, o := range forgotten {
			publish(t, small, o, opening(t, n), fmt.Sprint("resp_", n))
		}
	}
	fresh := mainOwner(t, "session-fresh")
	publish(t, small, fresh, opening(t, 1), "resp_1")
	assert.Nil(t, small.Guess(fresh, opening(t, 2)), "three turns found owners the store forgot")
}

// testGuessDecidesAsTheState: a guess decides from the continuation as the
// owner's state holds it: a turn whose output has more items with ids
// than the state keeps references for is guessed as the reserve decides,
// not from all of them.
func testGuessDecidesAsTheState(t *testing.T, open Opener) {
	s := open(t, store.Options{GuessOwners: 2})
	OwnersStay(t, s)
	owner := mainOwner(t, "session-many-references")
	var output []json.RawMessage
	next := []string{message("hi")}
	for i := range 8 {
		output = append(output, json.RawMessage(fmt.Sprintf(`{"id":"rs_%d","type":"reasoning","summary":[]}`, i)))
		next = append(next, fmt.Sprintf(`{"type":"item_reference","id":"rs_%d"}`, i))
	}
	next = append(next, message("more"))
	res := s.Reserve(ctx, owner, req(t, "hi"))
	out, err := s.Record(ctx, res, store.Result{ResponseID: "resp_many", Socket: store.Socket{Any: true}, Output: output})
	require.NoError(t, err)
	require.Equal(t, store.OutcomePublished, out)
	guess := s.Guess(owner, parse(t, body("", next...)))
	res = s.Reserve(ctx, owner, parse(t, body("", next...)))
	require.Equal(t, store.ReasonNotAppendOnly, res.Reason, "the state keeps the first references only")
	assert.Nil(t, guess, "guessed from references the state does not keep")
}

// OwnersStay plays 24 turns of an owner of its own on s, one after
// another, as a gateway's turns would, so that a store that keeps guesses
// (store.Options.GuessOwners) finds that owners stay on it and guesses
// (store.Store.Guess).
func OwnersStay(t testing.TB, s *store.Store) {
	t.Helper()
	owner := mainOwner(t, "session-owners-stay")
	const turns = 24
	for n := 1; n <= turns; n++ {
		publish(t, s, owner, opening(t, n), fmt.Sprint("resp_stays_", n))
	}
	require.NotNil(t, s.Guess(owner, opening(t, turns+1)), "owners stay")
}

// opening is the request of a conversation's first n user messages.
func opening(t testing.TB, n int) *fingerprint.Request {
	texts := make([]string, n)
	for i := range texts {
		texts[i] = fmt.Sprint("message ", i+1)
	}
	return req(t, texts...)
}
