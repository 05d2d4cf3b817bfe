package prommetrics_test

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/contstore/contstore/internal/redistest"
	"github.com/contstore/contstore/store"
	"github.com/contstore/contstore/store/prommetrics"
)

// The stats collector exports what Stats reads: totals, evictions by
// cause, limits, and each partition's breaker state.
func TestStatsCollector(t *testing.T) {
	m := prommetrics.New(prommetrics.Options{})
	s, err := store.NewMemory(store.Options{Partitions: 2, MaxOwners: 4, Observer: m})
	require.NoError(t, err)
	for i := range 8 {
		s.Reserve(ctx, owner(t, fmt.Sprint("s", i)), nil)
	}
	st, err := s.Stats(ctx)
	require.NoError(t, err)
	require.Positive(t, st.Total.Evictions.Owners)
	c := m.StatsCollector(s, time.Second)
	reg := registered(t, c)

	want := fmt.Sprintf(`
# HELP contstore_breaker_state 1 for the current state of each partition's circuit breaker, else 0.
# TYPE contstore_breaker_state gauge
contstore_breaker_state{partition="0",state="closed"} 1
contstore_breaker_state{partition="0",state="half_open"} 0
contstore_breaker_state{partition="0",state="open"} 0
contstore_breaker_state{partition="1",state="closed"} 1
contstore_breaker_state{partition="1",state="half_open"} 0
contstore_breaker_state{partition="1",state="open"} 0
# HELP contstore_stats_evictions_total Owner states evicted since the namespace began, by cause (ttl, owners, bytes).
# TYPE contstore_stats_evictions_total counter
contstore_stats_evictions_total{cause="bytes"} 0
contstore_stats_evictions_total{cause="owners"} %d
contstore_stats_evictions_total{cause="ttl"} 0
# HELP contstore_stats_owners Owner states stored, idle ones no operation has pruned yet included.
# TYPE contstore_stats_owners gauge
contstore_stats_owners %d
# HELP contstore_stats_partition_limit_bytes Each partition's share of MaxTotalBytes.
# TYPE contstore_stats_partition_limit_bytes gauge
contstore_stats_partition_limit_bytes 1e+07
# HELP contstore_stats_partition_limit_owners Each partition's share of MaxOwners.
# TYPE contstore_stats_partition_limit_owners gauge
contstore_stats_partition_limit_owners 2
# HELP contstore_stats_partitions Number of partitions.
# TYPE contstore_stats_partitions gauge
contstore_stats_partitions 2
# HELP contstore_stats_published_continuations Owner states holding a continuation.
# TYPE contstore_stats_published_continuations gauge
contstore_stats_published_continuations 0
# HELP contstore_stats_scrape_errors_total Stats calls that failed.
# TYPE contstore_stats_scrape_errors_total counter
contstore_stats_scrape_errors_total 0
# HELP contstore_stats_stored_bytes Stored-bytes estimate of the owner states.
# TYPE contstore_stats_stored_bytes gauge
contstore_stats_stored_bytes %d
# HELP contstore_stats_up 1 when the last Stats call succeeded, else 0.
# TYPE contstore_stats_up gauge
contstore_stats_up 1
`, st.Total.Evictions.Owners, st.Total.Owners, st.Total.StoredBytes)
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(want)))
	assert.Equal(t, int64(4), st.Total.Owners)

	problems, err := testutil.CollectAndLint(c)
	require.NoError(t, err)
	assert.Empty(t, problems)
	ops, err := m.Metric("operations_total", "stats", "ok")
	require.NoError(t, err)
	assert.Equal(t, 3.0, testutil.ToFloat64(ops), "the scrapes' Stats calls are operations too")
}

// When Stats fails, a scrape exports stats_up 0, counts the error and the
// breaker states, and nothing else.
func TestStatsCollectorError(t *testing.T) {
	m := prommetrics.New(prommetrics.Options{})
	s, err := store.NewRedis(redistest.Failing(t), store.Options{Partitions: 1, BreakerFailures: 1, OpTimeout: time.Second})
	require.NoError(t, err)
	o := owner(t, "s1")
	require.Equal(t, store.ReasonStoreUnavailable, s.Reserve(ctx, o, nil).Reason) // opens the breaker
	reg := registered(t, m.StatsCollector(s, time.Second))

	for scrape := 1; scrape <= 2; scrape++ {
		require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(fmt.Sprintf(`
# HELP contstore_breaker_state 1 for the current state of each partition's circuit breaker, else 0.
# TYPE contstore_breaker_state gauge
contstore_breaker_state{partition="0",state="closed"} 0
contstore_breaker_state{partition="0",state="half_open"} 0
contstore_breaker_state{partition="0",state="open"} 1
# HELP contstore_stats_scrape_errors_total Stats calls that failed.
# TYPE contstore_stats_scrape_errors_total counter
contstore_stats_scrape_errors_total %d
# HELP contstore_stats_up 1 when the last Stats call succeeded, else 0.
# TYPE contstore_stats_up gauge
contstore_stats_up 0
`, scrape))))
	}
}

// A timeout bounds the scrape's Stats call.
func TestStatsCollectorTimeout(t *testing.T) {
	m := prommetrics.New(prommetrics.Options{})
	hook := &hangHook{}
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:0"})
	c.AddHook(hook)
	const opTimeout = 5 * time.Second
	s, err := store.NewRedis(c, store.Options{Partitions: 1, OpTimeout: opTimeout})
	require.NoError(t, err)
	hook.hang.Store(true) // from now on Redis answers nothing
	reg := registered(t, m.StatsCollector(s, 50*time.Millisecond))
	start := time.Now()
	n, err := testutil.GatherAndCount(reg, "contstore_stats_up", "contstore_stats_scrape_errors_total")
	require.NoError(t, err)
	assert.Equal(t, 2, n)
	elapsed := time.Since(start)
	assert.GreaterOrEqual(t, elapsed, 50*time.Millisecond, "the call waited for Redis")
	assert.Less(t, elapsed, opTimeout/2, "the scrape's timeout, not OpTimeout, ended the call")
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP contstore_stats_up 1 when the last Stats call succeeded, else 0.
# TYPE contstore_stats_up gauge
contstore_stats_up 0
`), "contstore_stats_up"))
}

// hangHook fails every command at once until hang is set, then holds each
// until its context ends, as a Redis that stopped answering would.
type hangHook struct{ hang atomic.Bool }

func (h *hangHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *hangHook) ProcessHook(redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := errDown
		if h.hang.Load() {
			<-ctx.Done()
			err = ctx.Err()
		}
		cmd.SetErr(err)
		return err
	}
}

func (h *hangHook) ProcessPipelineHook(redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := errDown
		if h.hang.Load() {
			<-ctx.Done()
			err = ctx.Err()
		}
		for _, cmd := range cmds {
			cmd.SetErr(err)
		}
		return err
	}
}
