package main

// A gateway replica serving a turn: it parses and reserves the turn on its
// store, sends it upstream, then records or aborts it.

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/contstore/contstore/fingerprint"
	"github.com/contstore/contstore/identity"
	"github.com/contstore/contstore/internal/route"
	"github.com/contstore/contstore/store"
)

// gatewayStore is what a gateway replica calls on its continuation store;
// *store.Store implements it.
type gatewayStore interface {
	ParseRequest(body []byte) (*fingerprint.Request, error)
	Reserve(ctx context.Context, owner identity.Owner, req *fingerprint.Request) *store.Reservation
	Record(ctx context.Context, res *store.Reservation, out store.Result) (store.Outcome, error)
	Abort(ctx context.Context, res *store.Reservation) (bool, error)
}

// replica is one simulated gateway replica; its name is also the address
// it announces in the directory.
type replica struct {
	name  string
	store gatewayStore
	up    *upstream
}

// request parses the body o's client sends for input, as the gateway
// replica rep that receives it does.
func (w *worker) request(rep *replica, o *owner, input []json.RawMessage) *fingerprint.Request {
	req, err := rep.store.ParseRequest(o.body(input))
	if err != nil {
		panic(fmt.Sprintf("contbench generated an invalid request: %v", err))
	}
	return req
}

// reserve reserves a turn of o on rep.
func (w *worker) reserve(ctx context.Context, rep *replica, o *owner, req *fingerprint.Request) *store.Reservation {
	o.turns++
	w.sim.turns.Add(1)
	start := time.Now()
	res := rep.store.Reserve(ctx, o.id, req)
	w.observe(opReserve, time.Since(start))
	if !res.Continues() {
		w.tally.misses[string(res.Reason)]++
	}
	if res.Reason == store.ReasonStoreUnavailable {
		w.tally.failOpen++
		w.noteError(res.Err)
	}
	return res
}

// check has the oracle check res, the reservation of o's request input on
// rep, and returns the reservation to go on with: a continuation the
// oracle refuses is not used, the turn goes on with the full context.
func (w *worker) check(o *owner, rep *replica, input []json.RawMessage, res *store.Reservation) *store.Reservation {
	if w.sim.oracle.checkReserve(o, rep, input, res) {
		return res
	}
	w.tally.misses[missRejected]++
	return res.FullContextRetry()
}

// answer is how one turn went upstream.
type answer struct {
	// via is the replica the client reached, which reserved the turn and
	// records or aborts it; sender is the replica whose socket sent it
	// (the origin, when via forwarded it). res is the reservation as
	// finally sent.
	via, sender *replica
	res         *store.Reservation
	// socket is where the response lives; id, output and call describe it
	// (id is empty when the upstream failed).
	socket store.Socket
	id     string
	output []json.RawMessage
	call   string
}

// send sends o's turn upstream as replica rep does, where the gateway's
// route policy (internal/route) says: a continuation whose origin socket
// lives on another replica is forwarded there (see forwardTarget) or sent
// with the full context, and a continuation the upstream does not know is
// sent again with the full context on the same turn. fail makes the
// upstream fail the turn.
func (w *worker) send(ctx context.Context, o *owner, rep *replica, input []json.RawMessage, res *store.Reservation, fail bool) answer {
	s, t := w.sim, &w.tally
	a := answer{via: rep, sender: rep}
	// A replica does not track what its sockets hold: it takes them to
	// hold the response, and the upstream refuses one they do not.
	offer := route.Offer{Continues: res.Continues(), Origin: res.Origin, Stores: s.cfg.upstream == anySocket,
		Self: rep.name, Forwarding: s.cfg.forward, Holds: true}
	switch route.Decide(offer) {
	case route.Forward:
		if origin := w.forwardTarget(ctx, res.Origin.Replica); origin != nil {
			a.sender = origin
			t.forwarded++
		} else {
			res = res.FullContextRetry()
		}
	case route.Full:
		if res.Continues() {
			t.misses[missOriginElsewhere]++
			res = res.FullContextRetry()
		}
	}
	lost := chance(o.rng, s.cfg.rates.socketLoss)
	if lost {
		t.events[eventSocketLoss]++
	}
	t.itemsFull += int64(len(input))
	t.bytesFull += size(input)
	for {
		prev, items := "", input
		if res.Continues() {
			prev, items = res.PreviousResponseID, res.Delta
		}
		t.itemsSent += int64(len(items))
		t.bytesSent += size(items)
		id, outcome := a.sender.up.send(o.index, o.socket, prev, lost, fail)
		lost = false
		if outcome == notFound {
			t.misses[missNotFound]++
			res = res.FullContextRetry()
			continue
		}
		if prev != "" && outcome == failed {
			t.misses[missUpstreamFailed]++
		} else if prev != "" {
			s.continued.Add(1)
		}
		a.res, a.id = res, id
		a.socket = store.Socket{Replica: a.sender.name, ID: o.socket}
		if offer.Stores {
			a.socket = store.Socket{Any: true} // kept upstream, as a gateway records it
		}
		if outcome == answered {
			a.output, a.call = reply(o.rng, id)
		}
		return a
	}
}

// recording is one Record call and how long it took.
type recording struct {
	outcome store.Outcome
	err     error
	took    time.Duration
}

// recordAnswer records a's response on the replica that reserved its
// turn; it is safe to call from several goroutines at once.
func recordAnswer(ctx context.Context, a answer) recording {
	start := time.Now()
	outcome, err := a.via.store.Record(ctx, a.res, store.Result{ResponseID: a.id, Socket: a.socket, Output: a.output})
	return recording{outcome: outcome, err: err, took: time.Since(start)}
}

// recorded counts rec and returns its outcome; false when it failed.
func (w *worker) recorded(rec recording) (store.Outcome, bool) {
	w.observe(opRecord, rec.took)
	if rec.err != nil {
		w.tally.errors++
		w.noteError(rec.err)
		return "", false
	}
	w.tally.outcomes[rec.outcome]++
	return rec.outcome, true
}

// abort aborts a's turn on the replica that reserved it.
func (w *worker) abort(ctx context.Context, a answer) {
	start := time.Now()
	removed, err := a.via.store.Abort(ctx, a.res)
	w.observe(opAbort, time.Since(start))
	switch {
	case err != nil:
		w.tally.errors++
		w.noteError(err)
	case !removed && a.res.Turn != 0:
		w.tally.abortsMissed++
	}
}

// noteError keeps the first store error for the report.
func (w *worker) noteError(err error) {
	if w.tally.firstError == "" {
		w.tally.firstError = err.Error()
	}
}
