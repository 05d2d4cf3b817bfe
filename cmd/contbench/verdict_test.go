package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/contstore/contstore/fingerprint"
	"github.com/contstore/contstore/identity"
	"github.com/contstore/contstore/store"
)

// errLostAnswer is the failure faultyStore injects.
var errLostAnswer = errors.New("store: unavailable: the answer was lost")

// faultyStore fails every nth call of one kind: a reservation fails open
// after reaching the store (its answer is lost), or a record fails
// without reaching it.
type faultyStore struct {
	gatewayStore
	n      int64
	calls  *atomic.Int64
	record bool // fail records; reservations otherwise
}

// fails reports whether this call of kind record is one to fail.
func (s faultyStore) fails(record bool) bool {
	return s.record == record && s.calls.Add(1)%s.n == 0
}

// Reserve loses the answer of every nth reservation.
func (s faultyStore) Reserve(ctx context.Context, owner identity.Owner, req *fingerprint.Request) *store.Reservation {
	res := s.gatewayStore.Reserve(ctx, owner, req)
	if !s.fails(false) {
		return res
	}
	lost := *res // keeps the request, whose body goes upstream in full
	lost.Turn, lost.PreviousResponseID, lost.Delta, lost.Origin = 0, "", nil, store.Socket{}
	lost.UpstreamItems = req.Len()
	lost.Reason, lost.Err = store.ReasonStoreUnavailable, errLostAnswer
	return &lost
}

// Record fails every nth record.
func (s faultyStore) Record(ctx context.Context, res *store.Reservation, out store.Result) (store.Outcome, error) {
	if s.fails(true) {
		return "", errLostAnswer
	}
	return s.gatewayStore.Record(ctx, res, out)
}

// runWrapped runs contbench with args, its stores wrapped by wrap, and
// returns its exit status, output and JSON report.
func runWrapped(t *testing.T, wrap func(gatewayStore) gatewayStore, args ...string) bench {
	t.Helper()
	path := filepath.Join(t.TempDir(), "report.json")
	cfg, err := parseConfig(append(args, "-quiet", "-json", path), io.Discard)
	require.NoError(t, err)
	cfg.wrapStore = wrap
	var stdout, stderr bytes.Buffer
	b := bench{code: execute(context.Background(), cfg, &stdout, &stderr)}
	b.stdout, b.stderr = stdout.String(), stderr.String()
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(data, &b.report))
	return b
}

// failing returns a wrapper that fails every nth call of one kind.
func failing(n int64, record bool) func(gatewayStore) gatewayStore {
	calls := &atomic.Int64{}
	return func(s gatewayStore) gatewayStore { return faultyStore{s, n, calls, record} }
}

// memoryArgs are the flags of a short run on the memory backend.
var memoryArgs = []string{"-backend", "memory", "-conversations", "50", "-turns", "1000"}

// A run in which the store failed a large share of its calls measures the
// machine, not the store: the result says so first, with its own exit
// status, and no ratio compares such runs.
func TestFailedCallsMakeTheRunInconclusive(t *testing.T) {
	for _, tc := range []struct {
		name   string
		record bool
		kind   string
		reason string
	}{
		{"reservations fail open", false, inconclusiveUnavailable, "the store was unavailable for "},
		{"records fail", true, inconclusiveErrors, "the store failed "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := runWrapped(t, failing(2, tc.record), memoryArgs...)
			assert.Equal(t, exitInconclusive, b.code, b.stderr)
			h := b.report.Headline
			assert.Equal(t, resultInconclusive, h.Result)
			assert.False(t, h.Pass)
			require.Len(t, h.Inconclusive, 1)
			reason := h.Inconclusive[0]
			assert.Equal(t, tc.kind, reason.Kind)
			assert.Contains(t, reason.Reason, tc.reason)
			assert.Contains(t, reason.Reason, "% of ")
			assert.Contains(t, reason.Reason, "(see -op-timeout")
			assert.Equal(t, []string{labelDeployment, labelOneReplica, labelPerReplica}, reason.Runs)
			assert.Nil(t, h.RatioToOneReplica, "no ratio of runs that are not a measurement")

			assert.Contains(t, b.stdout, "\nresult                            INCONCLUSIVE: "+reason.Reason+"\n")
			assert.Contains(t, b.stdout, "ratio (a)/(b)                     -       not shown")
			assert.Contains(t, b.stdout, "of 1000 turns, not a measurement\n")
			assert.Contains(t, b.stderr, "INCONCLUSIVE: "+reason.Reason)
		})
	}
}

// The bound is a share: a few failed calls leave the run a measurement.
func TestFewFailedCallsStillMeasure(t *testing.T) {
	b := runWrapped(t, failing(50, false), memoryArgs...)
	require.Equal(t, exitOK, b.code, b.stderr)
	assert.Positive(t, b.report.Run.FailOpen)
	h := b.report.Headline
	assert.Equal(t, resultPass, h.Result)
	assert.Empty(t, h.Inconclusive)
	assert.NotNil(t, h.RatioToOneReplica)
}

// A wrong decision is wrong however many calls failed around it: FAIL
// wins over the store's unavailability, which the report still gives.
func TestViolationsWinOverAnUnavailableStore(t *testing.T) {
	broken := skipsPromptCheck{mu: &sync.Mutex{}, last: map[identity.Owner]published{}}
	unavailable := failing(4, false)
	wrap := func(s gatewayStore) gatewayStore {
		b := broken
		b.gatewayStore = s
		return unavailable(b)
	}
	b := runWrapped(t, wrap, "-backend", "memory", "-turns", "1000", "-prompt-change", "0.3", "-upstream", "any")
	assert.Equal(t, exitViolations, b.code, b.stderr)
	h := b.report.Headline
	assert.Equal(t, resultFail, h.Result)
	assert.Positive(t, h.Violations)
	require.NotEmpty(t, h.Inconclusive)
	assert.Equal(t, inconclusiveUnavailable, h.Inconclusive[0].Kind)
	assert.Regexp(t, `\nresult +FAIL +\d+ violations in \(a\) and \(b\)\n +also: the store was unavailable for `, b.stdout)
}

func TestDecide(t *testing.T) {
	unavailable := newInconclusive(inconclusiveUnavailable, "the store was unavailable", labelDeployment)
	overriding := inconclusive{Kind: "planted", Reason: "violations say nothing here", OverridesViolations: true}
	for _, tc := range []struct {
		name       string
		violations int64
		reasons    []inconclusive
		want       string
	}{
		{"nothing wrong", 0, nil, resultPass},
		{"violations", 3, nil, resultFail},
		{"not a measurement", 0, []inconclusive{unavailable}, resultInconclusive},
		{"violations win", 3, []inconclusive{unavailable}, resultFail},
		{"a reason that overrides violations", 3, []inconclusive{unavailable, overriding}, resultInconclusive},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, decide(tc.violations, tc.reasons))
		})
	}
}

// Every kind of reason says whether it overrides violations.
func TestEveryReasonKindIsListed(t *testing.T) {
	for _, c := range failureChecks {
		assert.Contains(t, overridesViolations, c.kind)
	}
}

// The set-up does not run on -op-timeout: with one no store call can meet,
// contbench still starts, and its result says the run measured nothing.
func TestShortOpTimeoutIsInconclusiveNotASetUpError(t *testing.T) {
	b := runBench(t, "-op-timeout", "1ns", "-turns", "300", "-conversations", "50")
	assert.Equal(t, exitInconclusive, b.code, "stdout:\n%s\nstderr:\n%s", b.stdout, b.stderr)
	h := b.report.Headline
	assert.Equal(t, resultInconclusive, h.Result)
	require.NotEmpty(t, h.Inconclusive)
	assert.Equal(t, inconclusiveUnavailable, h.Inconclusive[0].Kind)
	assert.Contains(t, h.Inconclusive[0].Runs, labelDeployment)
	assert.Contains(t, h.Inconclusive[0].Runs, labelOneReplica)
	assert.Nil(t, h.RatioToOneReplica)
	require.NotNil(t, b.report.Run.State, "the state is read with the set-up's timeout: %s", b.report.Run.StateError)
	require.NotNil(t, b.report.OneReplica)
	require.NotNil(t, b.report.OneReplica.State, b.report.OneReplica.StateError)
}

// An interrupted run is no measurement: its result is INCONCLUSIVE, with
// how far it went, not the PASS of the turns it played, and it exits 130.
func TestAnInterruptedRunIsInconclusive(t *testing.T) {
	path := filepath.Join(t.TempDir(), "report.json")
	cfg, err := parseConfig(append(memoryArgs, "-quiet", "-json", path, "-turns", "1000000"), io.Discard)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(time.Second, cancel)
	var stdout, stderr bytes.Buffer
	code := execute(ctx, cfg, &stdout, &stderr)
	assert.Equal(t, exitInterrupted, code)
	assert.Regexp(t, `\nresult +INCONCLUSIVE: the run was interrupted: \(a\) played \d+ of its 1000000 turns, and \(b\) and \(c\) were cut short or not played`, stdout.String())
	var rep report
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(data, &rep))
	assert.Equal(t, resultInconclusive, rep.Headline.Result)
	assert.False(t, rep.Headline.Pass)
}
