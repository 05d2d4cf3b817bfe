package main

import (
	"context"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"io"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"

	"github.com/contstore/contstore/fingerprint"
	"github.com/contstore/contstore/identity"
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

// replica is one simulated gateway replica.
type replica struct {
	name  string
	store gatewayStore
	up    *upstream
}

// owner is one conversation thread: what its client sends, and the ground
// truth about it. The scheduler hands an owner to one worker at a time,
// and only that worker touches it.
type owner struct {
	index int
	id    identity.Owner
	// socket is the upstream socket the owner uses on whichever replica
	// sends its turns; home is the replica sticky routing picks.
	socket uint64
	home   int

	prompt    prompt
	promptGen int    // counts prompt changes
	head      []byte // the request body up to the input items
	// transcript is what the client sends before its new items. Its items
	// are never changed in place: offers keep slices of it.
	transcript  []json.RawMessage
	pendingCall string // the call id the client owes an output for
	turns       int    // requests made

	// offer is the continuation the store may offer next; nil when none.
	offer *offer
	// idle: the owner comes back from a gap longer than the TTL.
	idle bool
	// wake is when a parked owner may take turns again.
	wake time.Time
}

// Store operations, as the latency figures name them.
const (
	opReserve = iota
	opRecord
	opAbort
	numOps
)

// opNames names the store operations.
var opNames = [numOps]string{"reserve", "record", "abort"}

// Reasons, besides the store's, why a turn did not continue: the gateway
// had to send the full context after all.
const (
	missOriginElsewhere = "origin_elsewhere"
	missNotFound        = "previous_response_not_found"
	missUpstreamFailed  = "upstream_failed"
	missRejected        = "rejected_by_oracle"
)

// Workload events, as the report names them.
const (
	eventPromptChange = "prompt changes"
	eventEdit         = "edits"
	eventCompaction   = "compactions"
	eventConcurrent   = "concurrent pairs"
	eventUpstreamFail = "upstream failures"
	eventNoID         = "lost response ids"
	eventSocketLoss   = "socket losses"
	eventIdle         = "idle gaps"
)

// tally counts what one worker saw; the report sums them.
type tally struct {
	misses     map[string]int64
	outcomes   map[store.Outcome]int64
	events     map[string]int64
	forwarded  int64
	itemsSent  int64
	itemsFull  int64
	bytesSent  int64
	bytesFull  int64
	failOpen   int64
	errors     int64
	firstError string
	// abortsMissed counts aborts that found their turn no longer current.
	abortsMissed int64
}

// sim is one run of the workload against one set of replica stores.
type sim struct {
	cfg      *config
	replicas []*replica
	byName   map[string]*replica
	owners   []*owner
	sched    scheduler
	oracle   *oracle
	idleGap  time.Duration

	left      atomic.Int64  // turns not yet claimed, when -turns bounds the run
	rr        atomic.Uint64 // round-robin position
	turns     atomic.Int64  // reservations made
	continued atomic.Int64  // turns the upstream continued
}

// newSim sets up replicas over stores and the owners of cfg's
// conversations.
func newSim(cfg *config, stores []gatewayStore) *sim {
	issued := &responses{}
	s := &sim{
		cfg:     cfg,
		byName:  map[string]*replica{},
		idleGap: cfg.ttl + max(cfg.ttl/5, 100*time.Millisecond),
	}
	for i, st := range stores {
		r := &replica{name: replicaName(i), store: st, up: newUpstream(cfg.upstream, issued, cfg.sockets)}
		s.replicas = append(s.replicas, r)
		s.byName[r.name] = r
	}
	for c := range cfg.conversations {
		session := fmt.Sprintf("conv-%d", c)
		s.addOwner(identity.Main(session))
		for k := range cfg.agents {
			s.addOwner(identity.Agent(session, fmt.Sprintf("agent-%d", k+1)))
		}
	}
	s.oracle = &oracle{issued: issued, owners: s.owners}
	s.sched.free = slices.Clone(s.owners)
	s.left.Store(cfg.turns)
	return s
}

// addOwner adds the owner id; its names are always valid.
func (s *sim) addOwner(id identity.Owner, err error) {
	if err != nil {
		panic(err)
	}
	h := fnv.New64a()
	h.Write([]byte(id.Key()))
	o := &owner{
		index:  len(s.owners),
		id:     id,
		socket: h.Sum64()%uint64(s.cfg.sockets) + 1,
		home:   id.Partition(len(s.replicas)),
	}
	o.initPrompt(s.cfg.upstream == anySocket)
	s.owners = append(s.owners, o)
}

// run runs the workers until the turns or the duration are spent, or ctx
// ends, and returns them with the time it took.
func (s *sim) run(ctx context.Context) ([]*worker, time.Duration) {
	// Store calls use ctx; the duration only stops workers from starting
	// turns, so that the last turns are not cut short.
	loop := ctx
	if s.cfg.duration > 0 {
		var cancel context.CancelFunc
		loop, cancel = context.WithTimeout(ctx, s.cfg.duration)
		defer cancel()
	}
	workers := make([]*worker, s.cfg.concurrency)
	start := time.Now()
	var wg sync.WaitGroup
	for i := range workers {
		w := newWorker(s, i)
		workers[i] = w
		wg.Go(func() { w.loop(loop, ctx) })
	}
	wg.Wait()
	return workers, time.Since(start)
}

// claim takes up to n turns from the budget and returns how many it got.
func (s *sim) claim(n int64) int64 {
	if s.cfg.turns == 0 {
		return n
	}
	for {
		left := s.left.Load()
		if left <= 0 {
			return 0
		}
		got := min(n, left)
		if s.left.CompareAndSwap(left, left-got) {
			return got
		}
	}
}

// route picks the replica that receives a request of o.
func (s *sim) route(o *owner, rng *rand.Rand) *replica {
	switch s.cfg.routing {
	case sticky:
		return s.replicas[o.home]
	case random:
		return s.replicas[rng.IntN(len(s.replicas))]
	}
	return s.replicas[(s.rr.Add(1)-1)%uint64(len(s.replicas))]
}

// scheduler hands owners to workers, one worker at a time per owner, and
// keeps parked owners aside until they wake.
type scheduler struct {
	mu       sync.Mutex
	free     []*owner
	parked   []*owner
	nextWake time.Time // the earliest wake of a parked owner
}

// take returns a free owner picked at random, waiting for one if need be;
// nil when ctx ends first.
func (s *scheduler) take(ctx context.Context, rng *rand.Rand) *owner {
	for {
		s.mu.Lock()
		now := time.Now()
		if len(s.parked) > 0 && !now.Before(s.nextWake) {
			s.wake(now)
		}
		if n := len(s.free); n > 0 {
			i := rng.IntN(n)
			o := s.free[i]
			s.free[i] = s.free[n-1]
			s.free = s.free[:n-1]
			s.mu.Unlock()
			return o
		}
		wait := time.Millisecond
		if len(s.parked) > 0 {
			wait = min(wait, s.nextWake.Sub(now))
		}
		s.mu.Unlock()
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
	}
}

// wake frees the parked owners whose wake time has come.
func (s *scheduler) wake(now time.Time) {
	kept := s.parked[:0]
	s.nextWake = time.Time{}
	for _, o := range s.parked {
		if now.Before(o.wake) {
			kept = append(kept, o)
			if s.nextWake.IsZero() || o.wake.Before(s.nextWake) {
				s.nextWake = o.wake
			}
			continue
		}
		s.free = append(s.free, o)
	}
	clear(s.parked[len(kept):])
	s.parked = kept
}

// release gives o back.
func (s *scheduler) release(o *owner) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.free = append(s.free, o)
}

// park gives o back for turns from wake on.
func (s *scheduler) park(o *owner, wake time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	o.wake = wake
	if len(s.parked) == 0 || wake.Before(s.nextWake) {
		s.nextWake = wake
	}
	s.parked = append(s.parked, o)
}

// maxLatencyMicros is the largest latency the histograms hold; larger
// ones are recorded as this.
const maxLatencyMicros = 60_000_000

// worker plays gateway turns, one owner at a time.
type worker struct {
	sim     *sim
	rng     *rand.Rand
	tally   tally
	latency [numOps]*hdrhistogram.Histogram // microseconds
}

// newWorker returns worker i, with its own random stream of the seed.
func newWorker(s *sim, i int) *worker {
	w := &worker{
		sim: s,
		rng: rand.New(rand.NewPCG(s.cfg.seed, uint64(i))),
		tally: tally{
			misses:   map[string]int64{},
			outcomes: map[store.Outcome]int64{},
			events:   map[string]int64{},
		},
	}
	for op := range w.latency {
		w.latency[op] = hdrhistogram.New(1, maxLatencyMicros, 3)
	}
	return w
}

// loop plays turns until the budget is spent or loop ends; store calls use
// ctx.
func (w *worker) loop(loop, ctx context.Context) {
	s := w.sim
	for loop.Err() == nil && s.claim(1) == 1 {
		o := s.sched.take(loop, w.rng)
		if o == nil {
			return
		}
		if w.turn(ctx, o) {
			s.sched.park(o, time.Now().Add(s.idleGap))
		} else {
			s.sched.release(o)
		}
	}
}

// chance returns true with probability p.
func (w *worker) chance(p float64) bool { return w.rng.Float64() < p }

// observe records the latency of one store call.
func (w *worker) observe(op int, d time.Duration) {
	_ = w.latency[op].RecordValue(min(max(d.Microseconds(), 1), maxLatencyMicros))
}

// noteError keeps the first store error for the report.
func (w *worker) noteError(err error) {
	if w.tally.firstError == "" {
		w.tally.firstError = err.Error()
	}
}

// turn plays one turn of o (or a concurrent pair) and reports whether o
// now goes idle for longer than the TTL.
func (w *worker) turn(ctx context.Context, o *owner) (idle bool) {
	s, r, ev := w.sim, &w.sim.cfg.rates, w.tally.events
	if w.chance(r.promptChange) {
		o.changePrompt(w.rng)
		ev[eventPromptChange]++
	}
	if len(o.transcript) > 0 && w.chance(r.edit) {
		o.edit(w.rng)
		ev[eventEdit]++
	}
	if len(o.transcript) >= maxTranscriptItems {
		o.compact(w.rng)
		ev[eventCompaction]++
	}
	input := append(slices.Clip(o.transcript), o.newItems(w.rng)...)
	if w.chance(r.concurrent) && s.claim(1) == 1 {
		w.concurrentPair(ctx, o, input)
	} else {
		w.single(ctx, o, input)
	}
	if !w.chance(r.idle) {
		return false
	}
	ev[eventIdle]++
	o.offer, o.idle = nil, true // the state will expire
	return true
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
	// sender is the replica that sent the turn, res the reservation as
	// finally sent.
	sender *replica
	res    *store.Reservation
	// socket is where the response lives; id, output and call describe it
	// (id is empty when the upstream failed).
	socket store.Socket
	id     string
	output []json.RawMessage
	call   string
}

// send sends o's turn upstream as replica rep does: a continuation whose
// origin socket lives on another replica is forwarded there (-forward) or
// sent with the full context, and a continuation the upstream does not
// know is sent again with the full context on the same turn. fail makes
// the upstream fail the turn.
func (w *worker) send(o *owner, rep *replica, input []json.RawMessage, res *store.Reservation, fail bool) answer {
	s, t := w.sim, &w.tally
	a := answer{sender: rep}
	if res.Continues() && s.cfg.upstream == sameSocket && res.Origin.Replica != rep.name {
		if origin, ok := s.byName[res.Origin.Replica]; ok && s.cfg.forward {
			a.sender = origin
			t.forwarded++
		} else {
			t.misses[missOriginElsewhere]++
			res = res.FullContextRetry()
		}
	}
	lost := w.chance(s.cfg.rates.socketLoss)
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
		if outcome == answered {
			a.output, a.call = reply(w.rng, id)
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

// record records a's response for the request req on the replica that
// sent it; it is safe to call from several goroutines at once.
func record(ctx context.Context, a answer) recording {
	start := time.Now()
	outcome, err := a.sender.store.Record(ctx, a.res, store.Result{ResponseID: a.id, Socket: a.socket, Output: a.output})
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

// abort aborts a's turn on the replica that sent it.
func (w *worker) abort(ctx context.Context, a answer) {
	start := time.Now()
	removed, err := a.sender.store.Abort(ctx, a.res)
	w.observe(opAbort, time.Since(start))
	switch {
	case err != nil:
		w.tally.errors++
		w.noteError(err)
	case !removed && a.res.Turn != 0:
		w.tally.abortsMissed++
	}
}

// single plays one request of o with input.
func (w *worker) single(ctx context.Context, o *owner, input []json.RawMessage) {
	s, r, ev := w.sim, &w.sim.cfg.rates, w.tally.events
	rep := s.route(o, w.rng)
	req := w.request(rep, o, input)
	res := w.check(o, rep, input, w.reserve(ctx, rep, o, req))
	fail := w.chance(r.abort)
	a := w.send(o, rep, input, res, fail)
	if fail {
		ev[eventUpstreamFail]++
		w.abort(ctx, a)
		o.transcript = input
		return
	}
	full := append(slices.Clip(input), a.output...)
	if w.chance(r.noID) {
		ev[eventNoID]++
		a.id = ""
		if got, ok := w.recorded(record(ctx, a)); ok {
			s.oracle.checkOutcome(o, a.sender, "record without response id", got, wantOutcome(a.res, store.OutcomeDropped)...)
		}
	} else {
		got, ok := w.recorded(record(ctx, a))
		if ok {
			s.oracle.checkOutcome(o, a.sender, "current turn not published", got, wantOutcome(a.res, store.OutcomePublished, store.OutcomeGone)...)
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
	inputB := append(slices.Clip(inputA), userMessage(w.rng, ""))
	repA := s.route(o, w.rng)
	resA := w.check(o, repA, inputA, w.reserve(ctx, repA, o, w.request(repA, o, inputA)))
	repB := s.route(o, w.rng)
	resB := w.reserve(ctx, repB, o, w.request(repB, o, inputB))
	if resA.Turn != 0 {
		s.oracle.checkSuperseded(o, repB, resB)
	}
	resB = w.check(o, repB, inputB, resB)
	a := w.send(o, repA, inputA, resA, false)
	b := w.send(o, repB, inputB, resB, false)

	var recA, recB recording
	var wg sync.WaitGroup
	wg.Go(func() { recA = record(ctx, a) })
	wg.Go(func() { recB = record(ctx, b) })
	wg.Wait()
	gotA, okA := w.recorded(recA)
	gotB, okB := w.recorded(recB)

	fullA := append(slices.Clip(inputA), a.output...)
	fullB := append(slices.Clip(inputB), b.output...)
	switch {
	case b.res.Turn != 0:
		if okA {
			s.oracle.checkOutcome(o, a.sender, "superseded turn published", gotA, wantOutcome(a.res, store.OutcomeStale, store.OutcomeGone)...)
		}
		if okB {
			s.oracle.checkOutcome(o, b.sender, "current turn not published", gotB, store.OutcomePublished, store.OutcomeGone)
		}
		o.settle(b, fullB, gotB, okB)
	case a.res.Turn != 0:
		// B failed open: A's turn is still current, unless B's reservation
		// reached the store after all.
		if okA {
			s.oracle.checkOutcome(o, a.sender, "current turn not published", gotA,
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

// settle updates o's offer after the record of its current turn a, whose
// transcript is full: the response is now what the store may offer, unless
// the record said otherwise. A record that failed may have published.
func (o *owner) settle(a answer, full []json.RawMessage, got store.Outcome, ok bool) {
	if (!ok && a.res.Turn != 0) || got == store.OutcomePublished {
		o.offer = &offer{id: a.id, items: full, promptGen: o.promptGen}
	}
}

// simulate runs the workload against stores, one per replica (shared
// says whether they share their state), showing progress on w, and
// returns what it delivered under label.
func simulate(ctx context.Context, cfg *config, stores []*store.Store, shared bool, label string, w io.Writer) runResult {
	gs := make([]gatewayStore, len(stores))
	for i, st := range stores {
		gs[i] = st
		if cfg.wrapStore != nil {
			gs[i] = cfg.wrapStore(st)
		}
	}
	s := newSim(cfg, gs)
	stop := showProgress(w, s, label)
	workers, elapsed := s.run(ctx)
	stop()
	res := s.result(label, workers, elapsed)
	state, err := storeState(context.WithoutCancel(ctx), stores, shared)
	if err != nil {
		res.StateError = err.Error()
	}
	res.State = state
	return res
}
