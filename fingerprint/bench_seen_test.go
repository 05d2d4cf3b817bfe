package fingerprint

import (
	"fmt"
	"testing"

	"github.com/contstore/contstore/internal/agentchat"
)

// BenchmarkParseSeen parses a coding agent's body of many short items
// (internal/agentchat, as proxy's BenchmarkGateway sends) whose items the
// parser has seen: what a gateway parses every turn, when a client resends
// its whole history.
//
//   - next-turn: the conversation's previous body (two items shorter) was
//     parsed just before, so the run cache holds its input array;
//   - items-only: no run cache, every item found in the item cache, as
//     when the history changed near its start;
//   - full-cache: the same, the item cache full of other items before the
//     body is first parsed, as a gateway's is after a while.
func BenchmarkParseSeen(b *testing.B) {
	for _, size := range []struct {
		items      int
		mode       string
		full, runs bool
	}{
		{5_000, "next-turn", false, true},
		{1_000, "next-turn", false, true},
		{5_000, "items-only", false, false},
		{1_000, "items-only", false, false},
		{5_000, "full-cache", true, false},
	} {
		n := size.items
		body, prev := agentchat.Body(n), agentchat.Body(n-2)
		b.Run(fmt.Sprintf("items=%d/%s", n, size.mode), func(b *testing.B) {
			p := *testParser
			p.items, p.runs = newItemCache(), nil
			if size.full {
				fill(p.items, 0, 2*itemCacheSets*itemCacheWays, func(i int) cachedItem {
					return cachedItem{key: p.items.hash(fmt.Appendf(nil, `{"other":%d}`, i))}
				})
			}
			if _, err := p.Parse(body); err != nil {
				b.Fatal(err)
			}
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				if size.runs {
					b.StopTimer()
					p.runs = newRunCache()
					if _, err := p.Parse(prev); err != nil {
						b.Fatal(err)
					}
					b.StartTimer()
				}
				r, err := p.Parse(body)
				if err != nil {
					b.Fatal(err)
				}
				if r.Len() != n {
					b.Fatalf("Len() = %d, want %d", r.Len(), n)
				}
			}
		})
	}
}
