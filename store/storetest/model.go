package storetest

import (
	"encoding/json"
	"fmt"
	"slices"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/contstore/contstore/fingerprint"
	"github.com/contstore/contstore/identity"
	"github.com/contstore/contstore/internal/oracle"
	"github.com/contstore/contstore/internal/serverclock"
	"github.com/contstore/contstore/internal/storehooks"
	"github.com/contstore/contstore/store"
)

// ModelConfig describes a backend checked against the in-process model.
type ModelConfig struct {
	// Options for both stores; Namespace is set by CheckModel, and
	// OpTimeout when it is zero (see Run).
	Options store.Options
	// Open returns the store under test (t is the enclosing test, for
	// cleanups).
	Open func(t *testing.T, opts store.Options) *store.Store
	// Clock, when not nil, gives the clock the store under test keeps its
	// states on, which the check moves, and the model keeps its states on
	// the same clock: then the states' touches must agree too. When nil,
	// both keep real time and the check takes no time steps.
	Clock Clocked
	// Steps lists the clock steps an action may take; they must never add
	// up to exactly the TTL. Default: 1ms, 570ms, 3s, 6s, 20s, for a TTL of
	// 10s: 570ms is 14 or 15 refresh ticks (PROTOCOL 8.2) depending on
	// where a touch falls in its tick.
	Steps []time.Duration
}

// CheckModel runs random sequences of reserve, record, abort, clear,
// is-current, inspect, stats and time steps against the store under test
// and the in-process store (the model), requiring the same observable
// outcome from each, and every reservation to be the decision of package
// oracle for the state the model held; then it requires that after Sweep
// both agree, their audits are clean and the limits hold.
func CheckModel(t *testing.T, cfg ModelConfig) {
	if cfg.Steps == nil {
		cfg.Steps = []time.Duration{time.Millisecond, 570 * time.Millisecond, 3 * time.Second, 6 * time.Second, 20 * time.Second}
	}
	owners := make([]identity.Owner, 8)
	for i := range owners {
		if i%3 == 2 {
			owners[i] = agentOwner(t, fmt.Sprintf("model-%d", i/3), fmt.Sprintf("agent-%d", i))
		} else {
			owners[i] = mainOwner(t, fmt.Sprintf("model-%d", i))
		}
	}
	requests := modelRequests(t)
	rapid.Check(t, func(rt *rapid.T) {
		opts := cfg.Options
		opts.Namespace = namespace()
		patient(&opts)
		var clock Clock
		modelOpts := opts
		if cfg.Clock != nil {
			opts, clock = cfg.Clock(t, opts)
			modelOpts = storehooks.WithClock(modelOpts, clock.Now)
		}
		model, err := store.NewMemory(modelOpts)
		if err != nil {
			rt.Fatal(err)
		}
		if clock != nil {
			clock.Set(cycleStart(clock.Now(), model.Options().TTL))
		}
		sut := cfg.Open(t, opts)
		type pair struct {
			req        modelRequest
			model, sut *store.Reservation
		}
		var turns []pair
		responses := 0
		// published holds what each response the model published
		// continues, as the oracle reads it.
		published := map[string]oracle.Continuation[string]{}

		eq := func(what string, want, got any) {
			rt.Helper()
			if fmt.Sprint(want) != fmt.Sprint(got) {
				rt.Fatalf("%s: model %v, store %v", what, want, got)
			}
		}
		inspect := func(s *store.Store, o identity.Owner) string {
			st, err := s.Inspect(ctx, o)
			if err != nil {
				rt.Fatal(err)
			}
			out := fmt.Sprintf("exists=%v continuation=%v response=%q origin=%v items=%d bytes=%d",
				st.Exists, st.HasContinuation, st.ResponseID, st.Origin, st.Items, st.TranscriptBytes)
			if clock != nil {
				out += fmt.Sprintf(" touched=%v", st.UpdatedAt.UnixMilli())
			}
			return out
		}
		stats := func(s *store.Store) store.Stats {
			st, err := s.Stats(ctx)
			if err != nil {
				rt.Fatal(err)
			}
			return st
		}
		// prior is the model's state of owner o as the oracle reads it.
		prior := func(o identity.Owner) oracle.Prior[string] {
			st, err := model.Inspect(ctx, o)
			if err != nil {
				rt.Fatal(err)
			}
			p := oracle.Prior[string]{Live: st.Exists}
			if st.HasContinuation {
				c, ok := published[st.ResponseID]
				if !ok {
					rt.Fatalf("the model holds response %q for %v, which no record published", st.ResponseID, o)
				}
				p.Continuation = &c
			}
			return p
		}
		// pick draws a turn reserved earlier: the latest one half the
		// time, so that turns publish and the next reservations continue.
		pick := func(rt *rapid.T) pair {
			if rapid.Bool().Draw(rt, "latest turn") {
				return turns[len(turns)-1]
			}
			return turns[rapid.IntRange(0, len(turns)-1).Draw(rt, "turn")]
		}
		// onTurn runs op on both stores for a turn reserved earlier and
		// requires the same answer.
		onTurn := func(name string, op func(*store.Store, *store.Reservation) (bool, error)) func(*rapid.T) {
			return func(rt *rapid.T) {
				if len(turns) == 0 {
					rt.Skip("no turn yet")
				}
				p := pick(rt)
				m, err1 := op(model, p.model)
				s, err2 := op(sut, p.sut)
				if err1 != nil || err2 != nil {
					rt.Fatal(err1, err2)
				}
				eq(name, m, s)
			}
		}

		// reserve reserves a turn on both stores and requires the model's
		// answer to be the oracle's and the store's to be the model's.
		reserve := func(rt *rapid.T) pair {
			// Half the reservations go to two owners, so that an owner
			// often comes back to its published state.
			o := rapid.SampledFrom(owners).Draw(rt, "owner")
			if rapid.Bool().Draw(rt, "hot") {
				o = rapid.SampledFrom(owners[:2]).Draw(rt, "hot owner")
			}
			r := requests[rapid.IntRange(0, len(requests)-1).Draw(rt, "request")]
			before := prior(o)
			m, s := model.Reserve(ctx, o, r.req), sut.Reserve(ctx, o, r.req)
			if s.Err != nil {
				rt.Fatal(s.Err)
			}
			want := oracle.Reserve(before, r.oracle)
			if got := decided(m, r); got != describeDecision(want) {
				rt.Fatalf("reserve %v of %s: oracle %s, model %s", o, r, describeDecision(want), got)
			}
			eq("reserve", describe(m), describe(s))
			p := pair{r, m, s}
			turns = append(turns, p)
			return p
		}
		// record records a response (or a result that publishes nothing)
		// for turn p on both stores.
		record := func(rt *rapid.T, p pair) {
			responses++
			out := store.Result{ResponseID: fmt.Sprintf("resp_%d", responses), Socket: store.Socket{Replica: "r", ID: 1}}
			switch rapid.IntRange(0, 9).Draw(rt, "result") {
			case 0:
				out.ResponseID = ""
			case 1:
				out.Socket.ID = 0
			case 2, 3, 4:
				out.Output = []json.RawMessage{json.RawMessage(assistant("x"))}
			}
			mo, err1 := model.Record(ctx, p.model, out)
			so, err2 := sut.Record(ctx, p.sut, out)
			if err1 != nil || err2 != nil {
				rt.Fatal(err1, err2)
			}
			eq("record", mo, so)
			if mo == store.OutcomePublished {
				transcript := slices.Clone(p.req.oracle.Items)
				for _, it := range out.Output {
					transcript = append(transcript, string(it))
				}
				published[out.ResponseID] = oracle.Continuation[string]{
					ResponseID: out.ResponseID, Prompt: p.req.oracle.Prompt, Transcript: transcript}
			}
		}

		rt.Repeat(map[string]func(*rapid.T){
			"reserve": func(rt *rapid.T) { reserve(rt) },
			"record": func(rt *rapid.T) {
				if len(turns) == 0 {
					rt.Skip("no turn yet")
				}
				record(rt, pick(rt))
			},
			// A gateway's turn: reserve, then record at once.
			"turn": func(rt *rapid.T) { record(rt, reserve(rt)) },
			"abort": onTurn("abort", func(s *store.Store, r *store.Reservation) (bool, error) {
				return s.Abort(ctx, r)
			}),
			"is-current": onTurn("is-current", func(s *store.Store, r *store.Reservation) (bool, error) {
				return s.IsCurrent(ctx, r)
			}),
			"clear": func(rt *rapid.T) {
				o := rapid.SampledFrom(owners).Draw(rt, "owner")
				if err1, err2 := model.Clear(ctx, o), sut.Clear(ctx, o); err1 != nil || err2 != nil {
					rt.Fatal(err1, err2)
				}
			},
			"inspect": func(rt *rapid.T) {
				o := rapid.SampledFrom(owners).Draw(rt, "owner")
				eq("inspect "+o.String(), inspect(model, o), inspect(sut, o))
			},
			"time": func(rt *rapid.T) {
				if clock == nil {
					rt.Skip("real time")
				}
				clock.Add(rapid.SampledFrom(cfg.Steps).Draw(rt, "step"))
			},
			"": func(rt *rapid.T) {
				eq("stats", stats(model).Total, stats(sut).Total)
			},
		})

		ms, err1 := model.Sweep(ctx)
		ss, err2 := sut.Sweep(ctx)
		if err1 != nil || err2 != nil {
			rt.Fatal(err1, err2)
		}
		eq("sweep", ms, ss)
		ms2, ss2 := stats(model), stats(sut)
		eq("stats after sweep", ms2.Partitions, ss2.Partitions)
		for _, s := range []*store.Store{model, sut} {
			a, err := s.Audit(ctx)
			if err != nil {
				rt.Fatal(err)
			}
			if len(a.Problems) > 0 {
				rt.Fatalf("audit: %s", firstOf("problems", a.Problems, 5))
			}
			if st := stats(s); a.Owners != st.Total.Owners {
				rt.Fatalf("after sweep the LRU holds %d owners, %d are live", st.Total.Owners, a.Owners)
			}
		}
	})
}

// cycleStart returns the first instant from now on where the refresh ticks
// of a TTL (PROTOCOL 8.2: 256ths of it, counted modulo 256 from the
// scripts' epoch) start a cycle, so that every case of a check, and its
// replay, meets the ticks at the same places.
func cycleStart(now time.Time, ttl time.Duration) time.Time {
	cycle := 256 * max(ttl.Milliseconds()/256, 1)
	since := now.UnixMilli() - serverclock.EpochMillis
	return time.UnixMilli(serverclock.EpochMillis + (since+cycle-1)/cycle*cycle)
}

// describe renders what a reservation decides, without its turn token
// (backends draw tokens from different clocks).
func describe(r *store.Reservation) string {
	return fmt.Sprintf("reason=%q prev=%q delta=%d origin=%v turn=%v", r.Reason, r.PreviousResponseID, r.UpstreamItems, r.Origin, r.Turn != 0)
}

// decided renders what reservation r of request q decides, as
// describeDecision renders the oracle's, after checking that a
// continuation's delta holds the request's own items.
func decided(r *store.Reservation, q modelRequest) string {
	prefix := 0
	if r.Continues() {
		prefix = len(q.oracle.Items) - len(r.Delta)
		if prefix < 0 || !slices.Equal(rawStrings(r.Delta), q.oracle.Items[prefix:]) {
			return fmt.Sprintf("reason=%q prev=%q with a delta of %d items that are not the request's last ones",
				r.Reason, r.PreviousResponseID, len(r.Delta))
		}
	}
	return fmt.Sprintf("reason=%q prev=%q prefix=%d delta=%d turn=%v", r.Reason, r.PreviousResponseID, prefix, r.UpstreamItems, r.Turn != 0)
}

func describeDecision(d oracle.Decision) string {
	return fmt.Sprintf("reason=%q prev=%q prefix=%d delta=%d turn=true", d.Reason, d.ResponseID, d.Prefix, d.UpstreamItems)
}

func rawStrings(items []json.RawMessage) []string {
	out := make([]string, len(items))
	for i, it := range items {
		out[i] = string(it)
	}
	return out
}

// modelRequest is a request of the model's family, parsed and as the
// oracle reads it: the extra members as its prompt, its items' bytes.
type modelRequest struct {
	req    *fingerprint.Request
	oracle oracle.Request[string]
	name   string
}

func (q modelRequest) String() string { return q.name }

// modelRequests returns requests that extend one another, edit history,
// repeat, and change the prompt, so every reason comes up.
func modelRequests(t testing.TB) []modelRequest {
	a, b, x := message("a"), message("b"), assistant("x")
	names := map[string]string{a: "a", b: "b", x: "x"}
	inputs := [][]string{{}, {a}, {a, x}, {a, x, b}, {a, x, b, x}, {a, x, b, x, a}, {b}, {a, b}}
	var out []modelRequest
	for _, extra := range []string{"", `"service_tier":"flex"`} {
		for _, in := range inputs {
			name := "["
			for _, it := range in {
				name += names[it]
			}
			name += "]"
			if extra != "" {
				name += "+" + extra
			}
			out = append(out, modelRequest{req: parse(t, body(extra, in...)), oracle: oracle.Request[string]{Prompt: extra, Items: in}, name: name})
		}
	}
	return out
}
