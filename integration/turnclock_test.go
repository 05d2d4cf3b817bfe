package integration

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/contstore/contstore/identity"
	"github.com/contstore/contstore/store"
)

// Turn tokens never repeat after Redis loses its data, at the highest rate
// this machine reaches: reserves from 8 clients into one partition, as fast
// as they go, then FLUSHALL, then the same owners again. Every token after
// the loss is larger than every token before it, the partition's clock never
// ran ahead of the server's, and no reservation held across the loss can
// publish.
func TestTurnTokensSurviveDataLoss(t *testing.T) {
	ctx := context.Background()
	c := privateServer(t)
	s, err := store.NewRedis(c, store.Options{Partitions: 1, MaxOwners: 1000, OpTimeout: 5 * time.Second})
	require.NoError(t, err)
	owners := make([]identity.Owner, 64)
	for i := range owners {
		owners[i], err = identity.Main(fmt.Sprintf("clock-%d", i))
		require.NoError(t, err)
	}
	req, err := s.ParseRequest([]byte(`{"input":["a"]}`))
	require.NoError(t, err)

	// The burst: at most 2 s or 200,000 reserves.
	const workers, most = 8, 200_000
	var (
		mu     sync.Mutex
		issued = map[store.Turn]bool{}
		maxOld store.Turn
		held   = make([]*store.Reservation, len(owners)) // each owner's last turn
		count  int
	)
	deadline := time.Now().Add(2 * time.Second)
	start := time.Now()
	parallelFor(workers, workers, func(w int) {
		for i := w; time.Now().Before(deadline); i += workers {
			res := s.Reserve(ctx, owners[i%len(owners)], req)
			if res.Err != nil {
				t.Errorf("reserve: %v", res.Err)
				return
			}
			mu.Lock()
			if issued[res.Turn] {
				t.Errorf("turn %v issued twice", res.Turn)
			}
			issued[res.Turn] = true
			maxOld = max(maxOld, res.Turn)
			if h := held[i%len(owners)]; h == nil || h.Turn < res.Turn {
				held[i%len(owners)] = res
			}
			count++
			done := count >= most
			mu.Unlock()
			if done {
				return
			}
		}
	})
	elapsed := time.Since(start)
	t.Logf("%d reserves into one partition in %v: %.1f per ms", count, elapsed.Round(time.Millisecond), float64(count)/float64(elapsed.Milliseconds()))

	// The partition's clock is not ahead of the server's.
	seq, err := c.Get(ctx, "cont:{cont:00}:seq").Result()
	require.NoError(t, err)
	now, err := c.Time(ctx).Result()
	require.NoError(t, err)
	drawn, err := strconv.ParseInt(seq, 10, 64)
	require.NoError(t, err)
	ahead := time.Duration(drawn-(now.UnixMicro()-1735689600_000_000)) * time.Microsecond
	assert.LessOrEqual(t, ahead, time.Duration(0), "the partition's clock runs %v ahead of the server's", ahead)

	require.NoError(t, c.FlushAll(ctx).Err())

	// After the loss: every owner's new turn is above every earlier one.
	var again []*store.Reservation
	for range 4 {
		for _, o := range owners {
			res := s.Reserve(ctx, o, req)
			require.NoError(t, res.Err)
			again = append(again, res)
		}
	}
	below := 0
	for _, res := range again {
		if res.Turn <= maxOld || issued[res.Turn] {
			below++
		}
	}
	assert.Zero(t, below, "of %d turns after the loss, %d are at or below the largest before it (%v)", len(again), below, maxOld)

	// A turn held across the loss cannot publish over the new one.
	published := 0
	for _, h := range held {
		out, err := s.Record(ctx, h, store.Result{ResponseID: "resp_old", Socket: store.Socket{ID: 1}})
		require.NoError(t, err)
		if out == store.OutcomePublished {
			published++
		}
	}
	assert.Zero(t, published, "of %d turns held across the loss, %d published", len(held), published)
}
