package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/contstore/contstore/fingerprint"
	"github.com/contstore/contstore/identity"
	"github.com/contstore/contstore/internal/names"
	"github.com/contstore/contstore/internal/oracle"
	"github.com/contstore/contstore/store"
)

// Settings of the fault tests: a short OpTimeout, a client configured
// against the recommendations, and slack for a loaded machine under -race.
const (
	faultOpTimeout = 100 * time.Millisecond
	faultCooldown  = 300 * time.Millisecond
	faultWorkers   = 8
)

// faultBound is the longest a Reserve of a store with OpTimeout opTimeout
// may take beyond what the whole process stalled meanwhile: the OpTimeout
// and four times as much again of slack. On a loaded 2-core machine under
// -race a goroutine may wait a few hundred milliseconds for a thread while
// the lag monitor's goroutine runs on the other (a Reserve took 479 ms with
// OpTimeout 100 ms, 169 ms of it a stall of the whole process). The bound
// still catches what it is for: a call held by the client's 5 s read
// timeout and its retries.
func faultBound(opTimeout time.Duration) time.Duration { return 5 * opTimeout }

// faultOptions returns the store options of the fault tests.
func faultOptions(ns string) store.Options {
	return store.Options{Namespace: ns, OpTimeout: faultOpTimeout, BreakerCooldown: faultCooldown, TTL: time.Hour}
}

// faultStores opens one store per client, each with its own replica id
// and breaker observer, over the same namespace.
func faultStores(t testing.TB, opts store.Options, clients ...redis.UniversalClient) ([]*store.Store, []*faultObserver) {
	t.Helper()
	opens := make([]faultOpener, len(clients))
	for i, c := range clients {
		opens[i] = func(o store.Options) (*store.Store, error) { return store.NewRedis(c, o) }
	}
	return faultStoresOf(t, opts, opens...)
}

// faultOpener opens a store on a client of its own.
type faultOpener func(store.Options) (*store.Store, error)

// faultStoresOf opens one store with each of opens, as faultStores does.
func faultStoresOf(t testing.TB, opts store.Options, opens ...faultOpener) ([]*store.Store, []*faultObserver) {
	t.Helper()
	stores := make([]*store.Store, len(opens))
	observers := make([]*faultObserver, len(opens))
	for i, open := range opens {
		o := opts
		o.Replica = fmt.Sprintf("gw-%c", 'a'+i)
		observers[i] = &faultObserver{}
		o.Observer = observers[i]
		s, err := open(o)
		if err != nil {
			t.Fatalf("opening store %d: %v", i, err)
		}
		stores[i] = s
	}
	return stores, observers
}

// faultObserver keeps the breaker's changes.
type faultObserver struct {
	mu      sync.Mutex
	changes []faultBreakerChange
}

type faultBreakerChange struct {
	at        time.Time
	partition int
	state     store.BreakerState
}

func (o *faultObserver) Observe(store.Event) {}

func (o *faultObserver) BreakerChanged(s store.BreakerStatus) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.changes = append(o.changes, faultBreakerChange{at: time.Now(), partition: s.Partition, state: s.State})
}

// closedAfter returns how long after t partition p's breaker first closed,
// if it did.
func (o *faultObserver) closedAfter(p int, t time.Time) (time.Duration, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, c := range o.changes {
		if c.partition == p && c.state == store.BreakerClosed && !c.at.Before(t) {
			return c.at.Sub(t), true
		}
	}
	return 0, false
}

// probesSince returns how many probes partition p's breaker let through
// since t, and how many of them failed (the breaker opened again).
func (o *faultObserver) probesSince(p int, t time.Time) (probes, failed int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	last := store.BreakerState("")
	for _, c := range o.changes {
		if c.partition != p {
			continue
		}
		if !c.at.Before(t) {
			switch {
			case c.state == store.BreakerHalfOpen:
				probes++
			case c.state == store.BreakerOpen && last == store.BreakerHalfOpen:
				failed++
			}
		}
		last = c.state
	}
	return probes, failed
}

// faultRecoverBound is how long after a fault ends every breaker must have
// closed, beyond what the whole process stalled meanwhile. A breaker lets a
// probe through a cooldown after it opened, and a probe that the machine held
// past OpTimeout opens it for another cooldown. On a quiet machine every
// breaker closed within 400 ms of the end of a fault; with twenty CPU
// burners beside the test, where even calls to a healthy server missed the
// 100 ms OpTimeout, within about 2 s. A breaker that never closes fails the
// test.
const faultRecoverBound = 10 * time.Second

// faultRecoverMax bounds the wait for the breakers to close whatever the
// process stalled.
const faultRecoverMax = 30 * time.Second

// faultRecovery describes one partition breaker of one store after the
// fault ended at healed.
type faultRecovery struct {
	store     int
	status    store.BreakerStatus
	closed    bool          // closed after healed
	after     time.Duration // when closed: how long after healed
	recovered bool          // closed after healed, or closed now
}

// faultRecoveries returns the state of every partition breaker of every
// store after the fault that ended at healed. A breaker has recovered when
// it closed after healed, or is closed (it never opened, or closed before);
// one that closed and opened again later, under a machine too loaded to
// answer within OpTimeout, has recovered.
func faultRecoveries(stores []*store.Store, observers []*faultObserver, healed time.Time) []faultRecovery {
	var out []faultRecovery
	for i, s := range stores {
		st, _ := s.Stats(context.Background()) // holds the breakers even when it fails
		for _, b := range st.Breakers {
			after, closed := observers[i].closedAfter(b.Partition, healed)
			out = append(out, faultRecovery{store: i, status: b, closed: closed, after: after,
				recovered: closed || b.State == store.BreakerClosed})
		}
	}
	return out
}

// AwaitRecovered lets the load run until every breaker of its stores has
// recovered from the fault that ended at healed (see faultRecoveries), for
// at most its recoverBound (faultRecoverBound) beyond what the process
// stalled meanwhile, and never over faultRecoverMax. A breaker closes only
// when a call probes it, so it cannot be judged once the load has stopped;
// and on a loaded machine a probe may miss OpTimeout and open it again for
// another cooldown, so a fixed phase may end before any probe succeeded.
// faultAssertRecovered judges the outcome.
func (l *faultLoad) AwaitRecovered(observers []*faultObserver, healed time.Time) {
	for {
		waiting := 0
		for _, r := range faultRecoveries(l.stores, observers, healed) {
			if !r.recovered {
				waiting++
			}
		}
		now := time.Now()
		stall := l.lag.Stall(healed, now)
		if waiting == 0 {
			return
		}
		if now.Sub(healed)-stall > l.recoverBound || now.Sub(healed) > faultRecoverMax {
			l.t.Logf("%d breakers not closed %v after the fault ended (process stalled %v meanwhile)",
				waiting, now.Sub(healed).Round(time.Millisecond), stall.Round(time.Millisecond))
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// faultAssertRecovered checks that every partition breaker of every store
// has recovered from the fault that ended at healed (see faultRecoveries);
// the load should have run on until they did (AwaitRecovered).
func faultAssertRecovered(t testing.TB, stores []*store.Store, observers []*faultObserver, healed time.Time) {
	t.Helper()
	for _, r := range faultRecoveries(stores, observers, healed) {
		b := r.status
		switch {
		case r.closed:
			t.Logf("store %d partition %d: breaker closed %v after the fault ended; now %s, opened %d times in all",
				r.store, b.Partition, r.after.Round(time.Millisecond), b.State, b.Opens)
		case r.recovered:
		default:
			probes, failed := observers[r.store].probesSince(b.Partition, healed)
			t.Errorf("store %d partition %d: breaker %s since %v and never closed in the %v after the fault ended "+
				"(%d probes, %d failed)", r.store, b.Partition, b.State, b.Since.Format("15:04:05.000"),
				time.Since(healed).Round(time.Millisecond), probes, failed)
		}
	}
}

// faultItem is one conversation item as the client sends it, with the
// identity the oracle compares: the digest of its canonical form, so that
// an item resent in another encoding is the same item.
type faultItem struct {
	raw json.RawMessage
	id  string
}

// faultParser computes the digests of faultItem.
var faultParser, _ = fingerprint.New(fingerprint.V4(), fingerprint.Key{})

func newFaultItem(raw string) faultItem {
	r, err := faultParser.Parse([]byte(`{"input":[` + raw + `]}`))
	if err != nil || r.Len() != 1 {
		panic(fmt.Sprintf("item %s: %v", raw, err))
	}
	return faultItem{raw: json.RawMessage(raw), id: strconv.FormatUint(r.Prefix(1), 16)}
}

// faultIDs returns the identities of items.
func faultIDs(items []faultItem) []string {
	out := make([]string, len(items))
	for i, it := range items {
		out[i] = it.id
	}
	return out
}

// faultDecide is the oracle's decision for input under model when the
// owner's state holds the candidate id.
func faultDecide(id string, c faultCandidate, model string, input []faultItem) oracle.Decision {
	return oracle.Reserve(
		oracle.Prior[string]{Live: true, Continuation: &oracle.Continuation[string]{ResponseID: id, Prompt: c.model, Transcript: faultIDs(c.items)}},
		oracle.Request[string]{Prompt: model, Items: faultIDs(input)})
}

// faultCandidate is a response the owner's state may hold as its
// continuation: definitely (Record said published) or possibly (Record
// failed, so its script may have run).
type faultCandidate struct {
	items    []faultItem // input and output of the turn
	model    string
	origin   store.Socket
	definite bool
}

// faultOwner is one conversation as the client sees it, and what the
// store may offer to continue it. Its turns run one at a time under mu.
type faultOwner struct {
	mu    sync.Mutex
	id    identity.Owner
	name  string
	group string
	model string
	items []faultItem
	cands map[string]faultCandidate
	n     int
}

// faultTally counts the turns of one phase and group.
type faultTally struct {
	Turns, Continued, Ambiguous, FailOpen, BreakerOpen, Missed int64
	Records, Published, RecordErrs                             int64
	MaxReserve, MaxRecord                                      time.Duration
	Slow                                                       int64         // over the load's bound, not explained by a stall
	FirstContinued                                             time.Duration // since the phase began; -1: none
	Reasons                                                    map[store.Reason]int64
}

func (c faultTally) String() string {
	var rs []string
	for r, n := range c.Reasons {
		name := string(r)
		if r == store.ReasonNone {
			name = "continued"
		}
		rs = append(rs, fmt.Sprintf("%s=%d", name, n))
	}
	sort.Strings(rs)
	first := "never"
	if c.FirstContinued >= 0 {
		first = c.FirstContinued.Round(time.Millisecond).String()
	}
	return fmt.Sprintf("turns=%d continued=%d (from possibly-published %d) fail-open=%d (breaker open %d) missed=%d "+
		"records=%d published=%d record-errors=%d max-reserve=%v max-record=%v unexplained-over-bound=%d first-continued=%s reasons[%s]",
		c.Turns, c.Continued, c.Ambiguous, c.FailOpen, c.BreakerOpen, c.Missed, c.Records, c.Published, c.RecordErrs,
		c.MaxReserve.Round(time.Millisecond), c.MaxRecord.Round(time.Millisecond), c.Slow, first, strings.Join(rs, " "))
}

// faultLoad is a gateway's traffic over several stores with an oracle:
// owners take turns (Reserve, check, Record) from several workers, and every
// continuation offered is checked against what was published.
type faultLoad struct {
	t      testing.TB
	stores []*store.Store
	owners []*faultOwner
	seed   uint64

	lag          *faultLag
	bound        time.Duration // faultBound of the stores' OpTimeout
	recoverBound time.Duration // AwaitRecovered's bound: faultRecoverBound

	mu         sync.Mutex
	phases     []string
	phaseStart []time.Time
	tallies    map[[2]string]*faultTally
	violations []string
	nViolated  int
	slow       []string

	cancel, stopLag context.CancelFunc
	wg              sync.WaitGroup
}

// newFaultLoad makes n owners (main threads and sub-agents); group names
// each owner's group for the tallies.
func newFaultLoad(t testing.TB, stores []*store.Store, n int, group func(identity.Owner) string) *faultLoad {
	l := &faultLoad{t: t, stores: stores, seed: rand.Uint64(), tallies: map[[2]string]*faultTally{},
		recoverBound: faultRecoverBound}
	for _, s := range stores {
		l.bound = max(l.bound, faultBound(s.Options().OpTimeout))
	}
	for i := range n {
		var id identity.Owner
		var err error
		if i%4 == 3 {
			id, err = identity.Agent(fmt.Sprintf("s%02d", i-1), "helper")
		} else {
			id, err = identity.Main(fmt.Sprintf("s%02d", i))
		}
		if err != nil {
			t.Fatal(err)
		}
		o := &faultOwner{id: id, name: fmt.Sprintf("o%02d", i), model: "m"}
		if group != nil {
			o.group = group(id)
		}
		l.owners = append(l.owners, o)
	}
	return l
}

// Start runs the workers until Stop.
func (l *faultLoad) Start(workers int) {
	ctx, cancel := context.WithCancel(context.Background())
	l.cancel = cancel
	l.t.Logf("load seed %d", l.seed)
	lagCtx, stopLag := context.WithCancel(context.Background())
	l.lag, l.stopLag = startFaultLag(lagCtx), stopLag
	for w := range workers {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			rng := rand.New(rand.NewPCG(l.seed, uint64(w)))
			for ctx.Err() == nil {
				o := l.owners[rng.IntN(len(l.owners))]
				if !o.mu.TryLock() {
					runtime.Gosched()
					continue
				}
				l.turn(rng, o)
				o.mu.Unlock()
				// Some think time, so that the machine is not saturated.
				time.Sleep(time.Duration(1000+rng.IntN(3000)) * time.Microsecond)
			}
		}()
	}
}

// Stop ends the workers and waits for their last turns, then stops the lag
// monitor, which watches until the last turn has ended.
func (l *faultLoad) Stop() {
	l.cancel()
	l.wg.Wait()
	l.stopLag()
}

// Phase starts a new phase. A turn counts in the phase it began and ended
// in; one that spans phases counts under "first>last".
func (l *faultLoad) Phase(name string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.phases = append(l.phases, name)
	l.phaseStart = append(l.phaseStart, time.Now())
}

// faultAwaitMax bounds how much longer than asked Await lets a phase run,
// beyond what the process stalled meanwhile; faultAwaitCap bounds it
// whatever the stalls.
const (
	faultAwaitMax = 10 * time.Second
	faultAwaitCap = 30 * time.Second
)

// Await lets the current phase run for d, then on until some turn of each
// of groups (all owners when none are named) has continued in it, for at
// most faultAwaitMax more beyond what the process stalled meanwhile (and
// faultAwaitCap in all): on a loaded machine a phase may need longer than d
// to show what it must. The assertions that follow say whether it did.
func (l *faultLoad) Await(d time.Duration, groups ...string) {
	time.Sleep(d)
	l.mu.Lock()
	phase := l.phases[len(l.phases)-1]
	l.mu.Unlock()
	if len(groups) == 0 {
		groups = []string{""}
	}
	for start := time.Now(); ; time.Sleep(50 * time.Millisecond) {
		if !slices.ContainsFunc(groups, func(g string) bool { return l.Tally(phase, g).Continued == 0 }) {
			return
		}
		now := time.Now()
		if stall := l.lag.Stall(start, now); now.Sub(start)-stall > faultAwaitMax || now.Sub(start) > faultAwaitCap {
			l.t.Logf("phase %s: owners of %q have not continued %v after it began (process stalled %v meanwhile)",
				phase, groups, (d + now.Sub(start)).Round(time.Millisecond), stall.Round(time.Millisecond))
			return
		}
	}
}

// current returns the index of the current phase.
func (l *faultLoad) current() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.phases) - 1
}

// Tally returns a phase's counts for a group, "" for all groups.
func (l *faultLoad) Tally(phase, group string) faultTally {
	l.mu.Lock()
	defer l.mu.Unlock()
	sum := faultTally{FirstContinued: -1, Reasons: map[store.Reason]int64{}}
	for k, c := range l.tallies {
		if k[0] != phase || (group != "" && k[1] != group) {
			continue
		}
		sum.Turns += c.Turns
		sum.Continued += c.Continued
		sum.Ambiguous += c.Ambiguous
		sum.FailOpen += c.FailOpen
		sum.BreakerOpen += c.BreakerOpen
		sum.Missed += c.Missed
		sum.Records += c.Records
		sum.Published += c.Published
		sum.RecordErrs += c.RecordErrs
		sum.Slow += c.Slow
		sum.MaxReserve = max(sum.MaxReserve, c.MaxReserve)
		sum.MaxRecord = max(sum.MaxRecord, c.MaxRecord)
		if c.FirstContinued >= 0 && (sum.FirstContinued < 0 || c.FirstContinued < sum.FirstContinued) {
			sum.FirstContinued = c.FirstContinued
		}
		for r, n := range c.Reasons {
			sum.Reasons[r] += n
		}
	}
	return sum
}

// Report logs every phase's counts, per group when there are groups.
func (l *faultLoad) Report() {
	l.t.Helper()
	groups := map[string]bool{}
	for _, o := range l.owners {
		groups[o.group] = true
	}
	l.mu.Lock()
	var names []string
	seen := map[string]bool{}
	for _, p := range l.phases {
		names = append(names, p)
		seen[p] = true
	}
	var spans []string
	for k := range l.tallies {
		if !seen[k[0]] {
			seen[k[0]] = true
			spans = append(spans, k[0])
		}
	}
	sort.Strings(spans)
	names = append(names, spans...)
	slow := l.slow
	l.mu.Unlock()
	for _, p := range names {
		if len(groups) > 1 {
			for g := range groups {
				l.t.Logf("%-10s %-6s %v", p, g, l.Tally(p, g))
			}
		} else {
			l.t.Logf("%-10s %v", p, l.Tally(p, ""))
		}
	}
	for _, s := range slow {
		l.t.Logf("slow call: %s", s)
	}
	l.t.Logf("longest stall of the process seen by the lag monitor: %v", l.lag.Max().Round(time.Millisecond))
}

// AssertSound fails the test on any violation of the oracle and on any
// Reserve slower than the load's bound beyond what the whole process stalled
// meanwhile.
func (l *faultLoad) AssertSound() {
	l.t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.nViolated > 0 {
		l.t.Errorf("%d violations (seed %d), first ones:\n%s", l.nViolated, l.seed, strings.Join(l.violations, "\n"))
	}
	for k, c := range l.tallies {
		if c.Slow > 0 {
			l.t.Errorf("phase %s group %q: %d Reserve calls over %v that no stall of the process explains; the slowest took %v",
				k[0], k[1], c.Slow, l.bound, c.MaxReserve)
		}
	}
}

func (l *faultLoad) violate(o *faultOwner, format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.nViolated++
	if len(l.violations) < 10 {
		l.violations = append(l.violations, fmt.Sprintf("%s (%v) turn %d, phase %s: ", o.name, o.id, o.n,
			l.phases[len(l.phases)-1])+fmt.Sprintf(format, args...))
	}
}

// count updates the tally of o's group for a turn that began in phase.
func (l *faultLoad) count(o *faultOwner, phase int, fn func(c *faultTally, since time.Duration)) {
	l.mu.Lock()
	defer l.mu.Unlock()
	name := l.phases[phase]
	if cur := len(l.phases) - 1; cur != phase {
		name += ">" + l.phases[cur]
	}
	k := [2]string{name, o.group}
	c := l.tallies[k]
	if c == nil {
		c = &faultTally{FirstContinued: -1, Reasons: map[store.Reason]int64{}}
		l.tallies[k] = c
	}
	fn(c, time.Since(l.phaseStart[phase]))
}

// turn runs one turn of o: the client edits its conversation now and then,
// adds one item, reserves on a random store, checks the answer and records
// the upstream's response.
func (l *faultLoad) turn(rng *rand.Rand, o *faultOwner) {
	phase := l.current()
	s := l.stores[rng.IntN(len(l.stores))]
	o.n++
	switch r := rng.IntN(40); {
	case r == 0: // a new conversation
		o.items = nil
	case r == 1 && len(o.items) > 0: // the last item dropped
		o.items = o.items[:len(o.items)-1]
	case r == 2 && len(o.items) > 0: // the first item edited
		o.items = append([]faultItem{newFaultItem(fmt.Sprintf(`{"role":"user","content":"%s edited at %d"}`, o.name, o.n))},
			o.items[1:]...)
	case r == 3: // another model
		o.model = map[string]string{"m": "m2", "m2": "m"}[o.model]
	}
	input := append(o.items[:len(o.items):len(o.items)],
		newFaultItem(fmt.Sprintf(`{"role":"user","content":"%s says %d"}`, o.name, o.n)))
	var body bytes.Buffer
	fmt.Fprintf(&body, `{"model":%q,"input":[`, o.model)
	for i, it := range input {
		if i > 0 {
			body.WriteByte(',')
		}
		body.Write(it.raw)
	}
	body.WriteString(`]}`)
	req, err := s.ParseRequest(body.Bytes())
	if err != nil {
		l.violate(o, "ParseRequest: %v", err)
		return
	}

	start := time.Now()
	res := s.Reserve(context.Background(), o.id, req)
	end := time.Now()
	l.check(o, phase, s.Options().Replica, input, res, start, end)

	// The upstream answers; the client appends the answer in its own
	// encoding (keys reordered), which is the same item canonically.
	id := fmt.Sprintf("resp_%s_%d", o.name, o.n)
	out := fmt.Sprintf(`{"type":"message","role":"assistant","content":"answer %d"}`, o.n)
	resent := newFaultItem(fmt.Sprintf(`{"content":"answer %d","role":"assistant","type":"message"}`, o.n))
	transcript := append(input[:len(input):len(input)], newFaultItem(out))
	defer func() { o.items = append(input, resent) }()
	if res.Turn == 0 {
		return
	}
	start = time.Now()
	outcome, err := s.Record(context.Background(), res,
		store.Result{ResponseID: id, Socket: store.Socket{ID: 1}, Output: []json.RawMessage{json.RawMessage(out)}})
	took := time.Since(start)
	cand := faultCandidate{items: transcript, model: o.model, origin: store.Socket{Replica: s.Options().Replica, ID: 1}}
	switch {
	case err != nil:
		if !errors.Is(err, store.ErrUnavailable) {
			l.violate(o, "Record error not wrapping ErrUnavailable: %v", err)
		}
		// The script may have run with its reply lost.
		o.cands = map[string]faultCandidate{id: cand}
	case outcome == store.OutcomePublished:
		cand.definite = true
		o.cands = map[string]faultCandidate{id: cand}
	case outcome == store.OutcomeStale || outcome == store.OutcomeGone:
	default:
		l.violate(o, "Record: unexpected outcome %q", outcome)
	}
	l.count(o, phase, func(c *faultTally, _ time.Duration) {
		c.Records++
		c.MaxRecord = max(c.MaxRecord, took)
		if err != nil {
			c.RecordErrs++
		} else if outcome == store.OutcomePublished {
			c.Published++
		}
	})
}

// check judges res, reserved by the store of replica: a continuation must
// name a response that was (or may have been) published for this owner,
// with the origin it was recorded at, the oracle must continue the input
// from it, and the delta must be exactly the oracle's, byte for byte.
func (l *faultLoad) check(o *faultOwner, phase int, replica string, input []faultItem, res *store.Reservation, start, end time.Time) {
	var continued, ambiguous, failOpen, breakerOpen, missed bool
	took := end.Sub(start)
	slow := false
	if took > l.bound {
		stall := l.lag.Stall(start, end)
		slow = took-stall > l.bound
		l.mu.Lock()
		if len(l.slow) < 10 {
			l.slow = append(l.slow, fmt.Sprintf("Reserve of %s took %v (process stalled %v meanwhile) in phase %s, %v after it began: reason %q, err %v",
				o.name, took.Round(time.Millisecond), stall.Round(time.Millisecond), l.phases[phase],
				start.Sub(l.phaseStart[phase]).Round(time.Millisecond), res.Reason, res.Err))
		}
		l.mu.Unlock()
	}
	switch {
	case res.Reason == store.ReasonStoreUnavailable:
		failOpen = true
		breakerOpen = errors.Is(res.Err, store.ErrBreakerOpen)
		if !errors.Is(res.Err, store.ErrUnavailable) || res.Turn != 0 || res.PreviousResponseID != "" ||
			res.UpstreamItems != len(input) {
			l.violate(o, "fail-open reservation malformed: %s", faultDescribe(res))
		}
		// Whether the continuation was consumed is unknown: keep the
		// candidates.
	case res.Err != nil || res.Turn == 0:
		l.violate(o, "reservation with reason %q has err %v and turn %d", res.Reason, res.Err, res.Turn)
	case res.Continues():
		continued = true
		c, ok := o.cands[res.PreviousResponseID]
		ambiguous = ok && !c.definite
		var want oracle.Decision
		if ok {
			want = faultDecide(res.PreviousResponseID, c, o.model, input)
		}
		switch {
		case !ok:
			l.violate(o, "continues from %q, which was never published for this owner (candidates %v)",
				res.PreviousResponseID, faultCandNames(o.cands))
		case !want.Continues():
			l.violate(o, "continues from %q (a %d-item transcript under model %q) for a %d-item input under model %q; the oracle says %s",
				res.PreviousResponseID, len(c.items), c.model, len(input), o.model, want.Reason)
		case !faultSameRaw(res.Delta, input[want.Prefix:]) || res.UpstreamItems != want.UpstreamItems:
			l.violate(o, "continues from %q with %d delta items (count %d), want the %d items after the first %d",
				res.PreviousResponseID, len(res.Delta), res.UpstreamItems, want.UpstreamItems, want.Prefix)
		case res.Origin != faultOrigin(c.origin, replica):
			l.violate(o, "continues from %q with origin %+v on %s, recorded at %+v", res.PreviousResponseID, res.Origin,
				replica, c.origin)
		}
		o.cands = nil
	default:
		if res.Reason == store.ReasonNone {
			l.violate(o, "reservation neither continues nor says why: %s", faultDescribe(res))
		}
		for id, c := range o.cands {
			if c.definite && faultDecide(id, c, o.model, input).Continues() {
				missed = true // safe, but a continuation was lost
			}
		}
		o.cands = nil
	}
	l.count(o, phase, func(c *faultTally, since time.Duration) {
		c.Turns++
		c.MaxReserve = max(c.MaxReserve, took)
		if slow {
			c.Slow++
		}
		c.Reasons[res.Reason]++
		switch {
		case continued:
			c.Continued++
			if ambiguous {
				c.Ambiguous++
			}
			if c.FirstContinued < 0 {
				c.FirstContinued = since
			}
		case failOpen:
			c.FailOpen++
			if breakerOpen {
				c.BreakerOpen++
			}
		case missed:
			c.Missed++
		}
	})
}

// faultOrigin is the origin that a reservation by the store of replica
// gives for a response recorded at origin: the store's own replica by its
// name, any other by its reference (store.Socket).
func faultOrigin(origin store.Socket, replica string) store.Socket {
	if !origin.Any && origin.Replica != replica {
		origin.Replica = names.ReplicaRef(names.ReplicaDigest(origin.Replica))
	}
	return origin
}

// faultDescribe renders res without its request and items.
func faultDescribe(res *store.Reservation) string {
	return fmt.Sprintf("reason %q, turn %d, previous %q, %d delta items (count %d), origin %+v, err %v",
		res.Reason, res.Turn, res.PreviousResponseID, len(res.Delta), res.UpstreamItems, res.Origin, res.Err)
}

// faultSameRaw reports whether delta holds exactly the raw items.
func faultSameRaw(delta []json.RawMessage, items []faultItem) bool {
	if len(delta) != len(items) {
		return false
	}
	for i := range delta {
		if !bytes.Equal(delta[i], items[i].raw) {
			return false
		}
	}
	return true
}

func faultCandNames(m map[string]faultCandidate) []string {
	var out []string
	for id, c := range m {
		out = append(out, fmt.Sprintf("%s(definite=%v)", id, c.definite))
	}
	sort.Strings(out)
	return out
}

// faultLag watches how late a sleeping goroutine of this process wakes up:
// on a loaded machine the whole process may not run for a while, which
// delays every call whatever the store does.
type faultLag struct {
	mu      sync.Mutex
	woke    *sync.Cond // broadcast each time the monitor wakes or stops
	awake   time.Time  // the monitor's last wake-up
	stopped bool
	stalls  []faultStall
	longest time.Duration
}

type faultStall struct {
	from, to time.Time
}

func startFaultLag(ctx context.Context) *faultLag {
	m := &faultLag{}
	m.woke = sync.NewCond(&m.mu)
	const tick = 2 * time.Millisecond
	go func() {
		defer func() {
			m.mu.Lock()
			m.stopped = true
			m.mu.Unlock()
			m.woke.Broadcast()
		}()
		for ctx.Err() == nil {
			t0 := time.Now()
			time.Sleep(tick)
			t1 := time.Now()
			m.mu.Lock()
			if late := t1.Sub(t0) - tick; late > 5*time.Millisecond {
				m.stalls = append(m.stalls, faultStall{from: t0.Add(tick), to: t1})
				m.longest = max(m.longest, late)
			}
			m.awake = t1
			m.mu.Unlock()
			m.woke.Broadcast()
		}
	}()
	return m
}

// Stall returns how long, within [from, to], the monitor was kept from
// running. It first waits for the monitor to wake after to: a call that
// ends as a stall ends may run before the monitor does and records it.
func (m *faultLag) Stall(from, to time.Time) time.Duration {
	m.mu.Lock()
	defer m.mu.Unlock()
	for !m.stopped && !m.awake.After(to) {
		m.woke.Wait()
	}
	var sum time.Duration
	for _, s := range m.stalls {
		a, b := s.from, s.to
		if a.Before(from) {
			a = from
		}
		if b.After(to) {
			b = to
		}
		if b.After(a) {
			sum += b.Sub(a)
		}
	}
	return sum
}

// Max returns the longest stall seen.
func (m *faultLag) Max() time.Duration {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.longest
}
