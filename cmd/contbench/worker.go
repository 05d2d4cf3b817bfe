package main

// The turn driver: a worker plays each owner's turns, one request or a
// concurrent pair, drawing every decision from the owner's stream.

import (
	"context"
	"encoding/json"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"

	"github.com/contstore/contstore/store"
)

// worker plays gateway turns, one owner at a time.
type worker struct {
	sim *sim
	// rng picks random routes; everything else is drawn from the owners'.
	rng     *rand.Rand
	tally   tally
	latency [numOps]*hdrhistogram.Histogram // microseconds
	lookup  *hdrhistogram.Histogram         // directory lookups, microseconds
}

// newWorker returns worker i, with its own random stream of the seed.
func newWorker(s *sim, i int) *worker {
	w := &worker{
		sim:    s,
		rng:    rand.New(rand.NewPCG(s.cfg.seed, workerStreams|uint64(i))),
		lookup: newLatencyHistogram(),
		tally: tally{
			misses:   map[string]int64{},
			outcomes: map[store.Outcome]int64{},
			events:   map[string]int64{},
		},
	}
	for op := range w.latency {
		w.latency[op] = newLatencyHistogram()
	}
	return w
}

// loop plays turns until the owners have played theirs or loop ends;
// store calls use ctx.
func (w *worker) loop(loop, ctx context.Context) {
	s := w.sim
	for loop.Err() == nil {
		o := s.sched.take(loop)
		if o == nil {
			return
		}
		idle := w.turn(ctx, o)
		s.sched.put(o, idle, time.Now().Add(s.idleGap))
	}
}

// turn plays one turn of o (or a concurrent pair, when o has two turns
// left) and reports whether o now goes idle for longer than the TTL.
// Every decision is drawn from o's stream, in an order that depends only
// on o's own turns.
func (w *worker) turn(ctx context.Context, o *owner) (idle bool) {
	r, ev, rng := &w.sim.cfg.rates, w.tally.events, o.rng
	if chance(rng, r.promptChange) {
		o.changePrompt(rng)
		ev[eventPromptChange]++
	}
	if len(o.transcript) > 0 && chance(rng, r.edit) {
		o.edit(rng)
		ev[eventEdit]++
	}
	if len(o.transcript) >= maxTranscriptItems {
		o.compact(rng)
		ev[eventCompaction]++
	}
	input := append(slices.Clip(o.transcript), o.newItems(rng)...)
	if chance(rng, r.concurrent) && o.left >= 2 {
		o.left -= 2
		w.concurrentPair(ctx, o, input)
	} else {
		o.left--
		w.single(ctx, o, input)
	}
	if !chance(rng, r.idle) {
		return false
	}
	ev[eventIdle]++
	o.asleep, o.offer, o.idle = o.offer, nil, true // the state will expire
	return true
}

// single plays one request of o with input.
func (w *worker) single(ctx context.Context, o *owner, input []json.RawMessage) {
	s, r, ev := w.sim, &w.sim.cfg.rates, w.tally.events
	rep := s.route(o, w.rng)
	req := w.request(rep, o, input)
	res := w.check(o, rep, input, w.reserve(ctx, rep, o, req))
	fail := chance(o.rng, r.abort)
	a := w.send(ctx, o, rep, input, res, fail)
	if fail {
		ev[eventUpstreamFail]++
		w.abort(ctx, a)
		o.transcript = input
		return
	}
	full := append(slices.Clip(input), a.output...)
	if chance(o.rng, r.noID) {
		ev[eventNoID]++
		a.id = ""
		if got, ok := w.recorded(recordAnswer(ctx, a)); ok {
			s.oracle.checkOutcome(o, a.via, "record without response id", got, wantOutcome(a.res, o.orStale(store.OutcomeDropped)...)...)
		}
	} else {
		got, ok := w.recorded(recordAnswer(ctx, a))
		if ok {
			s.oracle.checkOutcome(o, a.via, "current turn not published", got,
				wantOutcome(a.res, o.orStale(store.OutcomePublished, store.OutcomeGone)...)...)
		}
		o.settle(a, full, got, ok)
	}
	o.transcript, o.pendingCall = full, a.call
}

// concurrentPair plays two overlapping requests of o, as a client that
// retries on another replica does: B, A's input plus one more item, is
// reserved while A's turn is current; both are sent, then recorded at
// once. Only B may publish.
func (w *worker) concurrentPair(ctx context.Context, o *owner, inputA []json.RawMessage) {
	s := w.sim
	w.tally.events[eventConcurrent]++
	inputB := append(slices.Clip(inputA), userMessage(o.rng, ""))
	repA := s.route(o, w.rng)
	resA := w.check(o, repA, inputA, w.reserve(ctx, repA, o, w.request(repA, o, inputA)))
	repB := s.route(o, w.rng)
	resB := w.reserve(ctx, repB, o, w.request(repB, o, inputB))
	if resA.Turn != 0 {
		s.oracle.checkSuperseded(o, repB, resB)
	}
	resB = w.check(o, repB, inputB, resB)
	a := w.send(ctx, o, repA, inputA, resA, false)
	b := w.send(ctx, o, repB, inputB, resB, false)

	var recA, recB recording
	var wg sync.WaitGroup
	wg.Go(func() { recA = recordAnswer(ctx, a) })
	wg.Go(func() { recB = recordAnswer(ctx, b) })
	wg.Wait()
	gotA, okA := w.recorded(recA)
	gotB, okB := w.recorded(recB)

	fullA := append(slices.Clip(inputA), a.output...)
	fullB := append(slices.Clip(inputB), b.output...)
	switch {
	case b.res.Turn != 0:
		if okA {
			s.oracle.checkOutcome(o, a.via, "superseded turn published", gotA, wantOutcome(a.res, store.OutcomeStale, store.OutcomeGone)...)
		}
		if okB {
			s.oracle.checkOutcome(o, b.via, "current turn not published", gotB, o.orStale(store.OutcomePublished, store.OutcomeGone)...)
		}
		o.settle(b, fullB, gotB, okB)
	case a.res.Turn != 0:
		// B failed open: A's turn is still current, unless B's reservation
		// reached the store after all.
		if okA {
			s.oracle.checkOutcome(o, a.via, "current turn not published", gotA,
				store.OutcomePublished, store.OutcomeGone, store.OutcomeStale)
		}
		o.settle(a, fullA, gotA, okA)
	}
	o.transcript, o.pendingCall = fullB, b.call
}

// wantOutcome returns the outcomes a record of res may have: want, or
// ignored when res reserved no turn (the store failed open).
func wantOutcome(res *store.Reservation, want ...store.Outcome) []store.Outcome {
	if res.Turn == 0 {
		return []store.Outcome{store.OutcomeIgnored}
	}
	return want
}

// chance returns true with probability p, drawn from rng.
func chance(rng *rand.Rand, p float64) bool { return rng.Float64() < p }
