package integration

import (
	"testing"
	"time"

	"github.com/contstore/contstore/store"
	"github.com/contstore/contstore/store/storetest"
)

// realTimeModel checks a real server against the in-process model. Real
// servers keep their own clock, so the model follows the wall clock too:
// time steps are real sleeps well past the TTL, and the limits are high
// enough that no eviction depends on which millisecond a touch fell in
// (miniredis, whose clock the test moves, covers evictions against the
// model in package store).
func realTimeModel(t *testing.T, open storetest.Opener) {
	storetest.CheckModel(t, storetest.ModelConfig{
		Options: store.Options{Partitions: 2, TTL: 300 * time.Millisecond, MaxOwners: 1000, MaxTotalBytes: 1 << 20},
		Open:    open,
		Steps:   []time.Duration{time.Millisecond, time.Millisecond, time.Millisecond, 400 * time.Millisecond},
	})
}

func TestRedisMatchesTheModel(t *testing.T)   { realTimeModel(t, opener(standalone)) }
func TestClusterMatchesTheModel(t *testing.T) { realTimeModel(t, opener(cluster)) }
