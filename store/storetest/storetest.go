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

// Run runs every conformance test against the stores open returns.
func Run(t *testing.T, open Opener) {
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ns := namespace()
			c.run(t, func(t *testing.T, opts store.Options) *store.Store {
				opts.Namespace = ns
				patient(&opts)
				return open(t, opts)
			})
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

var cases = []struct {
	name string
	run  func(*testing.T, Opener)
}{
	{"DisabledAndMissingIdentityAreStateless", testDisabledAndMissingIdentity},
	{"SiblingAgentsReserveAndPublishIndependently", testSiblingsIndependent},
	{"AnotherOwnersTurnCannotInterfere", testOtherOwnerCannotInterfere},
	{"MissingResponseIDDropsOnlyTheCurrentOwner", testMissingResponseIDDropsOnlyOwner},
	{"ZeroSocketPublishesNothingReusable", testZeroSocket},
	{"StaleTurnCannotPublishAbortOrCheck", testStaleTurn},
	{"ZeroOwnerOrTurnIsAHardNoop", testZeroOwnerOrTurn},
	{"AppendOnlyContinuation", testAppendOnly},
	{"ChangedPromptIsNotContinued", testPromptChanged},
	{"EditedHistoryAndEmptyDelta", testNotAppendOnlyAndEmptyDelta},
	{"AnySocketContinuesOnEveryReplica", testAnySocket},
	{"ReferencesStandForStoredOutputItems", testReferences},
	{"UpstreamBodyCarriesTheDelta", testUpstreamBody},
	{"TranscriptOverOwnerCapIsDropped", testOwnerCap},
	{"IdleStateExpires", testTTL},
	{"TouchRefreshesEverySixteenthOfTheTTL", testRefreshEverySixteenthOfTheTTL},
	{"KeyOrderWhitespaceAndArgumentsDoNotMatter", testCanonicalEquivalence},
	{"ClearRemovesStateWhateverTheTurn", testClear},
	{"ConcurrentTurnsOnOneOwner", testConcurrentTurns},
	{"EvictionKeepsTheMostRecentlyTouched", testEvictionKeepsMostRecent},
	{"TouchMovesAnOwnerToTheBack", testTouchMovesToTheBack},
	{"ByteBudgetEvictsOldestFirst", testByteBudgetEvictsOldest},
	{"SweepPrunesIdleStates", testSweepPrunesIdleStates},
	{"WritingPrunesIdleStates", testWritingPrunesIdleStates},
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
var parser, _ = fingerprint.New(fingerprint.V3(), fingerprint.Key{})

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
	ctx := context.Background()
	res := s.Reserve(ctx, owner, r)
	require.NoError(t, res.Err)
	require.NotZero(t, res.Turn)
	out, err := s.Record(ctx, res, store.Result{ResponseID: id, Socket: socket(1)})
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
