package integration

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/contstore/contstore/internal/redistest"
)

// The default namespace's 16 partitions spread over every master of the
// 3-master cluster, so load spreads too.
func TestDefaultPartitionsLandOnEveryMaster(t *testing.T) {
	c := redistest.Cluster(t)
	ctx := context.Background()
	slots, err := c.ClusterSlots(ctx).Result()
	require.NoError(t, err)
	masterOf := func(slot int64) string {
		for _, r := range slots {
			if int64(r.Start) <= slot && slot <= int64(r.End) {
				return r.Nodes[0].Addr
			}
		}
		t.Fatalf("slot %d is not served", slot)
		return ""
	}
	perMaster := map[string]int{}
	for p := range 16 { // the default partitions of the default namespace
		slot, err := c.ClusterKeySlot(ctx, fmt.Sprintf("{cont:%02d}", p)).Result()
		require.NoError(t, err)
		perMaster[masterOf(slot)]++
	}
	t.Logf("partitions per master: %v", perMaster)
	assert.Len(t, perMaster, 3)
	for addr, n := range perMaster {
		assert.GreaterOrEqual(t, n, 2, "master %s serves only %d partitions", addr, n)
	}
}
