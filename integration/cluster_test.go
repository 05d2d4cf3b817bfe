package integration

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/contstore/contstore/identity"
	"github.com/contstore/contstore/internal/rediskeys"
	"github.com/contstore/contstore/internal/redistest"
	"github.com/contstore/contstore/store"
	"github.com/contstore/contstore/store/storetest"
)

// The default namespace's partitions spread over every master of the
// 3-master cluster, so load spreads too: a store with the default options
// reserves a turn in each partition, and every master holds the keys of at
// least two of them. It writes and then deletes the default namespace, so it
// runs on the throwaway cluster of scripts/redis-env.sh, which nothing else
// uses with the default namespace.
func TestDefaultPartitionsLandOnEveryMaster(t *testing.T) {
	c := redistest.Cluster(t)
	ctx := context.Background()
	s, err := store.NewRedis(c, store.Options{OpTimeout: redistest.PatientOpTimeout})
	require.NoError(t, err)
	ns, partitions := s.Options().Namespace, s.Options().Partitions
	redistest.CleanupNamespace(t, c, ns+":")
	req := storetest.NewTurn(t, s, 1).Next
	reserved := map[int]bool{}
	for i := 0; len(reserved) < partitions; i++ {
		require.Less(t, i, 100*partitions, "no owner found in partitions other than %v", reserved)
		o, err := identity.Main(fmt.Sprintf("spread-%d", i))
		require.NoError(t, err)
		if p := o.Partition(partitions); !reserved[p] {
			reserved[p] = true
			res := s.Reserve(ctx, o, req)
			require.NoError(t, res.Err)
		}
	}

	// The hash tags of the owner states each master holds: one a partition.
	var mu sync.Mutex
	tags := map[string]map[string]bool{}
	require.NoError(t, c.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error {
		return rediskeys.Scan(ctx, n, rediskeys.EscapeGlob(ns+":")+"*", func(keys []string) error {
			mu.Lock()
			defer mu.Unlock()
			addr := n.Options().Addr
			if tags[addr] == nil {
				tags[addr] = map[string]bool{}
			}
			for _, k := range keys {
				_, rest, _ := strings.Cut(k, "{")
				if tag, kind, _ := strings.Cut(rest, "}"); strings.HasPrefix(kind, ":o:") {
					tags[addr][tag] = true
				}
			}
			return nil
		})
	}))
	total := 0
	for addr, held := range tags {
		t.Logf("master %s holds %d partitions", addr, len(held))
		assert.GreaterOrEqual(t, len(held), 2, "master %s holds only %d partitions", addr, len(held))
		total += len(held)
	}
	assert.Len(t, tags, 3, "masters holding partitions")
	assert.Equal(t, partitions, total, "partitions found on the masters")
}
