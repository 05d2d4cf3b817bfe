package fingerprint

import (
	"fmt"
	"testing"

	"github.com/contstore/contstore/internal/agentchat"
)

// BenchmarkParseSeen parses a coding agent's body of many short items
// (internal/agentchat, as proxy's BenchmarkGateway sends), all of which the parser's item
// cache holds: what a gateway parses every turn, when a client resends its
// whole history.
//
// With full-cache, the cache is full of other items before the body is
// parsed the first time, as a gateway's is after a while.
func BenchmarkParseSeen(b *testing.B) {
	for _, size := range []struct {
		items int
		full  bool
	}{{5_000, false}, {1_000, false}, {5_000, true}} {
		n := size.items
		body := agentchat.Body(n)
		name := fmt.Sprintf("items=%d", n)
		if size.full {
			name += "/full-cache"
		}
		b.Run(name, func(b *testing.B) {
			p := *testParser
			p.items = newItemCache()
			if size.full {
				for i := range 2 * itemCacheSets * itemCacheWays {
					p.items.put(p.items.hash(fmt.Appendf(nil, `{"other":%d}`, i)), cachedItem{})
				}
			}
			if _, err := p.Parse(body); err != nil {
				b.Fatal(err)
			}
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
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
