package integration

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/contstore/contstore/identity"
	"github.com/contstore/contstore/store"
	"github.com/contstore/contstore/store/storetest"
)

// fill gives n owners a published continuation, from 16 clients.
func fill(b *testing.B, s *store.Store, owners []identity.Owner, turn storetest.Turn) {
	ctx := context.Background()
	parallelFor(len(owners), 16, func(i int) {
		res := s.Reserve(ctx, owners[i], turn.Recorded)
		out, err := s.Record(ctx, res, store.Result{ResponseID: "resp_0123456789abcdef0123456789", Socket: store.Socket{Replica: "replica-1", ID: 17}})
		if err != nil || out != store.OutcomePublished {
			b.Errorf("owner %d: %v %v", i, out, err)
		}
	})
}

func usedMemory(b *testing.B, c *redis.Client) int64 {
	info, err := c.Info(context.Background(), "memory").Result()
	require.NoError(b, err)
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "used_memory:"); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			require.NoError(b, err)
			return n
		}
	}
	b.Fatal("no used_memory in INFO memory")
	return 0
}

// BenchmarkMemoryPerOwner reports Redis used_memory per owner holding a
// published continuation, at 100,000 owners over the default 16
// partitions, on a private server. Run with -benchtime 1x.
func BenchmarkMemoryPerOwner(b *testing.B) {
	const n = 100_000
	owners := storetest.Owners(b, n)
	for b.Loop() {
		c := privateServer(b)
		s, err := store.NewRedis(c, store.Options{MaxOwners: 2 * n, MaxTotalBytes: 1 << 40})
		require.NoError(b, err)
		turn := storetest.NewTurn(b, s, 32)
		before := usedMemory(b, c)
		fill(b, s, owners, turn)
		after := usedMemory(b, c)
		st, err := s.Stats(context.Background())
		require.NoError(b, err)
		require.Equal(b, int64(n), st.Total.Published)
		b.ReportMetric(float64(after-before)/n, "bytes/owner")
		b.ReportMetric(float64(st.Total.StoredBytes)/n, "estimated-bytes/owner")
	}
}

// BenchmarkRecordServerTimeAtScale reports the server time per record
// script call (usec_per_call) with 10,000 and 1,000,000 owners in one
// partition, to show the cost does not grow with the number of owners. Run
// with -benchtime 1x.
func BenchmarkRecordServerTimeAtScale(b *testing.B) {
	const calls = 20_000
	ctx := context.Background()
	for _, n := range []int{10_000, 1_000_000} {
		b.Run(fmt.Sprintf("owners=%d", n), func(b *testing.B) {
			owners := storetest.Owners(b, n)
			for b.Loop() {
				c := privateServer(b)
				s, err := store.NewRedis(c, store.Options{Partitions: 1, MaxOwners: 2 * n, MaxTotalBytes: 1 << 40})
				require.NoError(b, err)
				turn := storetest.NewTurn(b, s, 32)
				fill(b, s, owners, turn)
				reservations := make([]*store.Reservation, calls)
				for i := range reservations {
					reservations[i] = s.Reserve(ctx, owners[(i*7919)%n], turn.Next)
				}
				require.NoError(b, c.ConfigResetStat(ctx).Err())
				parallelFor(calls, 8, func(i int) {
					_, err := s.Record(ctx, reservations[i], store.Result{ResponseID: "resp_0123456789abcdef0123456789", Socket: store.Socket{ID: 1}})
					if err != nil {
						b.Error(err)
					}
				})
				b.ReportMetric(commandStats(b, c)["evalsha"].usecPerCall, "server-us/record")
			}
		})
	}
}
