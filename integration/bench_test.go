package integration

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

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

// BenchmarkStoreThroughput compares the store's operations per second with
// the ceiling of the same client: a script that does nothing, at 64
// concurrent callers, on a private redis-server pinned to the last CPU. A
// store op is a reserve or a record of 10,000 owners taking turns that
// continue; server-busy is the share of the store's run the server spent
// on its CPU. The figures are medians of 3 rounds, each store round set
// against the ceilings measured just before and after it. go-redis runs
// with ContextTimeoutEnabled (the store calls the client on the caller's
// goroutine) and without (a goroutine per call); rueidis (NewRueidis)
// last. Run on the other CPU with -benchtime 1x (see BENCHMARKS.md).
//
// It also reports the process's CPU time (user and system, getrusage) per
// operation: noop-cpu-µs/op over the ceiling rounds (the mean of the two
// around each store round), store-cpu-µs/op over the store rounds, and
// store-layer-cpu-µs/op, the median of their differences: what a store
// operation costs the client process beyond a no-op EVALSHA through the
// same client. It includes encoding the store's larger keys and arguments,
// so it overstates the store's own layer slightly. The server runs on
// another CPU, so the process's time is the client's.
func BenchmarkStoreThroughput(b *testing.B) {
	const callers, ops = 64, 100_000
	ctx := context.Background()
	// client is one way of reaching the server: a no-op script and a store.
	type client struct {
		name string
		open func(b *testing.B, addr string) (noop func() error, open func(store.Options) (*store.Store, error))
	}
	goRedis := func(deadlines bool) client {
		return client{fmt.Sprintf("go-redis/context-deadlines=%v", deadlines), func(b *testing.B, addr string) (func() error, func(store.Options) (*store.Store, error)) {
			c := redis.NewClient(&redis.Options{Addr: addr, PoolSize: callers, ContextTimeoutEnabled: deadlines})
			b.Cleanup(func() { _ = c.Close() })
			noop := redis.NewScript("return 1")
			require.NoError(b, noop.Load(ctx, c).Err())
			return func() error { return noop.EvalSha(ctx, c, nil).Err() },
				func(o store.Options) (*store.Store, error) { return store.NewRedis(c, o) }
		}}
	}
	autoPipelined := client{"go-redis/auto-pipelining", func(b *testing.B, addr string) (func() error, func(store.Options) (*store.Store, error)) {
		c := redis.NewClient(&redis.Options{Addr: addr, PoolSize: callers})
		b.Cleanup(func() { _ = c.Close() })
		ap, err := c.AutoPipeline()
		require.NoError(b, err)
		noop := redis.NewScript("return 1")
		require.NoError(b, noop.Load(ctx, c).Err())
		return func() error { return noop.EvalSha(ctx, ap, nil).Err() },
			func(o store.Options) (*store.Store, error) { return store.NewRedis(ap, o) }
	}}
	clients := []client{goRedis(true), goRedis(false), autoPipelined, {"rueidis", func(b *testing.B, addr string) (func() error, func(store.Options) (*store.Store, error)) {
		c := newRueidis(b, addr)
		noop := rueidis.NewLuaScript("return 1")
		return func() error { return noop.Exec(ctx, c, nil, nil).Error() },
			func(o store.Options) (*store.Store, error) { return store.NewRueidis(c, o) }
	}}}
	for _, cl := range clients {
		b.Run(cl.name, func(b *testing.B) {
			srv := pinnedServer(b)
			noop, open := cl.open(b, srv.Options().Addr)
			owners := storetest.Owners(b, 10_000)
			for b.Loop() {
				require.NoError(b, noop())
				// ceiling returns the no-op calls per second and the
				// process's CPU per call, in µs.
				ceiling := func() (float64, float64) {
					cpu, start := processCPU(b), time.Now()
					parallelFor(ops, callers, func(int) {
						if err := noop(); err != nil {
							b.Error(err)
						}
					})
					took := time.Since(start).Seconds()
					return float64(ops) / took, perOp(processCPU(b)-cpu, ops)
				}

				s, err := open(store.Options{Namespace: redistest.Namespace(b), MaxOwners: 20_000})
				require.NoError(b, err)
				turn := storetest.NewTurn(b, s, 32)
				fill(b, s, owners, turn)
				// Ceiling and store alternate; each store round is set
				// against the mean of the ceilings just before and after
				// it, as the machine's speed drifts within seconds.
				const rounds = 3
				var ceilings, stores, busy, ratios, noopCPU, storeCPU, layerCPU []float64
				var stopped atomic.Int64
				before, beforeCPU := ceiling()
				for r := range rounds {
					cpu, ownCPU := serverCPU(b, srv), processCPU(b)
					start := time.Now()
					parallelFor(ops/2, callers, func(i int) {
						o := owners[i%len(owners)]
						// Passes over the owners alternate, across rounds,
						// between a turn that continues and one that is not
						// append-only (the same work for the scripts).
						req := turn.Next
						if ((r*ops/2+i)/len(owners))%2 == 1 {
							req = turn.Recorded
						}
						res := s.Reserve(ctx, o, req)
						if res.Err != nil {
							b.Error(res.Err)
							return
						}
						if req == turn.Next && !res.Continues() {
							stopped.Add(1)
						}
						if _, err := s.Record(ctx, res, store.Result{ResponseID: "resp_0123456789abcdef0123456789", Socket: store.Socket{ID: 1}}); err != nil {
							b.Error(err)
						}
					})
					took := time.Since(start).Seconds()
					storeOpCPU := perOp(processCPU(b)-ownCPU, ops)
					require.Zero(b, stopped.Load(), "turns that should have continued and did not, round %d", r+1)
					busy = append(busy, (serverCPU(b, srv)-cpu)/took)
					storeOps := float64(ops) / took
					after, afterCPU := ceiling()
					around, aroundCPU := (before+after)/2, (beforeCPU+afterCPU)/2
					ceilings, stores, ratios = append(ceilings, around), append(stores, storeOps), append(ratios, storeOps/around)
					noopCPU, storeCPU, layerCPU = append(noopCPU, aroundCPU), append(storeCPU, storeOpCPU), append(layerCPU, storeOpCPU-aroundCPU)
					before, beforeCPU = after, afterCPU
				}
				b.ReportMetric(median(busy), "server-busy")
				b.ReportMetric(median(ceilings), "noop-evalsha/s")
				b.ReportMetric(median(stores), "store-ops/s")
				b.ReportMetric(median(ratios), "store/ceiling")
				b.ReportMetric(median(noopCPU), "noop-cpu-µs/op")
				b.ReportMetric(median(storeCPU), "store-cpu-µs/op")
				b.ReportMetric(median(layerCPU), "store-layer-cpu-µs/op")
			}
		})
	}
}

// processCPU returns the CPU time this process has used, user and system
// (getrusage RUSAGE_SELF).
func processCPU(b *testing.B) time.Duration {
	var ru unix.Rusage
	require.NoError(b, unix.Getrusage(unix.RUSAGE_SELF, &ru))
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// perOp returns cpu spread over ops operations, in µs.
func perOp(cpu time.Duration, ops int) float64 {
	return float64(cpu.Nanoseconds()) / 1e3 / float64(ops)
}
