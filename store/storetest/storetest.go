// Package storetest is the conformance suite every continuation-store
// backend must pass: in process, miniredis, real Redis and Redis Cluster.
package storetest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/contstore/contstore/fingerprint"
	"github.com/contstore/contstore/identity"
	"github.com/contstore/contstore/internal/names"
	"github.com/contstore/contstore/internal/redistest"
	"github.com/contstore/contstore/store"
)

// Opener returns a store for opts. Each test gives its own fresh
// Options.Namespace (and an OpTimeout, see patient), and may open
// several stores in it (as several replicas would): stores opened with the
// same namespace must share their state. The opener cleans the namespace up
// when t ends.
type Opener func(t *testing.T, opts store.Options) *store.Store

// Clock is a clock a test moves: the one a backend keeps its states on.
type Clock interface {
	Now() time.Time
	Add(d time.Duration)
	Set(t time.Time)
}

// Clocked returns opts for stores that keep their states on a clock the
// test moves, and that clock, which reads whole milliseconds and only moves
// forward: on Redis the server's (redistest.ServerClock moves miniredis's),
// in process the store's own (internal/storehooks). It may return the same
// clock every time.
type Clocked func(t *testing.T, opts store.Options) (store.Options, Clock)

// Run runs every conformance test against the stores open returns. The
// tests that move time run only when clocked is not nil: a real server's
// clock does not move at a test's command, so they run on miniredis, which
// runs the same scripts, and on the in-process store.
func Run(t *testing.T, open Opener, clocked Clocked) {
	for _, c := range cases {
		if c.run == nil && clocked == nil {
			continue
		}
		t.Run(c.name, func(t *testing.T) {
			ns := namespace()
			open := func(t *testing.T, opts store.Options) *store.Store {
				opts.Namespace = ns
				patient(&opts)
				return open(t, opts)
			}
			if c.run != nil {
				c.run(t, open)
			} else {
				c.timed(t, open, clocked)
			}
		})
	}
}

// patient sets opts.OpTimeout to redistest.PatientOpTimeout unless it is
// set: the conformance cases check outcomes, not latency.
func patient(opts *store.Options) {
	if opts.OpTimeout == 0 {
		opts.OpTimeout = redistest.PatientOpTimeout
	}
}

// namespace returns a fresh namespace: "st-" and 12 hex digits.
func namespace() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return "st-" + hex.EncodeToString(b[:])
}

// cases are the conformance tests: run, or timed for those that move
// time.
var cases = []struct {
	name  string
	run   func(*testing.T, Opener)
	timed func(*testing.T, Opener, Clocked)
}{
	{"DisabledAndMissingIdentityAreStateless", testDisabledAndMissingIdentity, nil},
	{"SiblingAgentsReserveAndPublishIndependently", testSiblingsIndependent, nil},
	{"AnotherOwnersTurnCannotInterfere", testOtherOwnerCannotInterfere, nil},
	{"MissingResponseIDDropsOnlyTheCurrentOwner", testMissingResponseIDDropsOnlyOwner, nil},
	{"ZeroSocketPublishesNothingReusable", testZeroSocket, nil},
	{"StaleTurnCannotPublishAbortOrCheck", testStaleTurn, nil},
	{"ZeroOwnerOrTurnIsAHardNoop", testZeroOwnerOrTurn, nil},
	{"AppendOnlyContinuation", testAppendOnly, nil},
	{"ChangedPromptIsNotContinued", testPromptChanged, nil},
	{"EditedHistoryAndEmptyDelta", testNotAppendOnlyAndEmptyDelta, nil},
	{"AnySocketContinuesOnEveryReplica", testAnySocket, nil},
	{"RestoreGivesBackAStoredContinuation", testRestore, nil},
	{"ReferencesStandForStoredOutputItems", testReferences, nil},
	{"UpstreamBodyCarriesTheDelta", testUpstreamBody, nil},
	{"TranscriptOverOwnerCapIsDropped", testOwnerCap, nil},
	{"IdleStateExpires", nil, testTTL},
	{"TouchRefreshesWithinASixteenthOfTheTTL", nil, testRefreshWithinASixteenthOfTheTTL},
	{"KeyOrderWhitespaceAndArgumentsDoNotMatter", testCanonicalEquivalence, nil},
	{"ClearRemovesStateWhateverTheTurn", testClear, nil},
	{"GuessIsTheReservationOfTheStoresOwnRecord", testGuess, nil},
	{"GuessOnlyWhileOwnersStay", testGuessWhileOwnersStay, nil},
	{"GuessDecidesAsTheState", testGuessDecidesAsTheState, nil},
	{"ConcurrentTurnsOnOneOwner", testConcurrentTurns, nil},
	{"EvictionKeepsTheMostRecentlyTouched", testEvictionKeepsMostRecent, nil},
	{"TouchMovesAnOwnerToTheBack", nil, testTouchMovesToTheBack},
	{"ByteBudgetEvictsOldestFirst", testByteBudgetEvictsOldest, nil},
	{"SweepPrunesIdleStates", nil, testSweepPrunesIdleStates},
	{"WritingPrunesIdleStates", nil, testWritingPrunesIdleStates},
}

// Request builders.

func message(text string) string {
	return fmt.Sprintf(`{"type":"message","role":"user","content":[{"type":"input_text","text":%q}]}`, text)
}

func assistant(text string) string {
	return fmt.Sprintf(`{"type":"message","role":"assistant","content":[{"type":"output_text","text":%q}]}`, text)
}

// body returns a request with the given extra top-level fields (a JSON
// object's members, without braces) and input items.
func body(extra string, items ...string) string {
	fields := `"model":"gpt-test","store":false,"stream":true,"text":{"verbosity":"low"}`
	if extra != "" {
		fields += "," + extra
	}
	return fmt.Sprintf(`{%s,"input":[%s]}`, fields, strings.Join(items, ","))
}

// parser parses the suite's requests; each store parses them again under
// its namespace's key.
var parser, _ = fingerprint.New(fingerprint.V4(), fingerprint.Key{})

func parse(t testing.TB, b string) *fingerprint.Request {
	t.Helper()
	r, err := parser.Parse([]byte(b))
	require.NoError(t, err, b)
	return r
}

func req(t testing.TB, texts ...string) *fingerprint.Request {
	t.Helper()
	items := make([]string, len(texts))
	for i, s := range texts {
		items[i] = message(s)
	}
	return parse(t, body("", items...))
}

func raw(items ...string) []json.RawMessage {
	out := make([]json.RawMessage, len(items))
	for i, s := range items {
		out[i] = json.RawMessage(s)
	}
	return out
}

func mainOwner(t testing.TB, session string) identity.Owner {
	t.Helper()
	o, err := identity.Main(session)
	require.NoError(t, err)
	return o
}

func agentOwner(t testing.TB, session, agent string) identity.Owner {
	t.Helper()
	o, err := identity.Agent(session, agent)
	require.NoError(t, err)
	return o
}

func socket(id uint64) store.Socket { return store.Socket{Replica: "replica-a", ID: id} }

// remote returns sock as a store whose replica is another one names it:
// by its replica's reference (store.Socket).
func remote(sock store.Socket) store.Socket {
	sock.Replica = names.ReplicaRef(names.ReplicaDigest(sock.Replica))
	return sock
}

// publish reserves a turn for owner and records response id on socket 1.
func publish(t testing.TB, s *store.Store, owner identity.Owner, r *fingerprint.Request, id string) *store.Reservation {
	t.Helper()
	return publishOn(t, s, owner, r, id, socket(1))
}

// publishOn is publish on socket sock.
func publishOn(t testing.TB, s *store.Store, owner identity.Owner, r *fingerprint.Request, id string, sock store.Socket) *store.Reservation {
	t.Helper()
	ctx := context.Background()
	res := s.Reserve(ctx, owner, r)
	require.NoError(t, res.Err)
	require.NotZero(t, res.Turn)
	out, err := s.Record(ctx, res, store.Result{ResponseID: id, Socket: sock})
	require.NoError(t, err)
	require.Equal(t, store.OutcomePublished, out)
	return res
}

func hasContinuation(t testing.TB, s *store.Store, owner identity.Owner) bool {
	t.Helper()
	st, err := s.Inspect(context.Background(), owner)
	require.NoError(t, err)
	return st.HasContinuation
}

// firstOf renders how many items there are, as "<count> <noun>", and the
// first n of them, one a line, for failure messages that would otherwise
// print a long list.
func firstOf[T any](noun string, items []T, n int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d %s", len(items), noun)
	if len(items) > n {
		fmt.Fprintf(&b, ", the first %d", n)
	}
	b.WriteString(":")
	for _, it := range items[:min(n, len(items))] {
		fmt.Fprintf(&b, "\n\t%v", it)
	}
	return b.String()
}
