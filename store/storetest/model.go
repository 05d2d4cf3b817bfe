package storetest

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/contstore/contstore/fingerprint"
	"github.com/contstore/contstore/identity"
	"github.com/contstore/contstore/store"
)

// ModelConfig describes a backend checked against the in-process model.
type ModelConfig struct {
	// Options for both stores; Namespace and Now are set by CheckModel.
	Options store.Options
	// Open returns the store under test (t is the enclosing test, for
	// cleanups).
	Open func(t *testing.T, opts store.Options) *store.Store
	// Advance moves the backend's clock to now, d after the previous time.
	// When nil the backend follows the wall clock and CheckModel sleeps
	// instead, so keep TTL short.
	Advance func(now time.Time, d time.Duration)
	// Steps lists the clock steps an action may take; they must never add
	// up to exactly the TTL. Default: 1ms, 3s, 6s, 20s.
	Steps []time.Duration
}

// CheckModel runs random sequences of reserve, record, abort, clear,
// is-current, inspect, stats and time steps against the store under test
// and the in-process store (the model), requiring the same observable
// outcome from each, and then requires that after Sweep both agree, their
// audits are clean and the limits hold.
func CheckModel(t *testing.T, cfg ModelConfig) {
	if cfg.Steps == nil {
		cfg.Steps = []time.Duration{time.Millisecond, 3 * time.Second, 6 * time.Second, 20 * time.Second}
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
		clock := time.UnixMilli(1_800_000_000_000)
		if cfg.Advance != nil {
			opts.Now = func() time.Time { return clock }
			cfg.Advance(clock, 0)
		} else {
			opts.Now = time.Now
		}
		model, err := store.NewMemory(opts)
		if err != nil {
			rt.Fatal(err)
		}
		sut := cfg.Open(t, opts)
		type pair struct {
			req        *fingerprint.Request
			model, sut *store.Reservation
		}
		var turns []pair
		responses := 0

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
			return fmt.Sprintf("exists=%v continuation=%v response=%q origin=%v items=%d bytes=%d",
				st.Exists, st.HasContinuation, st.ResponseID, st.Origin, st.Items, st.TranscriptBytes)
		}
		stats := func(s *store.Store) store.Stats {
			st, err := s.Stats(ctx)
			if err != nil {
				rt.Fatal(err)
			}
			return st
		}
		pick := func(rt *rapid.T) pair {
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

		rt.Repeat(map[string]func(*rapid.T){
			"reserve": func(rt *rapid.T) {
				o := rapid.SampledFrom(owners).Draw(rt, "owner")
				r := rapid.SampledFrom(requests).Draw(rt, "request")
				m, s := model.Reserve(ctx, o, r), sut.Reserve(ctx, o, r)
				if s.Err != nil {
					rt.Fatal(s.Err)
				}
				eq("reserve", describe(m), describe(s))
				turns = append(turns, pair{r, m, s})
			},
			"record": func(rt *rapid.T) {
				if len(turns) == 0 {
					rt.Skip("no turn yet")
				}
				p := pick(rt)
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
			},
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
				d := rapid.SampledFrom(cfg.Steps).Draw(rt, "step")
				if cfg.Advance == nil {
					time.Sleep(d)
					return
				}
				clock = clock.Add(d)
				cfg.Advance(clock, d)
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
				rt.Fatalf("audit: %q", a.Problems)
			}
			if st := stats(s); a.Owners != st.Total.Owners {
				rt.Fatalf("after sweep the LRU holds %d owners, %d are live", st.Total.Owners, a.Owners)
			}
		}
	})
}

// describe renders what a reservation decides, without its turn token
// (backends draw tokens from different clocks).
func describe(r *store.Reservation) string {
	return fmt.Sprintf("reason=%q prev=%q delta=%d origin=%v turn=%v", r.Reason, r.PreviousResponseID, r.DeltaCount, r.Origin, r.Turn != 0)
}

// modelRequests returns requests that extend one another, edit history,
// repeat, and change the prompt, so every reason comes up.
func modelRequests(t testing.TB) []*fingerprint.Request {
	a, b, x := message("a"), message("b"), assistant("x")
	inputs := [][]string{{}, {a}, {a, x}, {a, x, b}, {a, x, b, x}, {a, x, b, x, a}, {b}, {a, b}}
	var out []*fingerprint.Request
	for _, extra := range []string{"", `"service_tier":"flex"`} {
		for _, in := range inputs {
			out = append(out, parse(t, body(extra, in...)))
		}
	}
	return out
}
