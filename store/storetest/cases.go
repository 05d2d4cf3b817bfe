package storetest

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/contstore/contstore/fingerprint"
	"github.com/contstore/contstore/identity"
	"github.com/contstore/contstore/store"
)

var ctx = context.Background()

func testDisabledAndMissingIdentity(t *testing.T, open Opener) {
	r := req(t, "one", "two")
	owner := mainOwner(t, "session-a")

	disabled := open(t, store.Options{Disabled: true}).Reserve(ctx, owner, r)
	assert.Equal(t, owner, disabled.Owner)
	assert.Zero(t, disabled.Turn)
	assert.Equal(t, 2, disabled.UpstreamItems)
	assert.Equal(t, store.ReasonDisabled, disabled.Reason)
	assert.False(t, disabled.Continues())

	s := open(t, store.Options{})
	missing := s.Reserve(ctx, identity.Owner{}, r)
	assert.True(t, missing.Owner.IsZero())
	assert.Zero(t, missing.Turn)
	assert.Equal(t, 2, missing.UpstreamItems)
	assert.Equal(t, store.ReasonMissingIdentity, missing.Reason)

	nilReq := s.Reserve(ctx, identity.Owner{}, nil)
	assert.Equal(t, 0, nilReq.UpstreamItems)

	// The upstream holds this one's conversation: its input was not read,
	// and it reserves nothing, whoever owns it.
	upstream := parse(t, `{"model":"gpt-test","previous_response_id":"resp_1","input":[`+message("three")+`]}`)
	require.True(t, upstream.InputSkipped())
	held := s.Reserve(ctx, owner, upstream)
	assert.Zero(t, held.Turn)
	assert.Equal(t, store.ReasonMissingIdentity, held.Reason)
	assert.Same(t, upstream, held.Request(), "sent as received")

	first := s.Reserve(ctx, owner, r)
	assert.Equal(t, store.ReasonMissingState, first.Reason, "the stateless calls left nothing behind")
}

func testSiblingsIndependent(t *testing.T, open Opener) {
	s := open(t, store.Options{})
	one, two := agentOwner(t, "session-a", "agent-one"), agentOwner(t, "session-a", "agent-two")
	r := req(t, "one")

	first := s.Reserve(ctx, one, r)
	second := s.Reserve(ctx, two, r)
	require.NotEqual(t, first.Turn, second.Turn)
	for _, c := range []struct {
		res  *store.Reservation
		id   string
		sock uint64
	}{{first, "resp_one", 11}, {second, "resp_two", 22}} {
		out, err := s.Record(ctx, c.res, store.Result{ResponseID: c.id, Socket: socket(c.sock)})
		require.NoError(t, err)
		require.Equal(t, store.OutcomePublished, out)
	}
	assert.True(t, hasContinuation(t, s, one))
	assert.True(t, hasContinuation(t, s, two))

	next := req(t, "one", "two")
	oneNext, twoNext := s.Reserve(ctx, one, next), s.Reserve(ctx, two, next)
	assert.Equal(t, "resp_one", oneNext.PreviousResponseID)
	assert.Equal(t, remote(socket(11)), oneNext.Origin)
	assert.Equal(t, "resp_two", twoNext.PreviousResponseID)
	assert.Equal(t, remote(socket(22)), twoNext.Origin)
}

func testOtherOwnerCannotInterfere(t *testing.T, open Opener) {
	s := open(t, store.Options{})
	main, agent := mainOwner(t, "session-a"), agentOwner(t, "session-a", "agent-a")
	r := req(t, "one")
	mainRes, agentRes := s.Reserve(ctx, main, r), s.Reserve(ctx, agent, r)

	out, err := s.Record(ctx, agentRes, store.Result{ResponseID: "resp_agent", Socket: socket(1)})
	require.NoError(t, err)
	require.Equal(t, store.OutcomePublished, out)
	out, err = s.Record(ctx, mainRes, store.Result{ResponseID: "resp_main", Socket: socket(1)})
	require.NoError(t, err)
	require.Equal(t, store.OutcomePublished, out)

	// The agent's turn token presented as the main owner's.
	forged := &store.Reservation{Owner: main, Turn: agentRes.Turn}
	aborted, err := s.Abort(ctx, forged)
	require.NoError(t, err)
	assert.False(t, aborted)
	current, err := s.IsCurrent(ctx, forged)
	require.NoError(t, err)
	assert.False(t, current)
	out, err = s.Record(ctx, forged, store.Result{ResponseID: "resp_forged", Socket: socket(1)})
	require.NoError(t, err)
	assert.Equal(t, store.OutcomeStale, out)

	st, err := s.Inspect(ctx, main)
	require.NoError(t, err)
	assert.Equal(t, "resp_main", st.ResponseID)
	assert.True(t, hasContinuation(t, s, agent))
	next := s.Reserve(ctx, agent, req(t, "one", "two"))
	assert.Equal(t, "resp_agent", next.PreviousResponseID)
}

func testMissingResponseIDDropsOnlyOwner(t *testing.T, open Opener) {
	s := open(t, store.Options{})
	owner, sibling := mainOwner(t, "session-a"), agentOwner(t, "session-a", "agent-a")
	r := req(t, "one")
	publish(t, s, owner, r, "resp_main")
	publish(t, s, sibling, r, "resp_agent")

	res := s.Reserve(ctx, owner, r)
	out, err := s.Record(ctx, res, store.Result{Socket: socket(1)})
	require.NoError(t, err)
	assert.Equal(t, store.OutcomeDropped, out)

	st, err := s.Inspect(ctx, owner)
	require.NoError(t, err)
	assert.False(t, st.Exists, "the current owner's state is removed")
	assert.True(t, hasContinuation(t, s, sibling))
}

func testZeroSocket(t *testing.T, open Opener) {
	s := open(t, store.Options{})
	owner := mainOwner(t, "session-no-socket")
	r := req(t, "one")
	res := s.Reserve(ctx, owner, r)
	out, err := s.Record(ctx, res, store.Result{ResponseID: "resp_without_socket", Socket: store.Socket{Replica: "replica-a"}})
	require.NoError(t, err)
	assert.Equal(t, store.OutcomeDropped, out)
	assert.False(t, hasContinuation(t, s, owner))

	next := s.Reserve(ctx, owner, req(t, "one", "two"))
	assert.Empty(t, next.PreviousResponseID)
	assert.Zero(t, next.Origin)
	assert.Equal(t, store.ReasonMissingState, next.Reason)
}

func testStaleTurn(t *testing.T, open Opener) {
	s := open(t, store.Options{})
	owner := mainOwner(t, "session-a")
	r := req(t, "one")
	publish(t, s, owner, r, "resp_1")

	stale := s.Reserve(ctx, owner, r)
	current := s.Reserve(ctx, owner, r)
	assert.Equal(t, store.ReasonSupersededTurn, current.Reason)
	assert.Greater(t, current.Turn, stale.Turn)

	out, err := s.Record(ctx, stale, store.Result{ResponseID: "resp_stale", Socket: socket(1)})
	require.NoError(t, err)
	assert.Equal(t, store.OutcomeStale, out)
	assert.False(t, hasContinuation(t, s, owner))

	ok, err := s.IsCurrent(ctx, stale)
	require.NoError(t, err)
	assert.False(t, ok)
	ok, err = s.IsCurrent(ctx, current)
	require.NoError(t, err)
	assert.True(t, ok)

	out, err = s.Record(ctx, current, store.Result{ResponseID: "resp_current", Socket: socket(1)})
	require.NoError(t, err)
	assert.Equal(t, store.OutcomePublished, out)

	aborted, err := s.Abort(ctx, stale)
	require.NoError(t, err)
	assert.False(t, aborted)
	st, err := s.Inspect(ctx, owner)
	require.NoError(t, err)
	assert.Equal(t, "resp_current", st.ResponseID)
	assert.Equal(t, current.Turn, st.Turn)

	aborted, err = s.Abort(ctx, current)
	require.NoError(t, err)
	assert.True(t, aborted)
	st, err = s.Inspect(ctx, owner)
	require.NoError(t, err)
	assert.False(t, st.Exists)
}

func testZeroOwnerOrTurn(t *testing.T, open Opener) {
	s := open(t, store.Options{})
	owner := mainOwner(t, "session-a")
	r := req(t, "one")
	published := publish(t, s, owner, r, "resp_1")

	for _, res := range []*store.Reservation{
		nil,
		{Turn: published.Turn},
		{Owner: owner},
	} {
		out, err := s.Record(ctx, res, store.Result{ResponseID: "ignored", Socket: socket(1)})
		require.NoError(t, err)
		assert.Equal(t, store.OutcomeIgnored, out)
		aborted, err := s.Abort(ctx, res)
		require.NoError(t, err)
		assert.False(t, aborted)
		current, err := s.IsCurrent(ctx, res)
		require.NoError(t, err)
		assert.False(t, current)
	}
	require.NoError(t, s.Clear(ctx, identity.Owner{}))

	st, err := s.Inspect(ctx, owner)
	require.NoError(t, err)
	assert.Equal(t, "resp_1", st.ResponseID)
	assert.Equal(t, published.Turn, st.Turn)
}

func testAppendOnly(t *testing.T, open Opener) {
	s := open(t, store.Options{})
	owner := mainOwner(t, "session-a")
	first := req(t, "one")
	res := s.Reserve(ctx, owner, first)
	out, err := s.Record(ctx, res, store.Result{
		ResponseID: "resp_1", Socket: socket(7), Output: raw(assistant("answer one")),
	})
	require.NoError(t, err)
	require.Equal(t, store.OutcomePublished, out)

	st, err := s.Inspect(ctx, owner)
	require.NoError(t, err)
	assert.Equal(t, 2, st.Items, "input and output items")
	assert.Equal(t, remote(socket(7)), st.Origin)

	appended := parse(t, body("", message("one"), assistant("answer one"), message("two"), message("three")))
	next := s.Reserve(ctx, owner, appended)
	require.True(t, next.Continues(), "reason %q", next.Reason)
	assert.Equal(t, store.ReasonNone, next.Reason)
	assert.Equal(t, "resp_1", next.PreviousResponseID)
	assert.Equal(t, remote(socket(7)), next.Origin)
	assert.Equal(t, 2, next.UpstreamItems)
	require.Len(t, next.Delta, 2)
	assert.JSONEq(t, message("two"), string(next.Delta[0]))
	assert.Equal(t, appended.Items()[3], next.Delta[1], "the delta is the request's own bytes")
	assert.Greater(t, next.Turn, res.Turn)

	retry := next.FullContextRetry()
	assert.Equal(t, owner, retry.Owner)
	assert.Equal(t, next.Turn, retry.Turn)
	assert.Empty(t, retry.PreviousResponseID)
	assert.Nil(t, retry.Delta)
	assert.Zero(t, retry.Origin)
	assert.Equal(t, store.ReasonFullContextRetry, retry.Reason)
	assert.Equal(t, 4, retry.UpstreamItems)
	assert.False(t, retry.Continues())

	out, err = s.Record(ctx, retry, store.Result{ResponseID: "resp_2", Socket: socket(8)})
	require.NoError(t, err)
	assert.Equal(t, store.OutcomePublished, out, "a full-context retry records on the same turn")
}

func testPromptChanged(t *testing.T, open Opener) {
	s := open(t, store.Options{})
	owner := mainOwner(t, "session-a")
	publish(t, s, owner, req(t, "one"), "resp_1")
	for _, extra := range []string{`"service_tier":"flex"`, `"instructions":"be brief"`, `"tools":[{"type":"function","name":"f"}]`} {
		t.Run(extra, func(t *testing.T) {
			publish(t, s, owner, req(t, "one"), "resp_1")
			changed := parse(t, body(extra, message("one"), message("two")))
			res := s.Reserve(ctx, owner, changed)
			assert.Equal(t, store.ReasonPromptChanged, res.Reason)
			assert.Empty(t, res.PreviousResponseID)
			assert.Equal(t, 2, res.UpstreamItems)
			assert.NotZero(t, res.Turn)
			assert.False(t, hasContinuation(t, s, owner), "the continuation is consumed")
		})
	}
}

func testNotAppendOnlyAndEmptyDelta(t *testing.T, open Opener) {
	s := open(t, store.Options{})
	owner := mainOwner(t, "session-a")

	publish(t, s, owner, req(t, "one", "two"), "resp_1")
	edited := s.Reserve(ctx, owner, req(t, "one (edited)", "two", "three"))
	assert.Equal(t, store.ReasonNotAppendOnly, edited.Reason)
	assert.Equal(t, 3, edited.UpstreamItems)

	publish(t, s, owner, req(t, "one", "two"), "resp_2")
	shorter := s.Reserve(ctx, owner, req(t, "one"))
	assert.Equal(t, store.ReasonNotAppendOnly, shorter.Reason)

	publish(t, s, owner, req(t, "one", "two"), "resp_3")
	same := s.Reserve(ctx, owner, req(t, "one", "two"))
	assert.Equal(t, store.ReasonEmptyDelta, same.Reason)
	assert.Equal(t, 2, same.UpstreamItems, "the full input goes upstream")
	assert.Empty(t, same.PreviousResponseID)
	assert.NotZero(t, same.Turn)
	assert.Equal(t, 2, same.FullContextRetry().UpstreamItems)
}

func testOwnerCap(t *testing.T, open Opener) {
	s := open(t, store.Options{MaxOwnerBytes: 400})
	owner := mainOwner(t, "session-big")
	small := req(t, "one")
	publish(t, s, owner, small, "resp_small")

	res := s.Reserve(ctx, owner, small)
	out, err := s.Record(ctx, res, store.Result{
		ResponseID: "resp_big", Socket: socket(1),
		Output: raw(assistant(fmt.Sprintf("%0400d", 0))),
	})
	require.NoError(t, err)
	assert.Equal(t, store.OutcomeDropped, out)
	assert.False(t, hasContinuation(t, s, owner))
	st, err := s.Inspect(ctx, owner)
	require.NoError(t, err)
	assert.False(t, st.Exists)
}

func testTTL(t *testing.T, open Opener, clocked Clocked) {
	const ttl = time.Hour
	opts, clock := clocked(t, store.Options{TTL: ttl})
	s := open(t, opts)
	owner, other := mainOwner(t, "session-idle"), mainOwner(t, "session-busy")
	publish(t, s, owner, req(t, "one"), "resp_1")
	publish(t, s, other, req(t, "one"), "resp_1")
	clock.Add(ttl - time.Millisecond)
	require.True(t, hasContinuation(t, s, owner), "state lives while younger than the TTL")

	clock.Add(2 * time.Millisecond) // past the TTL
	res := s.Reserve(ctx, owner, req(t, "one", "two"))
	assert.Equal(t, store.ReasonMissingState, res.Reason)
	st, err := s.Inspect(ctx, other)
	require.NoError(t, err)
	assert.False(t, st.Exists)
}

// A reserve refreshes a state's touch and TTL once 15 ticks of a 256th of
// the TTL have passed since they were (PROTOCOL 8.2), so within a
// sixteenth of the TTL.
func testRefreshWithinASixteenthOfTheTTL(t *testing.T, open Opener, clocked Clocked) {
	const ttl = 25600 * time.Millisecond // a tick is 100ms
	opts, clock := clocked(t, store.Options{TTL: ttl})
	// start at a tick: the scripts count ticks from 2025-01-01
	start := clock.Now().Truncate(100 * time.Millisecond).Add(100 * time.Millisecond)
	clock.Set(start)
	s := open(t, opts)
	lazy, busy := mainOwner(t, "session-lazy"), mainOwner(t, "session-busy")
	turn := func(o identity.Owner, id string) {
		t.Helper()
		res := s.Reserve(ctx, o, req(t, "one", id))
		require.NoError(t, res.Err)
		out, err := s.Record(ctx, res, store.Result{ResponseID: id, Socket: socket(1)})
		require.NoError(t, err)
		require.Equal(t, store.OutcomePublished, out)
	}
	touched := func(o identity.Owner) time.Time {
		t.Helper()
		st, err := s.Inspect(ctx, o)
		require.NoError(t, err)
		require.True(t, st.Exists)
		return st.UpdatedAt
	}
	publish(t, s, lazy, req(t, "one"), "resp_0")
	publish(t, s, busy, req(t, "one"), "resp_0")

	clock.Add(15*ttl/256 - time.Millisecond)
	turn(lazy, "resp_1")
	turn(busy, "resp_1")
	assert.Equal(t, start, touched(lazy), "a turn within 15 ticks keeps the touch")
	clock.Add(time.Millisecond)
	turn(busy, "resp_2")
	assert.Equal(t, clock.Now(), touched(busy), "a turn 15 ticks later refreshes it")

	clock.Set(start.Add(ttl + time.Millisecond))
	assert.False(t, exists(t, s, lazy), "the TTL runs from the last refresh")
	assert.True(t, hasContinuation(t, s, busy))
}

func testCanonicalEquivalence(t *testing.T, open Opener) {
	s := open(t, store.Options{})
	owner := mainOwner(t, "session-canon")
	call := `{"type":"function_call","call_id":"c1","name":"lookup","arguments":"{\"city\":\"Paris\",\"days\":3}"}`
	first := parse(t, `{"model":"gpt-test","tools":[{"type":"function","name":"lookup","strict":true}],"store":false,"input":[`+message("weather?")+`,`+call+`]}`)
	publish(t, s, owner, first, "resp_1")

	reordered := `{"arguments":"{ \"days\": 3, \"city\": \"Paris\" }","name":"lookup","call_id":"c1","type":"function_call"}`
	second := parse(t, "{\n  \"store\" : false,\n  \"input\": [\n    "+
		`{"content":[{"text":"weather?","type":"input_text"}],"role":"user","type":"message"}`+",\n    "+reordered+",\n    "+
		`{"type":"function_call_output","call_id":"c1","output":"sunny"}`+
		"\n  ],\n  \"tools\": [{\"strict\": true, \"name\": \"lookup\", \"type\": \"function\"}],\n  \"model\": \"gpt-test\"\n}")
	res := s.Reserve(ctx, owner, second)
	require.True(t, res.Continues(), "reason %q", res.Reason)
	assert.Equal(t, "resp_1", res.PreviousResponseID)
	assert.Equal(t, 1, res.UpstreamItems)
}

func testClear(t *testing.T, open Opener) {
	s := open(t, store.Options{})
	owner, sibling := mainOwner(t, "session-a"), agentOwner(t, "session-a", "agent-a")
	r := req(t, "one")
	publish(t, s, owner, r, "resp_1")
	publish(t, s, sibling, r, "resp_2")
	inFlight := s.Reserve(ctx, owner, r)

	require.NoError(t, s.Clear(ctx, owner))
	st, err := s.Inspect(ctx, owner)
	require.NoError(t, err)
	assert.False(t, st.Exists)
	out, err := s.Record(ctx, inFlight, store.Result{ResponseID: "resp_late", Socket: socket(1)})
	require.NoError(t, err)
	assert.Equal(t, store.OutcomeGone, out)
	assert.True(t, hasContinuation(t, s, sibling))
	require.NoError(t, s.Clear(ctx, owner), "clearing nothing is fine")
	assert.Equal(t, store.ReasonMissingState, s.Reserve(ctx, owner, r).Reason)
}

// testConcurrentTurns races 16 goroutines over two stores (two replicas) on
// one owner and checks the history: every continuation offered names the
// response of the turn reserved just before, which published; no record
// publishes once a later reservation has completed; the final state is the
// last publication.
func testConcurrentTurns(t *testing.T, open Opener) {
	const workers, turns = 16, 500
	stores := []*store.Store{
		open(t, store.Options{Replica: "replica-a"}),
		open(t, store.Options{Replica: "replica-b"}),
	}
	owner := mainOwner(t, "session-race")
	// Turns alternate between two requests: the longer one continues a
	// published turn of the shorter one.
	asks := []*fingerprint.Request{req(t, "one"), req(t, "one", "two")}

	type event struct {
		res         *store.Reservation
		reservedAt  time.Time // when Reserve returned
		recordStart time.Time
		outcome     store.Outcome
		aborted     bool
	}
	var (
		mu     sync.Mutex
		events []*event
		next   int
		// Each worker's first two of every ten turns run alone, so that
		// some turn continues however the others interleave.
		solo sync.RWMutex
	)
	take := func() bool {
		mu.Lock()
		defer mu.Unlock()
		next++
		return next <= turns
	}
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			s := stores[w%len(stores)]
			held := false // the solo lock, across a worker's two solo turns
			defer func() {
				if held {
					solo.Unlock()
				} else {
					solo.RUnlock()
				}
			}()
			solo.RLock()
			for i := 0; take(); i++ {
				ask := asks[(w+i)%2]
				abort := (w+i)%5 == 0
				switch i % 10 {
				case 0: // publish the short request alone…
					solo.RUnlock()
					solo.Lock()
					held, ask, abort = true, asks[0], false
				case 1: // …and continue it with the long one
					ask, abort = asks[1], false
				case 2:
					solo.Unlock()
					solo.RLock()
					held = false
				}
				ev := &event{}
				ev.res = s.Reserve(ctx, owner, ask)
				ev.reservedAt = time.Now()
				if ev.res.Err != nil {
					t.Errorf("reserve: %v", ev.res.Err)
					return
				}
				ev.recordStart = time.Now()
				var err error
				if abort {
					ev.aborted, err = s.Abort(ctx, ev.res)
				} else {
					ev.outcome, err = s.Record(ctx, ev.res, store.Result{
						ResponseID: fmt.Sprintf("resp-%d", ev.res.Turn),
						Socket:     store.Socket{ID: uint64(w + 1)},
					})
				}
				if err != nil {
					t.Errorf("record/abort: %v", err)
					return
				}
				mu.Lock()
				events = append(events, ev)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if len(events) != turns {
		t.Fatalf("%d of %d turns completed", len(events), turns)
	}

	sort.Slice(events, func(i, j int) bool { return events[i].res.Turn < events[j].res.Turn })
	for i, ev := range events {
		require.NotZero(t, ev.res.Turn)
		if i > 0 {
			require.NotEqual(t, events[i-1].res.Turn, ev.res.Turn, "turn tokens are unique")
		}
	}
	continued := 0
	var problems []string
	problem := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }
	for i, ev := range events {
		if ev.res.Continues() {
			continued++
			switch {
			case i == 0:
				problem("turn %v, the first, continues from %q", ev.res.Turn, ev.res.PreviousResponseID)
			case ev.res.PreviousResponseID != fmt.Sprintf("resp-%d", events[i-1].res.Turn):
				problem("turn %v continues from %q, not from turn %v reserved just before it",
					ev.res.Turn, ev.res.PreviousResponseID, events[i-1].res.Turn)
			case events[i-1].outcome != store.OutcomePublished:
				problem("turn %v continues from turn %v, whose record was %q (aborted %v)",
					ev.res.Turn, events[i-1].res.Turn, events[i-1].outcome, events[i-1].aborted)
			case ev.res.UpstreamItems != 1:
				problem("turn %v continues with %d delta items, want 1", ev.res.Turn, ev.res.UpstreamItems)
			}
		}
		if i+1 == len(events) || !events[i+1].reservedAt.Before(ev.recordStart) {
			continue
		}
		if ev.outcome == store.OutcomePublished {
			problem("turn %v published although turn %v was reserved before its record started", ev.res.Turn, events[i+1].res.Turn)
		}
		if ev.aborted {
			problem("turn %v was aborted although turn %v was reserved before the abort started", ev.res.Turn, events[i+1].res.Turn)
		}
	}
	if len(problems) > 0 {
		t.Errorf("in %d turns, %s", len(events), firstOf("problems", problems, 5))
	}

	assert.Positive(t, continued, "some turn continued")

	last := events[len(events)-1]
	st, err := stores[0].Inspect(ctx, owner)
	require.NoError(t, err)
	switch {
	case last.outcome == store.OutcomePublished:
		assert.True(t, st.HasContinuation)
		assert.Equal(t, fmt.Sprintf("resp-%d", last.res.Turn), st.ResponseID, "the final state is the last publication")
		assert.Equal(t, last.res.Turn, st.Turn)
	case last.aborted:
		assert.False(t, st.Exists)
	default:
		t.Fatalf("the last turn %v neither published nor aborted: record %q", last.res.Turn, last.outcome)
	}
}

// A response any connection can continue (an upstream that stores
// responses) is recorded with Socket{Any: true} and continues on every
// replica; a socket of one replica continues only there.
func testAnySocket(t *testing.T, open Opener) {
	ctx := context.Background()
	a := open(t, store.Options{Replica: "replica-a"})
	b := open(t, store.Options{Replica: "replica-b"})
	owner := mainOwner(t, "session-any")
	publishOn(t, a, owner, req(t, "one"), "resp_any", store.Socket{Any: true, Replica: "ignored", ID: 9})
	st, err := b.Inspect(ctx, owner)
	require.NoError(t, err)
	assert.Equal(t, store.Socket{Any: true}, st.Origin)

	next := b.Reserve(ctx, owner, req(t, "one", "two"))
	require.True(t, next.Continues(), "reason %q", next.Reason)
	assert.Equal(t, store.Socket{Any: true}, next.Origin)
	assert.True(t, next.Local(), "any replica can continue")

	out, err := b.Record(ctx, next, store.Result{ResponseID: "resp_b", Socket: store.Socket{ID: 4}})
	require.NoError(t, err)
	assert.Equal(t, store.OutcomePublished, out)
	onA := a.Reserve(ctx, owner, req(t, "one", "two", "three"))
	require.True(t, onA.Continues())
	assert.Equal(t, remote(store.Socket{Replica: "replica-b", ID: 4}), onA.Origin)
	assert.False(t, onA.Local(), "replica-b's socket is not replica-a's")
	retry := onA.FullContextRetry()
	assert.False(t, retry.Local())
	assert.Equal(t, store.ReasonFullContextRetry, retry.Reason)
	assert.Equal(t, store.ReasonNone, onA.Reason, "the original keeps its reason")
}

// A turn that continued from a response the upstream keeps, and published
// nothing, gives its continuation back: the next try continues from the
// same response, on every replica; a later turn's reservation makes the
// give-back stale. A continuation on a socket, a turn that did not
// continue and a full-context retry give nothing back.
func testRestore(t *testing.T, open Opener) {
	ctx := context.Background()
	a := open(t, store.Options{Replica: "replica-a"})
	b := open(t, store.Options{Replica: "replica-b"})
	owner := mainOwner(t, "session-restore")
	publishOn(t, a, owner, req(t, "one"), "resp_1", store.Socket{Any: true})

	failed := a.Reserve(ctx, owner, req(t, "one", "two"))
	require.True(t, failed.Continues(), "reason %q", failed.Reason)
	out, err := a.Restore(ctx, failed.FullContextRetry())
	require.NoError(t, err)
	assert.Equal(t, store.OutcomeIgnored, out, "a full-context retry took nothing")
	out, err = a.Restore(ctx, failed)
	require.NoError(t, err)
	assert.Equal(t, store.OutcomePublished, out)
	again := b.Reserve(ctx, owner, req(t, "one", "two"))
	require.True(t, again.Continues(), "reason %q", again.Reason)
	assert.Equal(t, "resp_1", again.PreviousResponseID)
	assert.Equal(t, 1, again.UpstreamItems)

	later := a.Reserve(ctx, owner, req(t, "one", "two"))
	assert.Equal(t, store.ReasonSupersededTurn, later.Reason, "again took it")
	out, err = b.Restore(ctx, again)
	require.NoError(t, err)
	assert.Equal(t, store.OutcomeStale, out, "a later turn holds the state")
	out, err = a.Restore(ctx, later)
	require.NoError(t, err)
	assert.Equal(t, store.OutcomeIgnored, out, "later took no continuation")
	st, err := a.Inspect(ctx, owner)
	require.NoError(t, err)
	assert.Equal(t, later.Turn, st.Turn)
	assert.False(t, st.HasContinuation, "nothing given back over a later turn")

	out, err = a.Record(ctx, later, store.Result{ResponseID: "resp_2", Socket: store.Socket{ID: 3}})
	require.NoError(t, err)
	require.Equal(t, store.OutcomePublished, out)
	onSocket := a.Reserve(ctx, owner, req(t, "one", "two", "three"))
	require.True(t, onSocket.Continues(), "reason %q", onSocket.Reason)
	out, err = a.Restore(ctx, onSocket)
	require.NoError(t, err)
	assert.Equal(t, store.OutcomeIgnored, out, "a socket's continuation is not given back")
}

// An item_reference to an output item of the recorded turn counts as that
// item when the upstream keeps the response (any socket), and never on a
// socket of a replica (store:false); a reference to another id never does.
func testReferences(t *testing.T, open Opener) {
	ctx := context.Background()
	a := open(t, store.Options{Replica: "replica-a"})
	b := open(t, store.Options{Replica: "replica-b"})
	output := []json.RawMessage{
		json.RawMessage(`{"id":"rs_1","type":"reasoning","summary":[]}`),
		json.RawMessage(`{"id":"fc_1","type":"function_call","status":"completed","call_id":"c1","name":"f","arguments":"{}"}`),
	}
	ref := func(id string) string { return `{"type":"item_reference","id":"` + id + `"}` }
	call := `{"type":"function_call","call_id":"c1","name":"f","arguments":"{}"}`
	result := `{"type":"function_call_output","call_id":"c1","output":"ok"}`
	for _, tc := range []struct {
		name   string
		origin store.Socket
		next   []string
		want   store.Reason
	}{
		{"reasoning referenced, the call in full", store.Socket{Any: true}, []string{ref("rs_1"), call, result}, store.ReasonNone},
		{"both referenced", store.Socket{Any: true}, []string{ref("rs_1"), ref("fc_1"), result}, store.ReasonNone},
		{"a reference to another id", store.Socket{Any: true}, []string{ref("rs_2"), call, result}, store.ReasonNotAppendOnly},
		{"a reference under store:false", store.Socket{ID: 3}, []string{ref("rs_1"), call, result}, store.ReasonNotAppendOnly},
	} {
		t.Run(tc.name, func(t *testing.T) {
			owner := mainOwner(t, "session-ref-"+tc.name)
			first := a.Reserve(ctx, owner, parse(t, body("", message("hi"))))
			out, err := a.Record(ctx, first, store.Result{ResponseID: "resp_ref", Socket: tc.origin, Output: output})
			require.NoError(t, err)
			require.Equal(t, store.OutcomePublished, out)
			next := b.Reserve(ctx, owner, parse(t, body("", append([]string{message("hi")}, tc.next...)...)))
			assert.Equal(t, tc.want, next.Reason)
			if tc.want == store.ReasonNone {
				assert.Equal(t, "resp_ref", next.PreviousResponseID)
				assert.Equal(t, 1, next.UpstreamItems, "only the call's output goes upstream")
			}
		})
	}
}

// UpstreamBody is what goes upstream: the body as received without a
// continuation, previous_response_id and the delta with one.
func testUpstreamBody(t *testing.T, open Opener) {
	ctx := context.Background()
	s := open(t, store.Options{Replica: "replica-a"})
	owner := mainOwner(t, "session-body")
	first := req(t, "one")
	res := s.Reserve(ctx, owner, first)
	assert.Equal(t, string(first.Body()), string(res.UpstreamBody()), "full context: the body as received")
	_, err := s.Record(ctx, res, store.Result{ResponseID: "resp_1", Socket: socket(1),
		Output: []json.RawMessage{json.RawMessage(message("answer"))}})
	require.NoError(t, err)

	next := req(t, "one", "answer", "two")
	res = s.Reserve(ctx, owner, next)
	require.True(t, res.Continues(), "reason %q", res.Reason)
	assert.True(t, res.Local())
	var sent struct {
		Previous string            `json:"previous_response_id"`
		Model    string            `json:"model"`
		Input    []json.RawMessage `json:"input"`
	}
	require.NoError(t, json.Unmarshal(res.UpstreamBody(), &sent))
	assert.Equal(t, "resp_1", sent.Previous)
	assert.Equal(t, "gpt-test", sent.Model, "the other members stay")
	assert.Equal(t, []json.RawMessage{next.Items()[2]}, sent.Input)
	assert.Equal(t, string(next.Body()), string(res.FullContextRetry().UpstreamBody()))
	assert.Equal(t, next.Len(), res.Request().Len())

	made := &store.Reservation{Owner: owner, Turn: res.Turn}
	assert.Nil(t, made.Request(), "a reservation the store did not make has no request")
	assert.Nil(t, made.UpstreamBody())
	assert.Equal(t, 0, made.FullContextRetry().UpstreamItems)
	assert.False(t, made.Local())
}
