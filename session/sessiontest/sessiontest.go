// Package sessiontest is the conformance suite every session store passes:
// in process, miniredis, real Redis and Redis Cluster, on go-redis and
// rueidis.
package sessiontest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/contstore/contstore/session"
)

// Opener returns a store for opts. Each test gives its own fresh
// Options.Namespace and may open several stores in it (as replicas would):
// they must share their sessions. The opener cleans the namespace up.
type Opener func(t *testing.T, opts session.Options) *session.Store

// Run runs every conformance test in both persistence modes. advance moves
// the clock the stores' sessions expire on (the server's, or the
// in-process store's) d later; nil for a server whose clock a test cannot
// move: the test that needs it then does not run (it runs on miniredis,
// which runs the same scripts).
func Run(t *testing.T, open Opener, advance func(d time.Duration)) {
	t.Run("ModesLoadIdentically", func(t *testing.T) { testModesLoadIdentically(t, open) })
	for _, mode := range []session.Mode{session.Snapshot, session.Journal} {
		t.Run(mode.String(), func(t *testing.T) {
			// in gives each test a namespace of its own in mode.
			in := func(open Opener) Opener {
				ns := namespace()
				return func(t *testing.T, opts session.Options) *session.Store {
					opts.Namespace, opts.Mode = ns, mode
					return open(t, opts)
				}
			}
			for _, c := range cases {
				t.Run(c.name, func(t *testing.T) { c.run(t, in(open)) })
			}
			if advance != nil {
				t.Run("IdleSessionExpires", func(t *testing.T) { testIdleSessionExpires(t, in(open), advance) })
			}
		})
	}
}

var ctx = context.Background()

var cases = []struct {
	name string
	run  func(*testing.T, Opener)
}{
	{"SavedSessionLoadsBackAsSaved", testSavedSessionLoadsBackAsSaved},
	{"MissingSessionIsNotFound", testMissingSessionIsNotFound},
	{"DeleteRemovesTheSession", testDeleteRemovesTheSession},
	{"InvalidInputWritesNothing", testInvalidInputWritesNothing},
	{"OneOfTwoConcurrentHeadsWins", testOneOfTwoConcurrentHeadsWins},
	{"ConcurrentWritersLoseNoUpdate", testConcurrentWritersLoseNoUpdate},
	{"PersistAcknowledgesOnlyAfterTheDurableWrite", testPersistAcknowledgesOnlyAfterTheDurableWrite},
	{"IdentityMismatchNeverWritesOrAdopts", testIdentityMismatchNeverWritesOrAdopts},
	{"CacheTotalsSurviveSaveAndReload", testCacheTotalsSurviveSaveAndReload},
	{"AbortContextBecomesOneMarker", testAbortContextBecomesOneMarker},
	{"ErrorAfterPublicationAdoptsAndLatches", testErrorAfterPublicationAdoptsAndLatches},
	{"InterruptedSaveLatchesWithoutTouchingTheOldHead", testInterruptedSaveLatchesWithoutTouchingTheOldHead},
	{"ClearSavesAndStartsAFreshSession", testClearSavesAndStartsAFreshSession},
}

func namespace() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return "sess-" + hex.EncodeToString(b[:])
}

func msg(role, text string) json.RawMessage {
	b, _ := json.Marshal(map[string]string{"role": role, "content": text})
	return b
}

// fixture returns a stored-looking session and a candidate head for it,
// for the context-head tests.
func fixture() (old, candidate *session.Session) {
	old = session.New("synthetic-model", "medium", "host authority")
	old.ID = "synthetic-context-head-" + namespace()
	old.Name = "synthetic-name"
	old.Title = "original title"
	old.ParentSession = "synthetic-parent"
	old.Messages = []json.RawMessage{msg("user", "old head")}
	candidate = old.Clone()
	candidate.Messages = []json.RawMessage{msg("user", "candidate")}
	candidate.Tokens.Input = 23
	candidate.Tokens.Output = 7
	candidate.Cost = 0.125
	candidate.AbortContext = "latest synthetic abort context"
	return old, candidate
}

// same asserts two sessions hold the same stored fields.
func same(t testing.TB, want, got *session.Session) {
	t.Helper()
	w, err := json.Marshal(want)
	require.NoError(t, err)
	g, err := json.Marshal(got)
	require.NoError(t, err)
	require.JSONEq(t, string(w), string(g))
}

func load(t testing.TB, s *session.Store, id string) *session.Session {
	t.Helper()
	got, err := s.Load(ctx, id)
	require.NoError(t, err)
	return got
}

func messages(n int, prefix string) []json.RawMessage {
	out := make([]json.RawMessage, n)
	for i := range out {
		out[i] = msg("user", fmt.Sprintf("%s %d", prefix, i))
	}
	return out
}
