package store_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/alicebob/miniredis/v2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/contstore/contstore/fingerprint"
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
	one, two := userMessages(t, s, "one"), userMessages(t, s, "one", "two")
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

// A store guesses nothing for an owner whose partition's breaker is not
// closed: its reserve would fail open, and the turn record nothing. Once
// Redis answers again and a record publishes, it guesses again.
func TestNoGuessWhileTheBreakerIsOpen(t *testing.T) {
	mr, c := redistest.Miniredis(t)
	clk := redistest.NewClock(time.Now())
	s, err := store.NewRedis(c, storehooks.WithClock(store.Options{Partitions: 1, BreakerFailures: 1, GuessOwners: 4}, clk.Now))
	require.NoError(t, err)
	storetest.OwnersStay(t, s)
	ctx := context.Background()
	owner, err := identity.Main("session-breaker")
	require.NoError(t, err)
	other, err := identity.Main("session-breaker-other")
	require.NoError(t, err)
	one, two := userMessages(t, s, "one"), userMessages(t, s, "one", "two")
	_, err = s.Record(ctx, s.Reserve(ctx, owner, one), store.Result{ResponseID: "resp_1", Socket: store.Socket{Any: true}})
	require.NoError(t, err)

	mr.SetError("LOADING Redis is loading the dataset in memory")
	assert.Equal(t, store.ReasonStoreUnavailable, s.Reserve(ctx, other, one).Reason) // opens the breaker
	assert.Nil(t, s.Guess(owner, two), "the breaker is open")
	mr.SetError("")
	clk.Add(time.Second) // past the cooldown: the next call probes
	assert.Nil(t, s.Guess(owner, two), "cooled down, but no call probed Redis yet")
	require.Equal(t, store.ReasonMissingState, s.Reserve(ctx, other, one).Reason, "the probe closes the breaker")
	assert.True(t, s.Guess(owner, two).Continues(), "closed")
}

// A reserve that fails withdraws the owner's guess, but not its stay: the
// owner's next turn finds the store's continuation as the store left it,
// and the turn after is guessed.
func TestAFailedReserveKeepsTheOwnersStay(t *testing.T) {
	mr, s, owner := guessingStore(t, "session-failed-reserve")
	ctx := context.Background()
	turn := func(texts ...string) *fingerprint.Request { return userMessages(t, s, texts...) }
	record := func(res *store.Reservation, id string) {
		t.Helper()
		out, err := s.Record(ctx, res, store.Result{ResponseID: id, Socket: store.Socket{Any: true}})
		require.NoError(t, err)
		require.Equal(t, store.OutcomePublished, out)
	}
	record(s.Reserve(ctx, owner, turn("one")), "resp_1")

	mr.SetError("LOADING Redis is loading the dataset in memory")
	require.Equal(t, store.ReasonStoreUnavailable, s.Reserve(ctx, owner, turn("one", "two")).Reason)
	mr.SetError("")
	assert.Nil(t, s.Guess(owner, turn("one", "two")), "the failed reserve may have consumed it")
	res := s.Reserve(ctx, owner, turn("one", "two"))
	require.True(t, res.Continues(), "%s", res.Reason)
	record(res, "resp_2")
	assert.True(t, s.Guess(owner, turn("one", "two", "three")).Continues(), "the owner stayed")
}

// guessingStore returns a store on miniredis that guesses, having found
// that owners stay, the miniredis, and the owner of session.
func guessingStore(t *testing.T, session string) (*miniredis.Miniredis, *store.Store, identity.Owner) {
	t.Helper()
	mr, c := redistest.Miniredis(t)
	s, err := store.NewRedis(c, store.Options{GuessOwners: 4})
	require.NoError(t, err)
	storetest.OwnersStay(t, s)
	owner, err := identity.Main(session)
	require.NoError(t, err)
	return mr, s, owner
}

// userMessages parses, on s, a request of user messages with texts.
func userMessages(t *testing.T, s *store.Store, texts ...string) *fingerprint.Request {
	t.Helper()
	items := make([]string, len(texts))
	for i, text := range texts {
		items[i] = fmt.Sprintf(`{"role":"user","content":%q}`, text)
	}
	r, err := s.ParseRequest([]byte(`{"input":[` + strings.Join(items, ",") + `]}`))
	require.NoError(t, err)
	return r
}

// A record keeps its response id apart from the answer it was read from
// (a gateway takes it from the upstream's answer, whose memory it may
// share): what the store keeps of a turn is its id, never the answer.
func TestARecordKeepsTheIDNotTheAnswer(t *testing.T) {
	s, err := store.NewMemory(store.Options{GuessOwners: 4})
	require.NoError(t, err)
	storetest.OwnersStay(t, s)
	owner, err := identity.Main("session-answer")
	require.NoError(t, err)
	answer := `{"id":"resp_kept","output":"` + strings.Repeat("x", 1<<20) + `"}`
	id := answer[7:16]
	require.Equal(t, "resp_kept", id)
	inAnswer := func(s string) bool {
		p, a := uintptr(unsafe.Pointer(unsafe.StringData(s))), uintptr(unsafe.Pointer(unsafe.StringData(answer)))
		return p >= a && p < a+uintptr(len(answer))
	}
	one, two := userMessages(t, s, "one"), userMessages(t, s, "one", "two")
	res := s.Reserve(context.Background(), owner, one)
	_, err = s.Record(context.Background(), res, store.Result{ResponseID: id, Socket: store.Socket{Any: true}})
	require.NoError(t, err)
	guess := s.Guess(owner, two)
	require.NotNil(t, guess)
	assert.Equal(t, id, guess.PreviousResponseID)
	assert.False(t, inAnswer(guess.PreviousResponseID), "the guess keeps the answer")
	next := s.Reserve(context.Background(), owner, two)
	require.True(t, next.Continues(), "%s", next.Reason)
	assert.False(t, inAnswer(next.PreviousResponseID), "the state keeps the answer")
}

// A turn sent on its guess adopts it when its reservation decided
// nothing: with the owner's state gone, the adopted reservation continues
// as the guess does and records under the turn reserved, so the next turn
// continues; when the store fails, the guess itself, which records
// nothing. A reservation that agrees with the guess is kept.
func TestAReservationThatDecidedNothingAdoptsTheGuess(t *testing.T) {
	mr, s, owner := guessingStore(t, "session-adopt")
	ctx := context.Background()
	one, two, three := userMessages(t, s, "one"), userMessages(t, s, "one", "two"), userMessages(t, s, "one", "two", "three")
	_, err := s.Record(ctx, s.Reserve(ctx, owner, one), store.Result{ResponseID: "resp_1", Socket: store.Socket{Any: true}})
	require.NoError(t, err)

	guess := s.Guess(owner, two)
	require.True(t, guess.Continues())
	mr.FlushAll() // the state is gone
	res := s.Reserve(ctx, owner, two)
	require.Equal(t, store.ReasonMissingState, res.Reason)
	adopted := res.Adopt(guess)
	require.True(t, adopted.Continues())
	assert.Equal(t, "resp_1", adopted.PreviousResponseID)
	assert.Equal(t, res.Turn, adopted.Turn, "under the turn reserved")
	got, err := s.Record(ctx, adopted, store.Result{ResponseID: "resp_2", Socket: store.Socket{Any: true}})
	require.NoError(t, err)
	assert.Equal(t, store.OutcomePublished, got)
	next := s.Reserve(ctx, owner, three)
	assert.Equal(t, "resp_2", next.PreviousResponseID, "%s", next.Reason)

	unavailable := &store.Reservation{Owner: owner, Reason: store.ReasonStoreUnavailable}
	assert.Same(t, guess, unavailable.Adopt(guess))
	assert.Same(t, next, next.Adopt(next), "a reservation that agrees")
	assert.Same(t, next, next.Adopt(unavailable), "a guess that does not continue")
}

// A turn sent on its guess adopts it when its reservation disagrees:
// another store served the owner since. The guess still continues a
// response the upstream keeps, of which the request is an append-only
// extension: the adopted reservation continues from it under the turn
// reserved, and gives back, restored, the continuation the reservation
// took.
func TestAReservationThatDisagreesAdoptsTheGuess(t *testing.T) {
	_, c := redistest.Miniredis(t)
	ctx := context.Background()
	open := func() *store.Store {
		s, err := store.NewRedis(c, store.Options{GuessOwners: 4})
		require.NoError(t, err)
		storetest.OwnersStay(t, s)
		return s
	}
	s, other := open(), open()
	for i, then := range []string{"recorded", "restored"} {
		owner, err := identity.Main(fmt.Sprint("session-moved-", i))
		require.NoError(t, err)
		_, err = s.Record(ctx, s.Reserve(ctx, owner, userMessages(t, s, "one")), store.Result{ResponseID: "resp_1", Socket: store.Socket{Any: true}})
		require.NoError(t, err)
		_, err = other.Record(ctx, other.Reserve(ctx, owner, userMessages(t, s, "one", "two")), store.Result{ResponseID: "resp_2", Socket: store.Socket{Any: true}})
		require.NoError(t, err)

		three := userMessages(t, s, "one", "two", "three")
		guess := s.Guess(owner, three)
		require.True(t, guess.Continues())
		require.Equal(t, "resp_1", guess.PreviousResponseID)
		res := s.Reserve(ctx, owner, three)
		require.Equal(t, "resp_2", res.PreviousResponseID, "%s", res.Reason)
		require.False(t, res.Agrees(guess))
		adopted := res.Adopt(guess)
		require.True(t, adopted.Continues())
		assert.Equal(t, "resp_1", adopted.PreviousResponseID)
		assert.Len(t, adopted.Delta, 2)
		assert.Equal(t, res.Turn, adopted.Turn, "under the turn reserved")

		four := userMessages(t, s, "one", "two", "three", "four")
		switch then {
		case "recorded":
			got, err := s.Record(ctx, adopted, store.Result{ResponseID: "resp_3", Socket: store.Socket{Any: true}})
			require.NoError(t, err)
			assert.Equal(t, store.OutcomePublished, got)
			assert.Equal(t, "resp_3", other.Reserve(ctx, owner, four).PreviousResponseID)
		case "restored":
			got, err := s.Restore(ctx, adopted)
			require.NoError(t, err)
			assert.Equal(t, store.OutcomePublished, got)
			assert.Equal(t, "resp_2", other.Reserve(ctx, owner, four).PreviousResponseID, "the continuation the reservation took")
		}
	}
}
