package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/contstore/contstore/internal/redistest"
	"github.com/contstore/contstore/store"
)

// Sweep returns within OpTimeout like every operation, however many
// partitions it has to visit: with 8 ms a reply, visiting 1,024 partitions
// one after another would take 8 s. Work left is no error, nor observed
// as one.
func TestSweepReturnsWithinOpTimeout(t *testing.T) {
	_, c := redistest.Miniredis(t)
	const opTimeout = 100 * time.Millisecond
	c.AddHook(redistest.CommandHook(func(redis.Cmder) { time.Sleep(8 * time.Millisecond) }))
	seen := &recorder{}
	s, err := store.NewRedis(c, store.Options{Partitions: 1024, MaxOwners: 1 << 20, OpTimeout: opTimeout, Observer: seen})
	require.NoError(t, err)

	start := time.Now()
	_, err = s.Sweep(context.Background())
	took := time.Since(start)
	require.NoError(t, err)
	// OpTimeout, and room for a descheduled test process: far below 8 s.
	assert.Less(t, took, opTimeout+2*time.Second)
	seen.mu.Lock()
	defer seen.mu.Unlock()
	sweeps := 0
	for _, e := range seen.events {
		if e.Op == store.OpSweep {
			sweeps++
			assert.NoError(t, e.Err)
		}
	}
	assert.Positive(t, sweeps)
}
