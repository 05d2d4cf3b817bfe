package storetest

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/contstore/contstore/fingerprint"
	"github.com/contstore/contstore/identity"
	"github.com/contstore/contstore/store"
)

// Turn is one benchmark turn's pair of requests: Recorded is what an owner
// recorded, Next extends it by DeltaItems items, so reserving Next after a
// turn of Recorded published continues with a delta of DeltaItems.
type Turn struct {
	Recorded, Next *fingerprint.Request
}

// DeltaItems is the delta of every benchmark turn.
const DeltaItems = 8

// NewTurn builds a benchmark turn whose recorded transcript has base items,
// its requests parsed by s, as a gateway parses them for s.
func NewTurn(tb testing.TB, s *store.Store, base int) Turn {
	tb.Helper()
	c := conversation(tb, s, base, 2)
	return Turn{Recorded: c[0], Next: c[1]}
}

// conversation returns the requests of turns turns, the first with base
// items, each DeltaItems items longer than the one before, parsed by s.
func conversation(tb testing.TB, s *store.Store, base, turns int) []*fingerprint.Request {
	tb.Helper()
	items := make([]string, base+(turns-1)*DeltaItems)
	for i := range items {
		items[i] = message(fmt.Sprintf("message %d of a growing conversation, long enough to look like one", i))
	}
	out := make([]*fingerprint.Request, turns)
	for k := range out {
		r, err := s.ParseRequest([]byte(body("", items[:base+k*DeltaItems]...)))
		if err != nil {
			tb.Fatal(err)
		}
		out[k] = r
	}
	return out
}

// Owners returns n distinct main owners.
func Owners(tb testing.TB, n int) []identity.Owner {
	tb.Helper()
	out := make([]identity.Owner, n)
	for i := range out {
		out[i] = mainOwner(tb, fmt.Sprintf("bench-session-%d", i))
	}
	return out
}

// BenchReserveRecord measures one turn (Reserve then Record) per iteration,
// spread round-robin over owners, in parallel when parallel is true. Each
// owner plays a conversation of 16 turns over and over: every turn
// continues the one before with a delta of DeltaItems items, except the
// first of each round, which starts the conversation over (not append-only:
// the same store work). The benchmark fails on any other answer.
func BenchReserveRecord(b *testing.B, s *store.Store, owners []identity.Owner, parallel bool) {
	ctx := context.Background()
	conv := conversation(b, s, 32, 16)
	last := make([]atomic.Int32, len(owners)) // the request each owner recorded last
	step := func(i int) {
		k := (int(last[i].Load()) + 1) % len(conv)
		res := s.Reserve(ctx, owners[i], conv[k])
		if res.Err != nil {
			b.Fatal(res.Err)
		}
		if k > 0 && (!res.Continues() || res.UpstreamItems != DeltaItems) {
			b.Fatalf("owner %d, turn %d: reason %q, delta %d; want a continuation with %d items", i, k, res.Reason, res.UpstreamItems, DeltaItems)
		}
		out, err := s.Record(ctx, res, store.Result{ResponseID: "resp_bench_0123456789abcdef", Socket: store.Socket{ID: 1}})
		if err != nil || out != store.OutcomePublished {
			b.Fatalf("record: %v %v", out, err)
		}
		last[i].Store(int32(k))
	}
	for i := range owners {
		last[i].Store(int32(len(conv) - 1))
		step(i) // warm: every owner has a continuation
	}
	var next atomic.Uint64
	b.ReportAllocs()
	b.ResetTimer()
	if !parallel {
		for i := 0; b.Loop(); i++ {
			step(i % len(owners))
		}
		return
	}
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			step(int(next.Add(1)) % len(owners))
		}
	})
}
