package integration

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/redis/go-redis/v9"

	"github.com/contstore/contstore/fingerprint"
	"github.com/contstore/contstore/identity"
	"github.com/contstore/contstore/internal/names"
	"github.com/contstore/contstore/internal/oracle"
	"github.com/contstore/contstore/internal/redistest"
	"github.com/contstore/contstore/store"
)

// linCheckTimeout bounds one porcupine check of a legal history: seconds
// on a quiet machine, far more on a loaded one under -race.
const linCheckTimeout = 2 * time.Minute

// linBrokenCheckTimeout bounds each check of the non-atomic store, which
// takes several attempts and usually ends as soon as one is illegal.
const linBrokenCheckTimeout = 30 * time.Second

// linOp names an operation of the histories.
type linOp int

const (
	linReserve linOp = iota
	linRecord
	linAbort
	linIsCurrent
	linClear
	linInspect
)

func (o linOp) String() string {
	return [...]string{"reserve", "record", "abort", "is-current", "clear", "inspect"}[o]
}

// linRequest is one request body of the fixed family every owner draws
// from: a prompt variant and input items named by letters.
type linRequest struct {
	prompt string // extra top-level members, "" for the plain prompt
	items  string // one letter per item: a and b are user messages, x an assistant one
	weight int
}

// linRequests is the request family. The main line extends itself item by
// item; the forks edit history and the flex variants change the prompt, so
// every reason of Reserve comes up.
var linRequests = []linRequest{
	{"", "", 1},
	{"", "a", 3},
	{"", "ax", 3},
	{"", "axb", 3},
	{"", "axbx", 3},
	{"", "b", 1},
	{"", "ab", 1},
	{`"service_tier":"flex"`, "ax", 1},
	{`"service_tier":"flex"`, "axb", 1},
}

func (r linRequest) body() []byte {
	var items []string
	for _, c := range r.items {
		role := "user"
		if c == 'x' {
			role = "assistant"
		}
		items = append(items, fmt.Sprintf(`{"type":"message","role":%q,"content":%q}`, role, string(c)))
	}
	members := []string{`"model":"m"`, `"input":[` + strings.Join(items, ",") + `]`}
	if r.prompt != "" {
		members = append(members, r.prompt)
	}
	return []byte("{" + strings.Join(members, ",") + "}")
}

// linInput is an operation's arguments. Req and Turn come from the
// reservation an operation acts on; Origin is where a record's response
// lives (replica#socket).
type linInput struct {
	Op       linOp
	Owner    int
	Req      int
	Turn     uint64
	Response string
	Origin   string
}

// linOutput is an operation's observable result. Reserve fills Reason,
// Previous, Origin, Delta and Turn; Record fills Outcome; Abort and
// IsCurrent fill OK; Inspect fills OK (exists), Turn, Cont, Previous
// (the published response), Origin and Items.
type linOutput struct {
	Reason   store.Reason
	Previous string
	Origin   string
	Delta    int
	Turn     uint64
	Outcome  store.Outcome
	OK       bool
	Cont     bool
	Items    int
}

// linState is the sequential model of one owner: whether it has state, its
// current turn, the largest turn it was ever given, and the published
// continuation (response, origin and the recorded request, whose input is
// the whole transcript since records carry no output items).
type linState struct {
	Exists   bool
	Turn     uint64
	Last     uint64
	Cont     bool
	Response string
	Origin   string
	Req      int
}

// linOracle holds each request of the family as the oracle reads it: its
// prompt variant and one item per letter.
var linOracle = func() []oracle.Request[string] {
	out := make([]oracle.Request[string], len(linRequests))
	for i, r := range linRequests {
		out[i] = oracle.Request[string]{Prompt: r.prompt, Items: strings.Split(r.items, "")}
	}
	return out
}()

// linDecide is Reserve's decision for req from state s, turn aside.
func linDecide(s linState, req int) linOutput {
	prior := oracle.Prior[string]{Live: s.Exists}
	if s.Cont {
		rec := linOracle[s.Req]
		prior.Continuation = &oracle.Continuation[string]{ResponseID: s.Response, Prompt: rec.Prompt, Transcript: rec.Items}
	}
	d := oracle.Reserve(prior, linOracle[req])
	out := linOutput{Reason: d.Reason, Previous: d.ResponseID, Delta: d.UpstreamItems}
	if d.Continues() {
		out.Origin = s.Origin
	}
	return out
}

// linInspectOf is what Inspect reads in state s.
func linInspectOf(s linState) linOutput {
	if !s.Exists {
		return linOutput{}
	}
	out := linOutput{OK: true, Turn: s.Turn}
	if s.Cont {
		out.Cont, out.Previous, out.Origin, out.Items = true, s.Response, s.Origin, len(linRequests[s.Req].items)
	}
	return out
}

// linStep applies one operation to one owner's state. A reserve may draw
// any turn larger than every turn the owner was given before.
func linStep(s linState, in linInput, out linOutput) (bool, linState) {
	switch in.Op {
	case linReserve:
		want := linDecide(s, in.Req)
		want.Turn = out.Turn
		if out != want || out.Turn <= s.Last {
			return false, s
		}
		return true, linState{Exists: true, Turn: out.Turn, Last: out.Turn}
	case linRecord:
		switch {
		case !s.Exists:
			return out == linOutput{Outcome: store.OutcomeGone}, s
		case s.Turn != in.Turn:
			return out == linOutput{Outcome: store.OutcomeStale}, s
		}
		s.Cont, s.Response, s.Origin, s.Req = true, in.Response, in.Origin, in.Req
		return out == linOutput{Outcome: store.OutcomePublished}, s
	case linAbort:
		ok := s.Exists && s.Turn == in.Turn
		if ok {
			s = linState{Last: s.Last}
		}
		return out == linOutput{OK: ok}, s
	case linIsCurrent:
		return out == linOutput{OK: s.Exists && s.Turn == in.Turn}, s
	case linClear:
		return out == linOutput{}, linState{Last: s.Last}
	case linInspect:
		return out == linInspectOf(s), s
	}
	return false, s
}

// linModel checks each owner on its own.
var linModel = porcupine.Model{
	Partition: func(history []porcupine.Operation) [][]porcupine.Operation {
		by := map[int][]porcupine.Operation{}
		for _, op := range history {
			o := op.Input.(linInput).Owner
			by[o] = append(by[o], op)
		}
		var out [][]porcupine.Operation
		for _, o := range slices.Sorted(maps.Keys(by)) {
			out = append(out, by[o])
		}
		return out
	},
	Init: func() any { return linState{} },
	Step: func(state, input, output any) (bool, any) {
		return linStep(state.(linState), input.(linInput), output.(linOutput))
	},
	DescribeOperation: func(input, output any) string {
		in, out := input.(linInput), output.(linOutput)
		req := func(i int) string { return fmt.Sprintf("r%d[%s]", i, linRequests[i].items) }
		switch in.Op {
		case linReserve:
			how := string(out.Reason)
			if out.Reason == store.ReasonNone {
				how = "continue " + out.Previous + "@" + out.Origin
			}
			return fmt.Sprintf("o%d reserve(%s) → %s Δ%d turn %d", in.Owner, req(in.Req), how, out.Delta, out.Turn)
		case linRecord:
			return fmt.Sprintf("o%d record(turn %d, %s, %s) → %s", in.Owner, in.Turn, req(in.Req), in.Response, out.Outcome)
		case linAbort, linIsCurrent:
			return fmt.Sprintf("o%d %s(turn %d) → %v", in.Owner, in.Op, in.Turn, out.OK)
		case linClear:
			return fmt.Sprintf("o%d clear()", in.Owner)
		default:
			if !out.OK {
				return fmt.Sprintf("o%d inspect() → none", in.Owner)
			}
			return fmt.Sprintf("o%d inspect() → turn %d cont=%v %s@%s items=%d", in.Owner, out.Turn, out.Cont, out.Previous, out.Origin, out.Items)
		}
	},
	DescribeState: func(state any) string {
		s := state.(linState)
		switch {
		case !s.Exists:
			return fmt.Sprintf("none (last turn %d)", s.Last)
		case !s.Cont:
			return fmt.Sprintf("turn %d", s.Turn)
		}
		return fmt.Sprintf("turn %d, %s@%s for r%d", s.Turn, s.Response, s.Origin, s.Req)
	},
}

// linHandle is a reservation a client holds.
type linHandle struct {
	owner, req int
	turn       uint64
	res        *store.Reservation
}

// linTarget is what the histories are taken from: one replica's view.
type linTarget interface {
	replica() string
	reserve(ctx context.Context, owner, req int) (linHandle, linOutput, error)
	record(ctx context.Context, h linHandle, response string, socket uint64) (linOutput, error)
	abort(ctx context.Context, h linHandle) (bool, error)
	isCurrent(ctx context.Context, h linHandle) (bool, error)
	clear(ctx context.Context, owner int) error
	inspect(ctx context.Context, owner int) (linOutput, error)
}

// linStore is a replica of the store under test.
type linStore struct {
	s      *store.Store
	owners []identity.Owner
	reqs   []*fingerprint.Request
}

func linOwners(t *testing.T, n int) []identity.Owner {
	owners := make([]identity.Owner, n)
	for i := range owners {
		var err error
		// Odd owners are sub-agents of the session of the owner before them.
		if i%2 == 0 {
			owners[i], err = identity.Main(fmt.Sprintf("lin-%d", i/2))
		} else {
			owners[i], err = identity.Agent(fmt.Sprintf("lin-%d", i/2), "agent")
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	return owners
}

func newLinStore(t *testing.T, c redis.UniversalClient, opts store.Options, owners []identity.Owner) *linStore {
	s, err := store.NewRedis(c, opts)
	if err != nil {
		t.Fatal(err)
	}
	ls := &linStore{s: s, owners: owners}
	for _, r := range linRequests {
		req, err := s.ParseRequest(r.body())
		if err != nil {
			t.Fatal(err)
		}
		ls.reqs = append(ls.reqs, req)
	}
	return ls
}

func (l *linStore) replica() string { return l.s.Options().Replica }

func (l *linStore) reserve(ctx context.Context, owner, req int) (linHandle, linOutput, error) {
	res := l.s.Reserve(ctx, l.owners[owner], l.reqs[req])
	if res.Err != nil {
		return linHandle{}, linOutput{}, res.Err
	}
	out := linOutput{Reason: res.Reason, Previous: res.PreviousResponseID, Delta: res.UpstreamItems, Turn: uint64(res.Turn)}
	if res.Origin != (store.Socket{}) {
		out.Origin = linOrigin(res.Origin.Replica, res.Origin.ID)
	}
	return linHandle{owner: owner, req: req, turn: uint64(res.Turn), res: res}, out, nil
}

func (l *linStore) record(ctx context.Context, h linHandle, response string, socket uint64) (linOutput, error) {
	o, err := l.s.Record(ctx, h.res, store.Result{ResponseID: response, Socket: store.Socket{ID: socket}})
	return linOutput{Outcome: o}, err
}

func (l *linStore) abort(ctx context.Context, h linHandle) (bool, error) {
	return l.s.Abort(ctx, h.res)
}

func (l *linStore) isCurrent(ctx context.Context, h linHandle) (bool, error) {
	return l.s.IsCurrent(ctx, h.res)
}

func (l *linStore) clear(ctx context.Context, owner int) error {
	return l.s.Clear(ctx, l.owners[owner])
}

func (l *linStore) inspect(ctx context.Context, owner int) (linOutput, error) {
	st, err := l.s.Inspect(ctx, l.owners[owner])
	if err != nil || !st.Exists {
		return linOutput{}, err
	}
	out := linOutput{OK: true, Turn: uint64(st.Turn)}
	if st.HasContinuation {
		out.Cont, out.Previous, out.Origin, out.Items = true, st.ResponseID, linOrigin(st.Origin.Replica, st.Origin.ID), st.Items
	}
	return out, nil
}

// linOrigin names the socket of a replica, known by its name or by its
// reference (a reservation names other stores' replicas by reference,
// store.Socket), by the reference in both cases.
func linOrigin(replica string, socket uint64) string {
	return names.ReplicaRef(names.ReplicaDigest(replica)) + "/" + strconv.FormatUint(socket, 10)
}

// linBroken keeps the model's state in Redis without atomicity: each
// operation reads, waits gap, then writes, in separate commands. It is the
// negative control of the harness.
type linBroken struct {
	c    redis.UniversalClient
	ns   string
	name string
	gap  time.Duration
}

func (b *linBroken) key(owner int) string { return fmt.Sprintf("%s:lin:%d", b.ns, owner) }

func (b *linBroken) replica() string { return b.name }

func (b *linBroken) read(ctx context.Context, owner int) (linState, error) {
	m, err := b.c.HGetAll(ctx, b.key(owner)).Result()
	if err != nil || len(m) == 0 {
		return linState{}, err
	}
	s := linState{Exists: true}
	s.Turn, _ = strconv.ParseUint(m["t"], 10, 64)
	if r, ok := m["r"]; ok {
		s.Cont, s.Response, s.Origin = true, r, m["o"]
		s.Req, _ = strconv.Atoi(m["q"])
	}
	return s, nil
}

func (b *linBroken) reserve(ctx context.Context, owner, req int) (linHandle, linOutput, error) {
	s, err := b.read(ctx, owner)
	if err != nil {
		return linHandle{}, linOutput{}, err
	}
	time.Sleep(b.gap)
	turn, err := b.c.Incr(ctx, b.ns+":lin:seq").Uint64()
	if err != nil {
		return linHandle{}, linOutput{}, err
	}
	_, err = b.c.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.Del(ctx, b.key(owner))
		p.HSet(ctx, b.key(owner), "t", turn)
		return nil
	})
	out := linDecide(s, req)
	out.Turn = turn
	return linHandle{owner: owner, req: req, turn: turn}, out, err
}

func (b *linBroken) record(ctx context.Context, h linHandle, response string, socket uint64) (linOutput, error) {
	cur, err := b.c.HGet(ctx, b.key(h.owner), "t").Uint64()
	switch {
	case errors.Is(err, redis.Nil):
		return linOutput{Outcome: store.OutcomeGone}, nil
	case err != nil:
		return linOutput{}, err
	case cur != h.turn:
		return linOutput{Outcome: store.OutcomeStale}, nil
	}
	time.Sleep(b.gap)
	err = b.c.HSet(ctx, b.key(h.owner), "r", response, "o", linOrigin(b.name, socket), "q", h.req).Err()
	return linOutput{Outcome: store.OutcomePublished}, err
}

func (b *linBroken) abort(ctx context.Context, h linHandle) (bool, error) {
	ok, err := b.isCurrent(ctx, h)
	if !ok || err != nil {
		return false, err
	}
	time.Sleep(b.gap)
	return true, b.c.Del(ctx, b.key(h.owner)).Err()
}

func (b *linBroken) isCurrent(ctx context.Context, h linHandle) (bool, error) {
	cur, err := b.c.HGet(ctx, b.key(h.owner), "t").Uint64()
	if errors.Is(err, redis.Nil) {
		return false, nil
	}
	return err == nil && cur == h.turn, err
}

func (b *linBroken) clear(ctx context.Context, owner int) error {
	return b.c.Del(ctx, b.key(owner)).Err()
}

func (b *linBroken) inspect(ctx context.Context, owner int) (linOutput, error) {
	s, err := b.read(ctx, owner)
	return linInspectOf(s), err
}

// linWorkload sizes a run.
type linWorkload struct {
	clients, owners, ops int
}

// linRun has w.clients clients, client i on targets[i%len(targets)], run
// w.ops random operations in total over w.owners owners, and returns the
// history. Any error fails the test.
func linRun(t *testing.T, targets []linTarget, w linWorkload) []porcupine.Operation {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	seed := rand.Uint64()
	start := time.Now()
	now := func() int64 { return int64(time.Since(start)) }
	var (
		issued   atomic.Int64
		wg       sync.WaitGroup
		errOnce  sync.Once
		firstErr error
	)
	histories := make([][]porcupine.Operation, w.clients)
	for c := range w.clients {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(seed, uint64(c)))
			tg := targets[c%len(targets)]
			var held []linHandle
			responses := 0
			for ctx.Err() == nil && issued.Add(1) <= int64(w.ops) {
				op, err := linOne(ctx, rng, tg, c, w.owners, &held, &responses, now)
				if err != nil {
					errOnce.Do(func() { firstErr = fmt.Errorf("client %d on %s: %s: %w", c, tg.replica(), op.Input.(linInput).Op, err) })
					cancel()
					return
				}
				histories[c] = append(histories[c], op)
			}
		})
	}
	wg.Wait()
	if firstErr != nil {
		t.Fatalf("operation failed on a healthy server: %v", firstErr)
	}
	if ctx.Err() != nil {
		t.Fatalf("run did not finish: %v", ctx.Err())
	}
	return slices.Concat(histories...)
}

// linOne draws and runs one operation of client c.
func linOne(ctx context.Context, rng *rand.Rand, tg linTarget, c, owners int, held *[]linHandle, responses *int, now func() int64) (porcupine.Operation, error) {
	op := linOp(0)
	switch p := rng.IntN(100); {
	case p < 35:
		op = linReserve
	case p < 65:
		op = linRecord
	case p < 72:
		op = linAbort
	case p < 80:
		op = linIsCurrent
	case p < 85:
		op = linClear
	default:
		op = linInspect
	}
	if op >= linRecord && op <= linIsCurrent && len(*held) == 0 {
		op = linReserve
	}
	// Half the operations go to a few hot owners, so that operations on one
	// owner overlap often.
	in := linInput{Op: op, Owner: rng.IntN(owners)}
	if rng.IntN(2) == 0 {
		in.Owner = rng.IntN(min(4, owners))
	}
	var h linHandle
	if op >= linRecord && op <= linIsCurrent {
		// Mostly the latest reservation, sometimes an older one.
		h = (*held)[len(*held)-1]
		if rng.IntN(4) == 0 {
			h = (*held)[rng.IntN(len(*held))]
		}
		in.Owner, in.Req, in.Turn = h.owner, h.req, h.turn
	}
	var (
		out linOutput
		err error
	)
	call := now()
	switch op {
	case linReserve:
		in.Req = linPick(rng)
		h, out, err = tg.reserve(ctx, in.Owner, in.Req)
		if err == nil {
			*held = append(*held, h)
			if len(*held) > 6 {
				*held = (*held)[1:]
			}
		}
	case linRecord:
		*responses++
		socket := uint64(c + 1)
		in.Response = fmt.Sprintf("resp_%d_%d", c, *responses)
		in.Origin = linOrigin(tg.replica(), socket)
		out, err = tg.record(ctx, h, in.Response, socket)
	case linAbort:
		out.OK, err = tg.abort(ctx, h)
	case linIsCurrent:
		out.OK, err = tg.isCurrent(ctx, h)
	case linClear:
		err = tg.clear(ctx, in.Owner)
	case linInspect:
		out, err = tg.inspect(ctx, in.Owner)
	}
	return porcupine.Operation{ClientId: c, Input: in, Call: call, Output: out, Return: now()}, err
}

// linPick draws a request of the family by weight.
func linPick(rng *rand.Rand) int {
	total := 0
	for _, r := range linRequests {
		total += r.weight
	}
	n := rng.IntN(total)
	for i, r := range linRequests {
		if n -= r.weight; n < 0 {
			return i
		}
	}
	return 0
}

// linSummary counts operations by kind and result, for the log.
func linSummary(history []porcupine.Operation) string {
	counts := map[string]int{}
	for _, op := range history {
		in, out := op.Input.(linInput), op.Output.(linOutput)
		k := in.Op.String()
		switch in.Op {
		case linReserve:
			k += ":" + cmp.Or(string(out.Reason), "continue")
		case linRecord:
			k += ":" + string(out.Outcome)
		case linAbort, linIsCurrent, linInspect:
			k += ":" + strconv.FormatBool(out.OK)
		}
		counts[k]++
	}
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(counts)) {
		parts = append(parts, fmt.Sprintf("%s=%d", k, counts[k]))
	}
	return strings.Join(parts, " ")
}

// linVisualize writes porcupine's view of a checked history to a file that
// outlives the test and returns its path.
func linVisualize(t *testing.T, info porcupine.LinearizationInfo) string {
	t.Helper()
	f, err := os.CreateTemp(os.TempDir(), "linearizability-*.html")
	if err != nil {
		return "(not written: " + err.Error() + ")"
	}
	defer f.Close()
	if err := porcupine.Visualize(linModel, info, f); err != nil {
		return "(not written: " + err.Error() + ")"
	}
	return f.Name()
}

// linStuckOwners names the owners whose history the check could not
// linearize completely.
func linStuckOwners(history []porcupine.Operation, info porcupine.LinearizationInfo) string {
	parts := linModel.Partition(history)
	var stuck []string
	for i, partials := range info.PartialLinearizations() {
		longest := 0
		for _, l := range partials {
			longest = max(longest, len(l))
		}
		if longest < len(parts[i]) {
			owner := parts[i][0].Input.(linInput).Owner
			stuck = append(stuck, fmt.Sprintf("owner %d (%d of %d operations linearized)", owner, longest, len(parts[i])))
		}
	}
	if len(stuck) > 5 {
		stuck = append(stuck[:5], fmt.Sprintf("and %d more owners", len(stuck)-5))
	}
	return strings.Join(stuck, ", ")
}

// linUniqueTurns fails the test when two reservations got the same turn:
// turns are unique across owners and replicas.
func linUniqueTurns(t *testing.T, history []porcupine.Operation) {
	t.Helper()
	seen := map[uint64]int{}
	for _, op := range history {
		in, out := op.Input.(linInput), op.Output.(linOutput)
		if in.Op != linReserve {
			continue
		}
		if o, dup := seen[out.Turn]; dup {
			t.Fatalf("turn %d given to owner %d and to owner %d", out.Turn, o, in.Owner)
		}
		seen[out.Turn] = in.Owner
	}
}

// linCheckStore runs the workload on two replicas of one namespace, each
// with a client of its own from newClient, and requires a linearizable
// history.
func linCheckStore(t *testing.T, newClient func(testing.TB) redis.UniversalClient, partitions int) {
	linCheck(t, func(t testing.TB, _ *redistest.ReplyLoss) redis.UniversalClient { return newClient(t) }, partitions, 0)
}

// linCheck is linCheckStore with clients that lose the reply of a script
// call after it ran, with probability loss, and send it again once
// (MaxRetries 1, as docs/operating.md recommends).
func linCheck(t *testing.T, newClient func(testing.TB, *redistest.ReplyLoss) redis.UniversalClient, partitions int, loss float64) {
	w := linWorkload{clients: 8, owners: 32, ops: 20_000}
	ns := redistest.Namespace(t)
	owners := linOwners(t, w.owners)
	var targets []linTarget
	var losses []*redistest.ReplyLoss
	for _, replica := range []string{"replica-a", "replica-b"} {
		l := &redistest.ReplyLoss{}
		if loss > 0 {
			// The copy the client sends again keeps its reply: one retry
			// is all the client has.
			var mu sync.Mutex
			lost := map[string]bool{}
			l.Lose(math.MaxInt, func(cmd []byte) bool {
				mu.Lock()
				defer mu.Unlock()
				script := bytes.Contains(cmd, []byte("fcall")) || bytes.Contains(cmd, []byte("evalsha"))
				if !script || lost[string(cmd)] || rand.Float64() >= loss {
					return false
				}
				lost[string(cmd)] = true
				return true
			}, nil)
		}
		losses = append(losses, l)
		c := newClient(t, l)
		redistest.CleanupNamespace(t, c, ns)
		targets = append(targets, newLinStore(t, c, store.Options{
			Namespace:     ns,
			Partitions:    partitions,
			TTL:           time.Hour,
			MaxOwners:     100_000,
			MaxTotalBytes: 1 << 40,
			Replica:       replica,
			OpTimeout:     5 * time.Second,
		}, owners))
	}
	start := time.Now()
	history := linRun(t, targets, w)
	ran := time.Since(start)
	linUniqueTurns(t, history)
	start = time.Now()
	res, info := porcupine.CheckOperationsVerbose(linModel, history, linCheckTimeout)
	checked := time.Since(start)
	t.Logf("%d operations by %d clients on %d owners: run %v, check %v (%s)", len(history), w.clients, w.owners, ran.Round(time.Millisecond), checked.Round(time.Millisecond), res)
	t.Logf("%s", linSummary(history))
	if loss > 0 {
		lost := losses[0].Lost() + losses[1].Lost()
		t.Logf("%d replies lost after their script ran, each sent again", lost)
		if lost == 0 {
			t.Fatal("no reply was lost: the run shows nothing about retries")
		}
	}
	switch res {
	case porcupine.Ok:
	case porcupine.Illegal:
		t.Fatalf("history is not linearizable: %s; visualization: %s", linStuckOwners(history, info), linVisualize(t, info))
	default:
		t.Fatalf("check gave %s: no verdict within %v: %s; visualization: %s", res, linCheckTimeout, linStuckOwners(history, info), linVisualize(t, info))
	}
}

// TestLinearizabilityStandalone checks two replicas sharing a standalone
// server against the model.
func TestLinearizabilityStandalone(t *testing.T) {
	linCheckStore(t, standalone, 4)
}

// TestLinearizabilityCluster checks two replicas sharing the cluster, with
// the default partition count, against the model.
func TestLinearizabilityCluster(t *testing.T) {
	linCheckStore(t, cluster, 16)
}

// TestLinearizabilityUnderReplyLoss checks the standalone and the cluster
// while 5% of script replies are lost after the script ran and the client
// sends the script again: every re-sent script answers as its first run did.
func TestLinearizabilityUnderReplyLoss(t *testing.T) {
	t.Run("standalone", func(t *testing.T) {
		linCheck(t, func(t testing.TB, l *redistest.ReplyLoss) redis.UniversalClient {
			c := redis.NewClient(&redis.Options{Addr: redistest.Standalone(t).Options().Addr, MaxRetries: 1, Dialer: l.Dial})
			t.Cleanup(func() { _ = c.Close() })
			return c
		}, 4, 0.05)
	})
	t.Run("cluster", func(t *testing.T) {
		linCheck(t, func(t testing.TB, l *redistest.ReplyLoss) redis.UniversalClient {
			c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: redistest.Cluster(t).Options().Addrs, MaxRetries: 1, Dialer: l.Dial})
			t.Cleanup(func() { _ = c.Close() })
			return c
		}, 16, 0.05)
	})
}

// TestLinearizabilityCatchesNonAtomicStore runs the harness on linBroken,
// which the model must reject.
func TestLinearizabilityCatchesNonAtomicStore(t *testing.T) {
	w := linWorkload{clients: 8, owners: 2, ops: 800}
	for attempt := 1; attempt <= 5; attempt++ {
		ns := redistest.Namespace(t)
		var targets []linTarget
		for _, replica := range []string{"broken-a", "broken-b"} {
			c := standalone(t)
			redistest.CleanupNamespace(t, c, ns)
			targets = append(targets, &linBroken{c: c, ns: ns, name: replica, gap: 200 * time.Microsecond})
		}
		start := time.Now()
		history := linRun(t, targets, w)
		ran := time.Since(start)
		start = time.Now()
		res := porcupine.CheckOperationsTimeout(linModel, history, linBrokenCheckTimeout)
		t.Logf("attempt %d: %d operations by %d clients on %d owners: run %v, check %v (%s)", attempt, len(history), w.clients, w.owners, ran.Round(time.Millisecond), time.Since(start).Round(time.Millisecond), res)
		if res == porcupine.Illegal {
			return
		}
	}
	t.Fatal("the non-atomic store was never found illegal: the harness cannot catch a lost update")
}
