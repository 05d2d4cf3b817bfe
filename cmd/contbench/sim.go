package main

import (
	"context"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"io"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"

	"github.com/contstore/contstore/directory"
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

// replica is one simulated gateway replica; its name is also the address
// it announces in the directory.
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
	// rng draws every decision of the owner's client and upstream (prompt
	// changes, edits, texts, failures, losses, idle gaps), so that the
	// workload depends only on the seed, never on which worker plays it.
	rng *rand.Rand
	// left is how many turns the owner still plays.
	left int64
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
	// idle: the owner comes back from a gap longer than the TTL; asleep is
	// its offer meanwhile, given back if the gap is cut short.
	idle   bool
	asleep *offer
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
// had to send the full context after all. origin_elsewhere: the
// continuation lives on another replica's socket and forwarding is off;
// forward_fallback: forwarding is on but the directory lookup failed or
// did not know the origin replica.
const (
	missOriginElsewhere = "origin_elsewhere"
	missForwardFallback = "forward_fallback"
	missNotFound        = "previous_response_not_found"
	missUpstreamFailed  = "upstream_failed"
	missRejected        = "rejected_by_oracle"
)

// Workload events, as the JSON report names them.
const (
	eventPromptChange = "prompt_changes"
	eventEdit         = "edits"
	eventCompaction   = "compactions"
	eventConcurrent   = "concurrent_pairs"
	eventUpstreamFail = "upstream_failures"
	eventNoID         = "lost_response_ids"
	eventSocketLoss   = "socket_losses"
	eventIdle         = "idle_gaps"
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
	// lookupErrors and unknownOrigin count the forward fallbacks by cause;
	// firstLookupError is the first lookup error.
	lookupErrors, unknownOrigin int64
	firstLookupError            string
}

// sim is one run of the workload against one set of replica stores.
type sim struct {
	cfg      *config
	replicas []*replica
	byName   map[string]*replica
	dir      *directory.Directory
	owners   []*owner
	sched    scheduler
	oracle   *oracle
	idleGap  time.Duration

	rr             atomic.Uint64 // round-robin position
	turns          atomic.Int64  // reservations made
	continued      atomic.Int64  // turns the upstream continued
	announceErrors atomic.Int64  // failed directory announcements and withdrawals
}

// Streams of the seed: each owner's is (seed, owner index); the
// scheduler's and the workers' (which pick owners and random routes, and
// so never change the workload) are set apart by the top bits.
const (
	schedulerStream = 1 << 62
	workerStreams   = 1 << 63
)

// newSim sets up replicas over stores, finding each other in dir, and the
// owners of cfg's conversations with their turns: -turns split evenly, so
// that each owner plays the same turns whatever the concurrency.
func newSim(cfg *config, stores []gatewayStore, dir *directory.Directory) *sim {
	issued := &responses{}
	s := &sim{
		cfg:     cfg,
		byName:  map[string]*replica{},
		dir:     dir,
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
	n := int64(len(s.owners))
	for _, o := range s.owners {
		o.left = math.MaxInt64
		if cfg.turns > 0 {
			o.left = cfg.turns / n
			if int64(o.index) < cfg.turns%n {
				o.left++
			}
		}
		if o.left > 0 {
			s.sched.free = append(s.sched.free, o)
		}
	}
	s.sched.rng = rand.New(rand.NewPCG(cfg.seed, schedulerStream))
	s.sched.cutAtEnd = cfg.turns > 0
	return s
}

// addOwner adds the owner id; its names are always valid.
func (s *sim) addOwner(id identity.Owner, err error) {
	if err != nil {
		panic(err)
	}
	h := fnv.New64a()
	h.Write([]byte(id.Key()))
	i := len(s.owners)
	o := &owner{
		index:  i,
		id:     id,
		rng:    rand.New(rand.NewPCG(s.cfg.seed, uint64(i))),
		socket: h.Sum64()%uint64(s.cfg.sockets) + 1,
		home:   id.Partition(len(s.replicas)),
	}
	o.initPrompt(s.cfg.upstream == anySocket)
	s.owners = append(s.owners, o)
}

// run runs the workers until every owner has played its turns, the
// duration is spent or ctx ends, and returns them with the time it took.
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
// keeps parked owners aside until they wake. Once every owner with turns
// left is parked, with -turns bounding the run, it wakes them at once:
// their idle gaps are cut short rather than leave the run waiting.
type scheduler struct {
	mu       sync.Mutex
	rng      *rand.Rand // picks the next owner
	cutAtEnd bool
	free     []*owner
	parked   []*owner
	nextWake time.Time // the earliest wake of a parked owner
	busy     int       // owners a worker holds
	cut      int64     // idle gaps cut short
}

// take returns a free owner picked at random, waiting for one if need be;
// nil when every owner has played its turns or ctx ends first.
func (s *scheduler) take(ctx context.Context) *owner {
	for {
		s.mu.Lock()
		now := time.Now()
		stuck := s.cutAtEnd && len(s.free) == 0 && s.busy == 0
		if len(s.parked) > 0 && (stuck || !now.Before(s.nextWake)) {
			s.wake(now, stuck)
		}
		if n := len(s.free); n > 0 {
			i := s.rng.IntN(n)
			o := s.free[i]
			s.free[i] = s.free[n-1]
			s.free = s.free[:n-1]
			s.busy++
			s.mu.Unlock()
			return o
		}
		if s.busy == 0 && len(s.parked) == 0 {
			s.mu.Unlock()
			return nil
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

// wake frees the parked owners whose wake time has come, or all of them
// when all is set, cutting short the gaps of those still asleep.
func (s *scheduler) wake(now time.Time, all bool) {
	kept := s.parked[:0]
	s.nextWake = time.Time{}
	for _, o := range s.parked {
		if now.Before(o.wake) {
			if !all {
				kept = append(kept, o)
				if s.nextWake.IsZero() || o.wake.Before(s.nextWake) {
					s.nextWake = o.wake
				}
				continue
			}
			o.wakeEarly()
			s.cut++
		}
		s.free = append(s.free, o)
	}
	clear(s.parked[len(kept):])
	s.parked = kept
}

// put gives back o, which a worker took: for more turns, for turns from
// wake on when it went idle, or for none once it has played them all.
func (s *scheduler) put(o *owner, idle bool, wake time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.busy--
	switch {
	case o.left == 0:
	case idle:
		o.wake = wake
		if len(s.parked) == 0 || wake.Before(s.nextWake) {
			s.nextWake = wake
		}
		s.parked = append(s.parked, o)
	default:
		s.free = append(s.free, o)
	}
}

// cutShort returns how many idle gaps were cut short.
func (s *scheduler) cutShort() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cut
}

// maxLatencyMicros is the largest latency the histograms hold; larger
// ones are recorded as this.
const maxLatencyMicros = 60_000_000

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
		lookup: hdrhistogram.New(1, maxLatencyMicros, 3),
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

// chance returns true with probability p, drawn from rng.
func chance(rng *rand.Rand, p float64) bool { return rng.Float64() < p }

// observe records the latency of one store call.
func (w *worker) observe(op int, d time.Duration) {
	recordLatency(w.latency[op], d)
}

// recordLatency adds the latency d to h.
func recordLatency(h *hdrhistogram.Histogram, d time.Duration) {
	_ = h.RecordValue(min(max(d.Microseconds(), 1), maxLatencyMicros))
}

// noteError keeps the first store error for the report.
func (w *worker) noteError(err error) {
	if w.tally.firstError == "" {
		w.tally.firstError = err.Error()
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

// wakeEarly ends o's idle gap before the TTL has passed: its state may
// still be there, and its offer with it.
func (o *owner) wakeEarly() {
	o.offer, o.asleep, o.idle = o.asleep, nil, false
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

// send sends o's turn upstream as replica rep does: a continuation whose
// origin socket lives on another replica is forwarded there (see
// forwardTarget) or sent with the full context, and a continuation the
// upstream does not know is sent again with the full context on the same
// turn. fail makes the upstream fail the turn.
func (w *worker) send(ctx context.Context, o *owner, rep *replica, input []json.RawMessage, res *store.Reservation, fail bool) answer {
	s, t := w.sim, &w.tally
	a := answer{via: rep, sender: rep}
	if res.Continues() && s.cfg.upstream == sameSocket && res.Origin.Replica != rep.name {
		if origin := w.forwardTarget(ctx, res.Origin.Replica); origin != nil {
			a.sender = origin
			t.forwarded++
		} else {
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
		if outcome == answered {
			a.output, a.call = reply(o.rng, id)
		}
		return a
	}
}

// forwardTarget returns the replica to hand a turn to whose continuation
// lives on the socket of replica origin, found as the proxy finds it: by
// looking origin up in the directory. It returns nil, and the turn is
// served here with the full context, when forwarding is off, the lookup
// fails, or the directory does not know origin.
func (w *worker) forwardTarget(ctx context.Context, origin string) *replica {
	s, t := w.sim, &w.tally
	if !s.cfg.forward {
		t.misses[missOriginElsewhere]++
		return nil
	}
	start := time.Now()
	addr, err := s.dir.Lookup(ctx, origin)
	recordLatency(w.lookup, time.Since(start))
	target := s.byName[addr] // a replica announces its name as its address
	switch {
	case err != nil:
		t.lookupErrors++
		if t.firstLookupError == "" {
			t.firstLookupError = err.Error()
		}
	case target == nil:
		t.unknownOrigin++
	default:
		return target
	}
	t.misses[missForwardFallback]++
	return nil
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
			s.oracle.checkOutcome(o, a.via, "record without response id", got, wantOutcome(a.res, store.OutcomeDropped)...)
		}
	} else {
		got, ok := w.recorded(recordAnswer(ctx, a))
		if ok {
			s.oracle.checkOutcome(o, a.via, "current turn not published", got, wantOutcome(a.res, store.OutcomePublished, store.OutcomeGone)...)
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
			s.oracle.checkOutcome(o, b.via, "current turn not published", gotB, store.OutcomePublished, store.OutcomeGone)
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

// settle updates o's offer after the record of its current turn a, whose
// transcript is full: the response is now what the store may offer, unless
// the record said otherwise. A record that failed may have published.
func (o *owner) settle(a answer, full []json.RawMessage, got store.Outcome, ok bool) {
	if (!ok && a.res.Turn != 0) || got == store.OutcomePublished {
		o.offer = &offer{id: a.id, items: full, promptGen: o.promptGen}
	}
}

// simulate runs the workload against stores, one per replica (shared
// says whether they share their state), the replicas announcing
// themselves in dir for the run, shows progress on w, and returns what it
// delivered as deployment label.
func simulate(ctx context.Context, cfg *config, stores []*store.Store, dir *directory.Directory, shared bool, label string, w io.Writer) runResult {
	gs := make([]gatewayStore, len(stores))
	for i, st := range stores {
		gs[i] = st
		if cfg.wrapStore != nil {
			gs[i] = cfg.wrapStore(st)
		}
	}
	s := newSim(cfg, gs, dir)
	withdraw := s.announce(ctx)
	stop := showProgress(w, s, label)
	workers, elapsed := s.run(ctx)
	stop()
	withdraw()
	res := s.result(label, workers, elapsed)
	state, err := storeState(context.WithoutCancel(ctx), stores, shared)
	if err != nil {
		res.StateError = err.Error()
	}
	res.State = state
	return res
}

// announce has every replica announce itself in the directory, as a
// proxy does at start, and keep the announcement alive; the returned
// function withdraws them. Failures are counted, not fatal: a replica the
// directory does not know is served around, as the proxy does.
func (s *sim) announce(ctx context.Context) (withdraw func()) {
	failed := func(error) { s.announceErrors.Add(1) }
	for _, r := range s.replicas {
		if err := s.dir.Announce(ctx, r.name, r.name); err != nil {
			failed(err)
		}
	}
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for _, r := range s.replicas {
		wg.Go(func() {
			if err := s.dir.Run(ctx, r.name, r.name, failed); err != nil {
				failed(err)
			}
		})
	}
	return func() {
		cancel()
		wg.Wait()
	}
}
