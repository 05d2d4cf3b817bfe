package integration

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/contstore/contstore/internal/redistest"
	"github.com/contstore/contstore/store"
	"github.com/contstore/contstore/store/storetest"
)

// BenchmarkReserveRecord measures one turn (reserve + record, 8-item delta)
// on the standalone Redis, sequentially and in parallel.
func BenchmarkReserveRecord(b *testing.B) {
	c := redistest.Standalone(b)
	owners := storetest.Owners(b, 10_000)
	for _, parallel := range []bool{false, true} {
		b.Run(fmt.Sprintf("redis/owners=10000/parallel=%v", parallel), func(b *testing.B) {
			ns := redistest.Namespace(b)
			redistest.CleanupNamespace(b, c, ns)
			s, err := store.NewRedis(c, store.Options{Namespace: ns, MaxOwners: 20_000}) // room for all: no turn evicts
			require.NoError(b, err)
			storetest.BenchReserveRecord(b, s, owners, parallel)
		})
	}
}

// BenchmarkScriptServerTime reports the server's own time per script call
// (INFO commandstats usec_per_call of EVALSHA) for reserve and for record,
// with 10,000 owners holding a continuation, on a private server. Each
// phase runs b.N calls from 8 clients so the server is measured warm, as
// under a gateway's load, not one cold call at a time.
func BenchmarkScriptServerTime(b *testing.B) {
	c := privateServer(b)
	ctx := context.Background()
	s, err := store.NewRedis(c, store.Options{Namespace: "usec", MaxOwners: 10_000})
	require.NoError(b, err)
	owners := storetest.Owners(b, 10_000)
	turn := storetest.NewTurn(b, s, 32)
	reservations := make([]*store.Reservation, b.N)
	record := func(i int) {
		_, err := s.Record(ctx, reservations[i], store.Result{ResponseID: "resp_bench", Socket: store.Socket{ID: 1}})
		if err != nil {
			b.Error(err)
		}
	}
	for i, o := range owners {
		res := s.Reserve(ctx, o, turn.Recorded)
		_, err := s.Record(ctx, res, store.Result{ResponseID: "resp_warm", Socket: store.Socket{ID: 1}})
		require.NoError(b, err, "owner %d", i)
	}
	phase := func(op func(i int)) float64 {
		require.NoError(b, c.ConfigResetStat(ctx).Err())
		parallelFor(b.N, 8, op)
		return commandStats(b, c)["evalsha"].usecPerCall
	}
	b.ResetTimer()
	reserve := phase(func(i int) { reservations[i] = s.Reserve(ctx, owners[i%len(owners)], turn.Next) })
	recordUsec := phase(record)
	b.ReportMetric(reserve, "server-us/reserve")
	b.ReportMetric(recordUsec, "server-us/record")
}

// parallelFor runs op(0..n-1) on workers goroutines.
func parallelFor(n, workers int, op func(i int)) {
	var next atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for i := int(next.Add(1)) - 1; i < n; i = int(next.Add(1)) - 1 {
				op(i)
			}
		})
	}
	wg.Wait()
}
