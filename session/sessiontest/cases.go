package sessiontest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/contstore/contstore/identity"
	"github.com/contstore/contstore/session"
)

func testSavedSessionLoadsBackAsSaved(t *testing.T, open Opener) {
	st := open(t, session.Options{})
	s := session.New("model-a", "high", "be brief")
	s.Name, s.ParentSession = "name", "parent"
	s.Messages = []json.RawMessage{msg("user", "hello <world> & more"), json.RawMessage(`{"role": "assistant",  "content": [{"type":"output_text","text":"hi"}]}`)}
	s.Tokens = session.Tokens{Input: 1, Output: 2, CacheRead: 3, CacheCreation: 4}
	s.Cost, s.KeepWarmCost = 0.5, 0.25
	s.KeepWarmTokens = session.Tokens{Input: 1}
	s.Title = "hello <world> & more"

	require.Zero(t, s.Version)
	require.NoError(t, st.Save(ctx, s))
	assert.Equal(t, uint64(1), s.Version)
	got := load(t, st, s.ID)
	same(t, s, got)
	assert.Equal(t, uint64(1), got.Version)
	assert.Equal(t, `{"role":"assistant","content":[{"type":"output_text","text":"hi"}]}`, string(got.Messages[1]), "messages load compact")

	// Saving the loaded copy appends; saving the original again conflicts.
	got.Messages = append(got.Messages, msg("user", "more"))
	require.NoError(t, st.Save(ctx, got))
	assert.Equal(t, uint64(2), got.Version)
	assert.ErrorIs(t, st.Save(ctx, s), session.ErrConflict)
	assert.Len(t, load(t, st, s.ID).Messages, 3)

	// Any other change rewrites.
	got.Messages = got.Messages[1:]
	require.NoError(t, st.Save(ctx, got))
	same(t, got, load(t, st, s.ID))
}

func testModesLoadIdentically(t *testing.T, open Opener) {
	s := session.New("m", "", "")
	s.Messages = messages(5, "line")
	var loaded []*session.Session
	for _, mode := range []session.Mode{session.Snapshot, session.Journal} {
		st := open(t, session.Options{Mode: mode, Namespace: namespace()})
		c := s.Clone()
		require.NoError(t, st.Save(ctx, c))
		loaded = append(loaded, load(t, st, s.ID))
	}
	same(t, loaded[0], loaded[1])
	assert.Equal(t, loaded[0].Messages, loaded[1].Messages)
}

func testMissingSessionIsNotFound(t *testing.T, open Opener) {
	st := open(t, session.Options{})
	_, err := st.Load(ctx, "no-such-session")
	assert.ErrorIs(t, err, session.ErrNotFound)
	assert.Contains(t, err.Error(), "no-such-session")
}

func testDeleteRemovesTheSession(t *testing.T, open Opener) {
	st := open(t, session.Options{})
	s := session.New("m", "", "")
	s.Messages = messages(3, "x")
	require.NoError(t, st.Save(ctx, s))
	require.NoError(t, st.Delete(ctx, s.ID))
	_, err := st.Load(ctx, s.ID)
	assert.ErrorIs(t, err, session.ErrNotFound)
	require.NoError(t, st.Delete(ctx, s.ID), "deleting a missing session is fine")
}

func testInvalidInputWritesNothing(t *testing.T, open Opener) {
	st := open(t, session.Options{})
	s := session.New("m", "", "")
	s.Messages = messages(2, "kept")
	require.NoError(t, st.Save(ctx, s))

	bad := s.Clone()
	bad.Messages = append(bad.Messages, json.RawMessage(`{"broken"`))
	assert.ErrorIs(t, st.Save(ctx, bad), session.ErrInvalid)
	for _, id := range []string{"", "a{b}", "x\ny", strings.Repeat("x", 257)} { // ids are at most 256 bytes
		_, err := st.Load(ctx, id)
		assert.ErrorIs(t, err, session.ErrInvalid, "id %q", id)
		assert.ErrorIs(t, st.Delete(ctx, id), session.ErrInvalid)
	}
	assert.ErrorIs(t, st.Save(ctx, nil), session.ErrInvalid)
	same(t, s, load(t, st, s.ID))
}

func testOneOfTwoConcurrentHeadsWins(t *testing.T, open Opener) {
	a, b := open(t, session.Options{}), open(t, session.Options{})
	s := session.New("m", "", "")
	s.Messages = messages(2, "base")
	require.NoError(t, a.Save(ctx, s))

	ra, rb := load(t, a, s.ID), load(t, b, s.ID)
	ra.Messages = append(ra.Messages, msg("assistant", "from replica a"))
	rb.Messages = append(rb.Messages, msg("assistant", "from replica b"), msg("user", "and more"))
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for i, c := range []struct {
		st *session.Store
		s  *session.Session
	}{{a, ra}, {b, rb}} {
		wg.Go(func() { errs[i] = c.st.Save(ctx, c.s) })
	}
	wg.Wait()
	require.True(t, (errs[0] == nil) != (errs[1] == nil), "exactly one save wins: %v", errs)
	winner, loser := ra, rb
	if errs[0] != nil {
		winner, loser = rb, ra
		require.ErrorIs(t, errs[0], session.ErrConflict)
	} else {
		require.ErrorIs(t, errs[1], session.ErrConflict)
	}
	got := load(t, b, s.ID)
	same(t, winner, got)
	assert.Equal(t, winner.Messages, got.Messages, "byte for byte")
	assert.NotEqual(t, loser.Messages, got.Messages)
	assert.Equal(t, uint64(2), got.Version)
}

// maxUnavailable bounds the operations of one update a writer retries
// after the store did not answer in time.
const maxUnavailable = 10

// Writers on two stores apply 1000 updates, each by load, append and save,
// reloading and applying it again when the save conflicts. They work on ten
// sessions one after another, 100 updates each: every update races all the
// writers as it would on one long session, while a load or a snapshot save
// carries at most 101 messages instead of up to 1001. (The cost of one
// session grows with the square of its updates, the more so on a loaded
// machine, where a writer held from running conflicts and reloads the whole
// history again: one session of 1000 updates took 3 to 14 times as long on
// a quiet machine, and the session package six times as long in all with
// another run beside it.)
func testConcurrentWritersLoseNoUpdate(t *testing.T, open Opener) {
	const writers, sessions, rounds = 8, 10, 100
	stores := []*session.Store{open(t, session.Options{}), open(t, session.Options{})}
	var conflicts, unavailable atomic.Int64
	for i := range sessions {
		writeConcurrently(t, stores, writers, rounds, &conflicts, &unavailable)
		if t.Failed() {
			t.Fatalf("stopped after session %d of %d", i+1, sessions)
		}
	}
	t.Logf("%d updates by %d writers: %d saves conflicted, %d operations found the store unavailable",
		sessions*rounds, writers, conflicts.Load(), unavailable.Load())
}

// writeConcurrently saves a new session, has writers apply rounds updates
// to it through stores, and checks that every update is in it once.
func writeConcurrently(t *testing.T, stores []*session.Store, writers, rounds int, conflicts, unavailableOps *atomic.Int64) {
	t.Helper()
	s := session.New("m", "", "")
	s.Messages = messages(1, "start")
	require.NoError(t, stores[0].Save(ctx, s))

	var mu sync.Mutex
	next := 0
	take := func() int {
		mu.Lock()
		defer mu.Unlock()
		next++
		return next
	}
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			st := stores[w%len(stores)]
			for n := take(); n <= rounds; n = take() {
				update := msg("user", fmt.Sprintf("update %d", n))
				// A writer reloads and re-applies on a conflict. On a store
				// that did not answer in time (a loaded machine) it reloads
				// too: the save may have been written, and then the update
				// is there already.
				for unavailable := 0; ; {
					cur, err := st.Load(ctx, s.ID)
					if errors.Is(err, session.ErrUnavailable) && unavailable < maxUnavailable {
						unavailable++
						unavailableOps.Add(1)
						continue
					}
					if err != nil {
						t.Error(err)
						return
					}
					if slices.ContainsFunc(cur.Messages, func(m json.RawMessage) bool { return bytes.Equal(m, update) }) {
						break
					}
					cur.Messages = append(cur.Messages, update)
					err = st.Save(ctx, cur)
					switch {
					case err == nil:
					case errors.Is(err, session.ErrConflict):
						conflicts.Add(1)
						continue
					case errors.Is(err, session.ErrUnavailable) && unavailable < maxUnavailable:
						unavailable++
						unavailableOps.Add(1)
						continue
					default:
						t.Error(err)
						return
					}
					break
				}
			}
		})
	}
	wg.Wait()
	got := load(t, stores[1], s.ID)
	require.Equal(t, rounds+1, len(got.Messages), "no update was lost")
	assert.Equal(t, uint64(rounds+1), got.Version)
	seen := map[string]bool{}
	for _, m := range got.Messages {
		seen[string(m)] = true
	}
	for n := 1; n <= rounds; n++ {
		assert.True(t, seen[string(msg("user", fmt.Sprintf("update %d", n)))], "update %d", n)
	}
}

// A session not saved for its TTL is gone. The case moves the clock the
// sessions expire on (advance) instead of waiting.
func testIdleSessionExpires(t *testing.T, open Opener, advance func(time.Duration)) {
	const ttl = time.Hour
	st := open(t, session.Options{TTL: ttl})
	s := session.New("m", "", "")
	s.Messages = messages(2, "x")
	require.NoError(t, st.Save(ctx, s))
	advance(ttl - time.Millisecond)
	_, err := st.Load(ctx, s.ID)
	require.NoError(t, err, "a millisecond before the TTL")

	s.Messages = append(s.Messages, msg("user", "again"))
	require.NoError(t, st.Save(ctx, s), "a save refreshes the TTL")
	advance(ttl - time.Millisecond)
	got, err := st.Load(ctx, s.ID)
	require.NoError(t, err, "a millisecond before the TTL of the second save")
	assert.Equal(t, uint64(2), got.Version)
	advance(time.Millisecond)
	_, err = st.Load(ctx, s.ID)
	require.ErrorIs(t, err, session.ErrNotFound, "at the TTL")

	s.Messages = append(s.Messages, msg("user", "late"))
	require.ErrorIs(t, st.Save(ctx, s), session.ErrConflict, "a writer holding the expired session")
	fresh := session.New("m", "", "")
	fresh.ID = s.ID
	fresh.Messages = messages(1, "y")
	require.NoError(t, st.Save(ctx, fresh), "a new session under the expired one's id")
	assert.Equal(t, uint64(1), fresh.Version)
	got, err = st.Load(ctx, s.ID)
	require.NoError(t, err)
	assert.Equal(t, fresh.Messages, got.Messages, "nothing of the expired session is left")
}

func testPersistAcknowledgesOnlyAfterTheDurableWrite(t *testing.T, open Opener) {
	st := open(t, session.Options{})
	old, candidate := fixture()
	require.NoError(t, st.Save(ctx, old))
	candidate.Version = old.Version
	current := old.Clone()
	expected, err := json.Marshal(candidate)
	require.NoError(t, err)

	var head session.ContextHead
	started, release := make(chan struct{}), make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- head.Persist(ctx, func(ctx context.Context, s *session.Session) error {
			close(started)
			<-release
			return st.SaveDurable(ctx, s)
		}, current, old.ID, candidate)
	}()
	<-started
	select {
	case err := <-done:
		t.Fatalf("acknowledged before the write completed: %v", err)
	default:
	}
	assert.True(t, head.IsBlocked(old.ID), "latched while the write is in flight")
	close(release)
	require.NoError(t, <-done)

	got, err := json.Marshal(current)
	require.NoError(t, err)
	assert.JSONEq(t, string(expected), string(got), "the candidate is adopted")
	assert.False(t, head.IsBlocked(current.ID))
	loaded := load(t, st, old.ID)
	assert.Equal(t, candidate.Messages, loaded.Messages)
	assert.Equal(t, "host authority", loaded.SystemPrompt)
	assert.Equal(t, "synthetic-name", loaded.Name)
	assert.Equal(t, uint64(23), loaded.Tokens.Input)
	assert.Equal(t, uint64(7), loaded.Tokens.Output)
	assert.Equal(t, current.AbortContext, loaded.AbortContext)
}

func testIdentityMismatchNeverWritesOrAdopts(t *testing.T, open Opener) {
	st := open(t, session.Options{})
	old, candidate := fixture()
	require.NoError(t, st.Save(ctx, old))
	current := old.Clone()
	before, err := json.Marshal(current)
	require.NoError(t, err)

	var head session.ContextHead
	err = head.Persist(ctx, func(context.Context, *session.Session) error {
		panic("identity rejection must not reach persistence")
	}, current, "another-session", candidate)
	require.ErrorIs(t, err, session.ErrIdentityMismatch)
	require.ErrorIs(t, err, session.ErrInvalid)
	after, err := json.Marshal(current)
	require.NoError(t, err)
	assert.JSONEq(t, string(before), string(after), "nothing adopted")
	assert.True(t, head.IsBlocked(old.ID))
	assert.False(t, head.IsBlocked("new-session"), "the latch is for this session only")
	same(t, old, load(t, st, old.ID))

	err = head.Persist(ctx, st.SaveDurable, current, old.ID, candidate)
	assert.ErrorIs(t, err, session.ErrHeadBlocked, "latched until reloaded")
}

func testCacheTotalsSurviveSaveAndReload(t *testing.T, open Opener) {
	st := open(t, session.Options{})
	s := session.New("synthetic-model", "low", "")
	s.Messages = []json.RawMessage{msg("user", "q")}
	conv := session.NewConversation(s, session.Deps{Store: st, Prices: session.Prices{"synthetic-model": {Input: 1, Output: 2, CacheRead: 0.1, CacheWrite5m: 1.25, CacheWrite1h: 2}}})
	cost, known := conv.AddUsage(session.Usage{Model: "synthetic-model", Tokens: session.Tokens{Input: 120, Output: 40, CacheRead: 85_679, CacheCreation: 6_250}})
	require.True(t, known)
	assert.InDelta(t, (120*1+40*2+85_679*0.1+6_250*1.25)/1e6, cost, 1e-12)
	conv.Session.KeepWarmTokens.CacheRead = 4_000
	conv.Session.KeepWarmTokens.CacheCreation = 9_999 // a stale label, above its total
	wrote, err := conv.Save(ctx)
	require.NoError(t, err)
	require.True(t, wrote, "a non-empty history saves")

	saved := load(t, st, s.ID)
	assert.Equal(t, uint64(85_679), saved.Tokens.CacheRead)
	assert.Equal(t, uint64(6_250), saved.Tokens.CacheCreation)
	resumed := session.NewConversation(saved, session.Deps{Store: st})
	assert.Equal(t, uint64(85_679), resumed.Session.Tokens.CacheRead)
	assert.Equal(t, uint64(6_250), resumed.Session.Tokens.CacheCreation)
	assert.Equal(t, uint64(4_000), resumed.Session.KeepWarmTokens.CacheRead)
	assert.Equal(t, uint64(6_250), resumed.Session.KeepWarmTokens.CacheCreation, "clamped under its total")
}

func testAbortContextBecomesOneMarker(t *testing.T, open Opener) {
	st := open(t, session.Options{})
	interrupted := session.New("synthetic-model", "low", "")
	interrupted.Messages = []json.RawMessage{msg("user", "do X")}
	interrupted.AbortContext = "(System note — ABORT CONTEXT: …)"
	require.NoError(t, st.Save(ctx, interrupted))

	conv := session.NewConversation(load(t, st, interrupted.ID), session.Deps{Store: st})
	assert.Empty(t, conv.Session.AbortContext)
	require.Len(t, conv.Session.Messages, 2)
	var marker struct{ Role, Content string }
	require.NoError(t, json.Unmarshal(conv.Session.Messages[1], &marker))
	assert.Equal(t, session.InterruptionMarker, marker.Content)

	again := session.NewConversation(conv.Session.Clone(), session.Deps{Store: st})
	assert.Equal(t, conv.Session.Messages, again.Session.Messages, "idempotent")
	_, err := conv.Save(ctx)
	require.NoError(t, err)
	reloaded := session.NewConversation(load(t, st, interrupted.ID), session.Deps{Store: st})
	assert.Equal(t, conv.Session.Messages, reloaded.Session.Messages, "a saved marker is not added again")
}

func testErrorAfterPublicationAdoptsAndLatches(t *testing.T, open Opener) {
	st := open(t, session.Options{})
	old, candidate := fixture()
	require.NoError(t, st.Save(ctx, old))
	candidate.Version = old.Version
	conv := session.NewConversation(load(t, st, old.ID), session.Deps{Store: st})
	expected := candidate.Messages

	err := conv.Head.Persist(ctx, func(ctx context.Context, s *session.Session) error {
		if err := st.SaveDurable(ctx, s); err != nil {
			return err
		}
		return errors.New("synthetic error after publication")
	}, conv.Session, old.ID, candidate)
	require.Error(t, err)
	assert.True(t, conv.Head.IsBlocked(conv.Session.ID))
	assert.Equal(t, expected, conv.Session.Messages, "adopted as conservative recovery state")
	assert.Equal(t, expected, load(t, st, old.ID).Messages)

	// Stale repair data must not be saved over the published head.
	conv.Session.Messages = []json.RawMessage{msg("user", "stale")}
	wrote, err := conv.Save(ctx)
	require.NoError(t, err)
	assert.False(t, wrote, "a latched head refuses ordinary saves")
	assert.Equal(t, expected, load(t, st, old.ID).Messages)

	resumed := session.NewConversation(load(t, st, old.ID), session.Deps{Store: st})
	assert.False(t, resumed.Head.IsBlocked(resumed.Session.ID), "reloading clears the latch")
}

func testInterruptedSaveLatchesWithoutTouchingTheOldHead(t *testing.T, open Opener) {
	st := open(t, session.Options{})
	old, candidate := fixture()
	require.NoError(t, st.Save(ctx, old))
	current := old.Clone()
	before, err := json.Marshal(current)
	require.NoError(t, err)

	var head session.ContextHead
	cctx, cancel := context.WithCancel(ctx)
	started := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- head.Persist(cctx, func(ctx context.Context, s *session.Session) error {
			close(started)
			<-ctx.Done() // the write never happens
			return ctx.Err()
		}, current, old.ID, candidate)
	}()
	<-started
	assert.True(t, head.IsBlocked(old.ID), "latched before the write starts")
	same(t, old, load(t, st, old.ID))
	after, err := json.Marshal(current)
	require.NoError(t, err)
	assert.JSONEq(t, string(before), string(after), "the old head is untouched while the write is in flight")
	cancel()
	require.ErrorIs(t, <-done, context.Canceled)
	assert.True(t, head.IsBlocked(old.ID), "still latched after the interruption")
	same(t, old, load(t, st, old.ID))
}

// clearRecorder records the owners whose continuation is cleared.
type clearRecorder struct{ owners []identity.Owner }

func (c *clearRecorder) Clear(_ context.Context, o identity.Owner) error {
	c.owners = append(c.owners, o)
	return nil
}

func testClearSavesAndStartsAFreshSession(t *testing.T, open Opener) {
	st := open(t, session.Options{})
	cleared := &clearRecorder{}
	conv := session.NewConversation(session.New("model-x", "high", "sys"), session.Deps{Store: st, Continuations: cleared})
	conv.Session.Messages = messages(2, "hello")
	conv.AddUsage(session.Usage{Model: "unknown", Tokens: session.Tokens{Input: 10}})
	oldID := conv.Session.ID
	require.NoError(t, conv.Clear(ctx))

	assert.Len(t, load(t, st, oldID).Messages, 2, "the old session was saved")
	assert.NotEqual(t, oldID, conv.Session.ID)
	assert.Equal(t, "model-x", conv.Session.Model)
	assert.Equal(t, "high", conv.Session.ThinkingLevel)
	assert.Equal(t, "sys", conv.Session.SystemPrompt)
	assert.Empty(t, conv.Session.Messages)
	assert.Zero(t, conv.Session.Tokens)
	oldOwner, _ := identity.Main(oldID)
	newOwner, _ := identity.Main(conv.Session.ID)
	assert.Equal(t, []identity.Owner{oldOwner, newOwner}, cleared.owners)
}
