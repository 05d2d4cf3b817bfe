package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/contstore/contstore/fingerprint"
	"github.com/contstore/contstore/identity"
	"github.com/contstore/contstore/internal/names"
	"github.com/contstore/contstore/internal/redisconn"
	"github.com/contstore/contstore/internal/storehooks"
)

// ErrInvalidRequest is fingerprint.ErrInvalidRequest: a body, output item,
// response id or socket name that the store refuses.
var ErrInvalidRequest = fingerprint.ErrInvalidRequest

// ErrUnavailable is wrapped by every error caused by the backing store
// (Redis down, slow past OpTimeout, a context that ended).
var ErrUnavailable = errors.New("store: unavailable")

// Turn is a fencing token: unique across owners and replicas, strictly
// increasing per owner. 0 means "no turn".
type Turn uint64

// Socket names the upstream connection a response lives on.
type Socket struct {
	// Any means every connection of every replica can continue the
	// response: an upstream that stores responses (HTTP with store=true).
	// Replica and ID are then ignored.
	Any bool
	// Replica is the gateway replica holding the socket. A Result names it
	// by the replica's name (Options.Replica). An owner's state keeps only
	// a 64-bit digest of the name, so a Reservation's Origin names the
	// reserving store's own replica by its name and any other by a
	// reference, '#' and 16 hex digits, which directory.Directory.Lookup
	// resolves and a Result takes back.
	Replica string
	// ID names the socket within the replica; 0 means "unknown".
	ID uint64
}

// Reason says why a reservation does not continue.
type Reason string

// Reasons, in the order Reserve checks them.
const (
	ReasonNone             Reason = ""
	ReasonDisabled         Reason = "disabled"
	ReasonMissingIdentity  Reason = "missing_identity"
	ReasonMissingState     Reason = "missing_state"
	ReasonSupersededTurn   Reason = "superseded_turn"
	ReasonPromptChanged    Reason = "prompt_changed"
	ReasonNotAppendOnly    Reason = "not_append_only"
	ReasonEmptyDelta       Reason = "empty_delta"
	ReasonFullContextRetry Reason = "full_context_retry"
	ReasonStoreUnavailable Reason = "store_unavailable"
)

// Reservation is one turn of one owner, and the continuation it may use.
type Reservation struct {
	// Owner is the conversation thread; zero for a missing identity.
	Owner identity.Owner
	// Turn is the reserved turn; 0 when nothing was reserved.
	Turn Turn
	// PreviousResponseID is the response to continue from, when continuing.
	PreviousResponseID string
	// Delta holds the request's own items after the matched prefix, when
	// continuing.
	Delta []json.RawMessage
	// UpstreamItems is how many input items go upstream: len(Delta) when
	// continuing, else the request's full input length.
	UpstreamItems int
	// Origin is where the previous response lives; zero unless continuing.
	Origin Socket
	// Reason is ReasonNone exactly when continuing.
	Reason Reason
	// Err is the store error behind ReasonStoreUnavailable.
	Err error

	req     *fingerprint.Request // the request reserved
	taken   *continuation        // the continuation it continues from (Restore)
	replica string               // the reserving store's replica
	at      time.Time            // when the reserve was sent: the state lives a TTL from then (guesses)
	stay    stay                 // how the owner has stayed on this store (guesses)
}

// Continues reports whether the gateway may send PreviousResponseID and
// Delta instead of the full input.
func (r *Reservation) Continues() bool {
	return r != nil && r.Reason == ReasonNone && r.PreviousResponseID != ""
}

// Local reports whether this replica can continue: the reservation
// continues and its origin is any socket or a socket of the replica that
// reserved it. Whether that socket still holds the response is the
// gateway's to check; when it does not, use FullContextRetry.
func (r *Reservation) Local() bool {
	return r.Continues() && (r.Origin.Any || r.Origin.Replica == r.replica)
}

// Request returns the request reserved: as parsed by the store's namespace.
// It is nil for a Reservation the store did not make.
func (r *Reservation) Request() *fingerprint.Request {
	if r == nil {
		return nil
	}
	return r.req
}

// UpstreamBody returns the body to send upstream for this turn: when
// continuing, the request's body with previous_response_id set and input
// holding only Delta; otherwise the body as the client sent it.
func (r *Reservation) UpstreamBody() []byte {
	if r == nil || r.req == nil {
		return nil
	}
	if r.Continues() {
		if b, err := r.req.ContinuedBody(r.PreviousResponseID, r.req.Len()-len(r.Delta)); err == nil {
			return b
		}
	}
	return r.req.Body()
}

// FullContextRetry returns a copy for resending the full context on the same
// turn (after the upstream answered previous_response_not_found, or when the
// origin socket is not held here): owner and turn kept, continuation
// dropped, reason ReasonFullContextRetry. The original keeps its reason.
func (r *Reservation) FullContextRetry() *Reservation {
	if r == nil {
		return nil
	}
	n := 0
	if r.req != nil {
		n = r.req.Len()
	}
	return &Reservation{
		Owner:         r.Owner,
		Turn:          r.Turn,
		UpstreamItems: n,
		Reason:        ReasonFullContextRetry,
		req:           r.req,
		replica:       r.replica,
		at:            r.at,
		stay:          r.stay,
	}
}

// Result is what the upstream answered for a turn.
type Result struct {
	// ResponseID is the upstream's response id; empty publishes nothing.
	ResponseID string
	// Socket is where the response lives: Socket{Any: true} when any
	// connection can continue it, else a socket of a replica (an empty
	// Replica means this store's); ID 0 publishes nothing.
	Socket Socket
	// Output holds the response's output items, appended to the transcript.
	Output []json.RawMessage
}

// Outcome says what Record did.
type Outcome string

// Outcomes of Record.
const (
	// OutcomeIgnored: the reservation has no owner or no turn.
	OutcomeIgnored Outcome = "ignored"
	// OutcomePublished: the continuation is stored.
	OutcomePublished Outcome = "published"
	// OutcomeStale: the turn is not the owner's current turn; nothing changed.
	OutcomeStale Outcome = "stale"
	// OutcomeGone: the owner has no state (expired, evicted, cleared).
	OutcomeGone Outcome = "gone"
	// OutcomeDropped: the response cannot be continued (no response id, no
	// socket, transcript over MaxOwnerBytes); the owner's state is removed
	// if the turn was still current.
	OutcomeDropped Outcome = "dropped"
)

// State is an owner's stored state, as Inspect reads it.
type State struct {
	// Exists: the owner has state. HasContinuation: a response is published.
	Exists, HasContinuation bool
	// Turn is the owner's current turn.
	Turn Turn
	// ResponseID and Origin describe the published response.
	ResponseID string
	Origin     Socket
	// Items and TranscriptBytes describe the published transcript.
	Items           int
	TranscriptBytes int64
	// UpdatedAt is when the state was last refreshed (server time on Redis):
	// a reserve refreshes it once 15/256 of the TTL have passed (counted in
	// ticks of a 256th of it), within a sixteenth.
	UpdatedAt time.Time
}

func (st *State) setContinuation(c continuation) {
	st.HasContinuation = true
	st.ResponseID = c.ResponseID
	st.Origin = c.Origin
	st.Items = c.Transcript.Items
	st.TranscriptBytes = c.Transcript.Bytes
}

// Store is a continuation store on Redis or in process. It is safe for
// concurrent use.
type Store struct {
	opts    Options
	backend backend
	guard   *redisconn.Guard // the circuit breakers, and whether calls run on the caller's goroutine
	ref     string           // the reference of opts.Replica (Socket)
	guesses *guesses         // the continuations of this store's records, for Guess; nil without Options.GuessOwners
}

// continuation is what a published turn leaves for the next one.
type continuation struct {
	ResponseID string
	Origin     Socket
	Signature  uint64
	Transcript fingerprint.Transcript
}

// reserved is what a backend's reserve returns: the new turn, whether the
// owner had live state, the continuation it consumed (nil when none), and
// how many owners the call evicted.
type reserved struct {
	Turn    Turn
	Existed bool
	Prev    *continuation
	Evicted int

	seq uint64 // the turn's sequence number, as Redis answers it
}

// published is what a backend's publish returns.
type published struct {
	Outcome Outcome
	Evicted int
}

// backend is one storage of owner states with the store's semantics: the
// in-process model (memory.go) and Redis (redis.go).
type backend interface {
	reserve(ctx context.Context, owner identity.Owner) (reserved, error)
	publish(ctx context.Context, owner identity.Owner, turn Turn, c continuation) (published, error)
	abort(ctx context.Context, owner identity.Owner, turn Turn) (bool, error)
	isCurrent(ctx context.Context, owner identity.Owner, turn Turn) (bool, error)
	clear(ctx context.Context, owner identity.Owner) (bool, error)
	parser() *fingerprint.Parser
	inspect(ctx context.Context, owner identity.Owner) (State, error)
	prune(ctx context.Context, partition int) (Evictions, error)
	stats(ctx context.Context) ([]PartitionStats, error)
	audit(ctx context.Context) (Audit, error)
}

func newStore(opts Options, inline bool, open func(Options) (backend, error)) (*Store, error) {
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	b, err := open(opts)
	if err != nil {
		return nil, err
	}
	return &Store{opts: opts, backend: b, guard: newGuard(opts, inline), ref: replicaRef(opts.Replica), guesses: newGuesses(opts)}, nil
}

func init() {
	storehooks.Set(func(o Options, now func() time.Time) Options {
		o.now = now
		return o
	}, (*Store).withReplica)
}

// withReplica returns a store that shares s's state, options and circuit
// breakers but names replica as the origin of responses recorded without
// one, for one process that hosts several replicas over one in-process
// backend (internal/storehooks).
func (s *Store) withReplica(replica string) *Store {
	c := *s
	c.opts.Replica = replica
	if replica == "" {
		c.opts.Replica = randomReplica()
	}
	c.ref = replicaRef(c.opts.Replica)
	c.guesses = newGuesses(c.opts) // a replica guesses from its own records
	return &c
}

// ProfileID returns the identity of the fingerprint profile the store
// parses with (fingerprint.Profile.ID): Options.Profile's, or, when it was
// left zero, the namespace's once the store has read it.
func (s *Store) ProfileID() string { return s.backend.parser().ProfileID() }

// ParseRequest parses a request body under the namespace's fingerprint
// profile and key; errors wrap ErrInvalidRequest and name the problem's path
// and offset (see package fingerprint). The request refers to body, which
// the caller must not modify while it uses the request.
func (s *Store) ParseRequest(body []byte) (*fingerprint.Request, error) {
	return s.backend.parser().Parse(body)
}

// ReadRequest reads a request body of size bytes from r (to its end when
// size is negative) and parses it as ParseRequest does, doing what it can
// while the body arrives (fingerprint.Parser.ReadRequest). Errors reading
// r are returned as they are.
func (s *Store) ReadRequest(r io.Reader, size int) (*fingerprint.Request, error) {
	return s.backend.parser().ReadRequest(r, size)
}

// SkimRequest parses a request body as ParseRequest does, but passes over
// its input unread (fingerprint.Parser.Skim): for a gateway that never
// continues. Reserve reserves nothing for it.
func (s *Store) SkimRequest(body []byte) (*fingerprint.Request, error) {
	return s.backend.parser().Skim(body)
}

// Options returns the store's options with defaults filled in.
func (s *Store) Options() Options { return s.opts }

// InProcess reports whether the store keeps its states in this process
// (NewMemory): its operations cost no round trip.
func (s *Store) InProcess() bool {
	_, ok := s.backend.(*memory)
	return ok
}

// partition returns the owner's partition.
func (s *Store) partition(owner identity.Owner) int { return owner.Partition(s.opts.Partitions) }

// Reserve reserves a new turn for owner and says whether req may continue
// the owner's previous turn. It consumes the owner's continuation whatever
// the answer. It never fails and returns within OpTimeout: a store failure
// gives ReasonStoreUnavailable with Err set and no turn. req comes from
// ParseRequest (a request parsed otherwise is parsed again, from its body,
// under the namespace's profile and key); a nil req counts as an empty
// request. A request whose input Parse skipped (InputSkipped: the upstream
// holds its conversation) reserves nothing, as one without owner.
func (s *Store) Reserve(ctx context.Context, owner identity.Owner, req *fingerprint.Request) *Reservation {
	start := time.Now()
	res := &Reservation{Owner: owner, replica: s.opts.Replica}
	switch {
	case s.opts.Disabled:
		res.Reason = ReasonDisabled
	case owner.IsZero() || req != nil && req.InputSkipped():
		res.Reason = ReasonMissingIdentity
	default:
		req = s.reparse(req)
	}
	if req == nil {
		req = s.reparse(nil)
	}
	res.req, res.UpstreamItems = req, req.Len()
	if res.Reason != ReasonNone {
		return res // nothing to reserve: the request goes as received
	}
	var mine *guessed // this store's last record of owner
	if s.guesses != nil {
		mine = s.guesses.take(owner) // the reserve takes the continuation
		res.at = s.opts.now()
	}
	got, err := call(ctx, s, s.partition(owner), func(ctx context.Context) (reserved, error) {
		return s.backend.reserve(ctx, owner)
	})
	if err != nil {
		s.guesses.putBack(owner, mine)
		res.Reason = ReasonStoreUnavailable
		res.Err = unavailable("reserve", err)
		s.observe(Event{Op: OpReserve, Owner: owner, Reason: res.Reason, Err: res.Err}, start)
		return res
	}
	res.Turn = got.Turn
	res.stay = mine.next(got)
	s.guesses.found(mine, got)
	s.decide(res, got.Existed, got.Prev)
	s.observe(Event{Op: OpReserve, Owner: owner, Reason: res.Reason, Evicted: got.Evicted}, start)
	return res
}

// decide sets res's reason, and its continuation when it continues, for
// res's request and the owner's state: existed tells whether the owner had
// live state, prev is the continuation it left (nil when a turn took it).
func (s *Store) decide(res *Reservation, existed bool, prev *continuation) {
	req := res.req
	switch {
	case !existed:
		res.Reason = ReasonMissingState
	case prev == nil:
		res.Reason = ReasonSupersededTurn
	case prev.Signature != req.Signature():
		res.Reason = ReasonPromptChanged
	case !prev.Transcript.PrefixOf(req):
		res.Reason = ReasonNotAppendOnly
	case prev.Transcript.Items == req.Len():
		res.Reason = ReasonEmptyDelta
	default:
		res.PreviousResponseID, res.taken = prev.ResponseID, prev
		res.Origin = s.named(prev.Origin)
		res.Delta = make([]json.RawMessage, 0, req.Len()-prev.Transcript.Items)
		for i := prev.Transcript.Items; i < req.Len(); i++ {
			res.Delta = append(res.Delta, req.Item(i))
		}
		res.UpstreamItems = len(res.Delta)
	}
}

// reparse returns req parsed by the namespace's parser: req itself, or, when
// another parser (another key or profile) made it, req's body parsed again.
func (s *Store) reparse(req *fingerprint.Request) *fingerprint.Request {
	p := s.backend.parser()
	body := []byte("{}")
	if req != nil {
		if req.ParsedBy(p) {
			return req
		}
		body = req.Body()
	}
	again, err := p.Parse(body)
	if err != nil { // not reached: every profile accepts the same bodies
		return req
	}
	return again
}

// Record publishes the upstream's answer to a reserved turn as the owner's
// continuation, if the turn is still the owner's current one. Invalid output
// items or names give ErrInvalidRequest before anything is sent; store
// failures give an error wrapping ErrUnavailable.
//
// Give Record and Abort a context that outlives the client's request
// (context.WithoutCancel): a client that hangs up after the upstream
// answered should not cost the owner its continuation.
func (s *Store) Record(ctx context.Context, res *Reservation, out Result) (Outcome, error) {
	if res == nil || res.Owner.IsZero() || res.Turn == 0 {
		return OutcomeIgnored, nil
	}
	start := time.Now()
	switch {
	case out.Socket.Any:
		out.Socket = Socket{Any: true}
	case out.Socket.Replica == "":
		out.Socket.Replica = s.opts.Replica
	}
	if err := validResult(out); err != nil {
		return "", err
	}
	req := s.reparse(res.req)
	fp, err := req.Transcript(out.Output)
	if err != nil {
		return "", err
	}
	var got published
	var c continuation
	removed := false // by a dropped record's abort
	if out.ResponseID == "" || (!out.Socket.Any && out.Socket.ID == 0) || fp.Bytes > s.opts.MaxOwnerBytes {
		got.Outcome = OutcomeDropped
		removed, err = call(ctx, s, s.partition(res.Owner), func(ctx context.Context) (bool, error) {
			return s.backend.abort(ctx, res.Owner, res.Turn)
		})
	} else {
		if !out.Socket.Any {
			out.Socket.Replica = replicaRef(out.Socket.Replica)
			fp.References = nil // the upstream keeps no response: a reference names nothing
		}
		// The id is kept (guesses, the in-process states) apart from the
		// answer it was read from, which it may share memory with.
		c = continuation{ResponseID: strings.Clone(out.ResponseID), Origin: out.Socket, Signature: req.Signature(), Transcript: fp}
		got, err = s.publish(ctx, res, c)
	}
	return s.published(OpRecord, res, c, got, err, removed, start)
}

// Restore gives the owner back the continuation res took, when res
// continues from a response the upstream keeps (Socket{Any: true}) and is
// still the owner's current turn: for a continued turn that published
// nothing the client got (the upstream answered an error, or a stream the
// client did not get to its end), so that the client's next try continues
// from the same response. It reports what Record does (OutcomePublished,
// OutcomeStale, OutcomeGone), and OutcomeIgnored, sending nothing, for a
// reservation that took no such continuation: one on a socket is not
// given back, as a socket that failed a turn keeps no response. Give it a
// context that outlives the client's request, as Record.
func (s *Store) Restore(ctx context.Context, res *Reservation) (Outcome, error) {
	if !res.Continues() || res.taken == nil || !res.taken.Origin.Any || res.Owner.IsZero() || res.Turn == 0 {
		return OutcomeIgnored, nil
	}
	start := time.Now()
	got, err := s.publish(ctx, res, *res.taken)
	return s.published(OpRestore, res, *res.taken, got, err, false, start)
}

// publish publishes c as res's owner's continuation at res's turn.
func (s *Store) publish(ctx context.Context, res *Reservation, c continuation) (published, error) {
	return call(ctx, s, s.partition(res.Owner), func(ctx context.Context) (published, error) {
		return s.backend.publish(ctx, res.Owner, res.Turn, c)
	})
}

// published ends op, a Record or Restore of c for res that got got and
// err (removed: a dropped record removed the state): the guesses learn
// it, and the observer sees it.
func (s *Store) published(op Op, res *Reservation, c continuation, got published, err error, removed bool, start time.Time) (Outcome, error) {
	if err != nil {
		err = unavailable(string(op), err)
		got.Outcome = ""
	}
	switch {
	case got.Outcome == OutcomePublished:
		s.guesses.remember(res.Owner, c, res.at, res.stay)
	case got.Outcome == OutcomeStale, got.Outcome == OutcomeDropped && !removed:
		// A later turn holds the state: its record is the one to remember.
	default:
		s.guesses.forget(res.Owner)
	}
	s.observe(Event{Op: op, Owner: res.Owner, Outcome: got.Outcome, Err: err, Evicted: got.Evicted}, start)
	return got.Outcome, err
}

// Abort removes the owner's state if res is still its current turn, and
// reports whether it did. A reservation without owner or turn does nothing.
func (s *Store) Abort(ctx context.Context, res *Reservation) (bool, error) {
	if res == nil || res.Owner.IsZero() || res.Turn == 0 {
		return false, nil
	}
	removed, err := run(ctx, s, OpAbort, res.Owner, func(ctx context.Context) (bool, error) {
		return s.backend.abort(ctx, res.Owner, res.Turn)
	})
	if removed || err != nil {
		s.guesses.forget(res.Owner)
	}
	return removed, err
}

// IsCurrent reports whether res is still its owner's current turn. The
// answer is advisory: another replica may reserve right after.
func (s *Store) IsCurrent(ctx context.Context, res *Reservation) (bool, error) {
	if res == nil || res.Owner.IsZero() || res.Turn == 0 {
		return false, nil
	}
	return run(ctx, s, OpIsCurrent, res.Owner, func(ctx context.Context) (bool, error) {
		return s.backend.isCurrent(ctx, res.Owner, res.Turn)
	})
}

// Clear removes the owner's state whatever its turn. Clearing the zero
// owner does nothing.
func (s *Store) Clear(ctx context.Context, owner identity.Owner) error {
	if owner.IsZero() {
		return nil
	}
	_, err := run(ctx, s, OpClear, owner, func(ctx context.Context) (bool, error) {
		return s.backend.clear(ctx, owner)
	})
	s.guesses.forget(owner) // after the clear: a record that published before it is forgotten too
	return err
}

// Inspect reads the owner's state without changing it, for operators and
// tests.
func (s *Store) Inspect(ctx context.Context, owner identity.Owner) (State, error) {
	if owner.IsZero() {
		return State{}, nil
	}
	st, err := run(ctx, s, OpInspect, owner, func(ctx context.Context) (State, error) {
		return s.backend.inspect(ctx, owner)
	})
	st.Origin = s.named(st.Origin)
	return st, err
}

// named returns a socket of a state with its replica named as Socket says:
// by its name when it is this store's.
func (s *Store) named(sock Socket) Socket {
	if sock.Replica == s.ref {
		sock.Replica = s.opts.Replica
	}
	return sock
}

// run is call for the operations whose event carries no decision: it wraps
// errors in ErrUnavailable and reports the event. Operations of an owner go
// through its partition's breaker; the others (zero owner) through none.
func run[T any](ctx context.Context, s *Store, op Op, owner identity.Owner, fn func(context.Context) (T, error)) (T, error) {
	p := -1
	if !owner.IsZero() {
		p = s.partition(owner)
	}
	return runOn(ctx, s, op, owner, p, fn)
}

// runOn is run on partition p's breaker (none for p < 0).
func runOn[T any](ctx context.Context, s *Store, op Op, owner identity.Owner, p int, fn func(context.Context) (T, error)) (T, error) {
	start := time.Now()
	v, err := call(ctx, s, p, fn)
	if err != nil {
		err = unavailable(string(op), err)
	}
	s.observe(Event{Op: op, Owner: owner, Err: err}, start)
	return v, err
}

func unavailable(op string, err error) error {
	return fmt.Errorf("%w: %s: %w", ErrUnavailable, op, err)
}

func validResult(out Result) error {
	if out.ResponseID != "" {
		if err := validText("response id", out.ResponseID, maxResponseIDBytes); err != nil {
			return fmt.Errorf("%w: %w", ErrInvalidRequest, err)
		}
	}
	if out.Socket.Any {
		return nil
	}
	if names.IsReplicaRef(out.Socket.Replica) {
		return nil
	}
	if err := names.Replica(out.Socket.Replica); err != nil {
		return fmt.Errorf("%w: socket replica %v", ErrInvalidRequest, err)
	}
	return nil
}

// replicaRef returns the reference of a replica name or reference: what an
// owner's state keeps of it.
func replicaRef(replica string) string { return names.ReplicaRef(names.ReplicaDigest(replica)) }

// The stored-bytes estimate of an owner's state, the same on every backend:
// stateOverhead plus the names Redis keeps for it (its key and its LRU
// member) times stateNameCost, plus its encoded continuation. Calibrated
// with BenchmarkMemoryPerOwner against Redis 7 used_memory (hash, TTL and
// LRU entries, dictionary buckets, allocator rounding) of owners filled at
// a pace that leaves few operation answers alive: within 3% for namespaces
// of 1 to 64 bytes and owner ids up to 256 bytes.
const (
	stateOverhead = 267
	// stateNameCost is the cost of a byte of the names, in hundredths:
	// allocator rounding adds to each byte.
	stateNameCost = 115
)

// stateBytes returns the estimate for the state of owner (in partition p)
// without its continuation: its key is the partition's owner prefix and the
// owner key, its LRU member the owner key. The Redis scripts add the
// encoded continuation's length.
func (k keyspace) stateBytes(p int, owner identity.Owner) int64 {
	return stateOverhead + int64(len(k.parts[p].prefix)+2*len(owner.Key()))*stateNameCost/100
}
