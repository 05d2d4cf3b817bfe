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

// Turn is one benchmark turn's pair of requests: Recorded is what a turn
// records, Next extends it by DeltaItems items, so reserving Next after
// recording Recorded always continues with a delta of DeltaItems.
type Turn struct {
	Recorded, Next *fingerprint.Request
}

// DeltaItems is the delta of every benchmark turn.
const DeltaItems = 8

// NewTurn builds a benchmark turn whose recorded transcript has base items.
func NewTurn(tb testing.TB, base int) Turn {
	tb.Helper()
	items := make([]string, base+DeltaItems)
	for i := range items {
		items[i] = message(fmt.Sprintf("message %d of a growing conversation, long enough to look like one", i))
	}
	return Turn{
		Recorded: parse(tb, body("", items[:base]...)),
		Next:     parse(tb, body("", items...)),
	}
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
// spread round-robin over owners, in parallel when parallel is true. It
// fails the benchmark if a turn does not continue once its owner is warm.
func BenchReserveRecord(b *testing.B, s *store.Store, owners []identity.Owner, parallel bool) {
	ctx := context.Background()
	turn := NewTurn(b, 32)
	step := func(o identity.Owner) {
		res := s.Reserve(ctx, o, turn.Next)
		if res.Err != nil {
			b.Fatal(res.Err)
		}
		out, err := s.Record(ctx, res, store.Result{ResponseID: "resp_bench_0123456789abcdef", Socket: store.Socket{ID: 1}})
		if err != nil || out != store.OutcomePublished {
			b.Fatalf("record: %v %v", out, err)
		}
	}
	for _, o := range owners {
		step(o) // warm: every owner has a continuation
	}
	var next atomic.Uint64
	b.ReportAllocs()
	b.ResetTimer()
	if !parallel {
		for i := 0; b.Loop(); i++ {
			step(owners[i%len(owners)])
		}
		return
	}
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			step(owners[int(next.Add(1))%len(owners)])
		}
	})
}
