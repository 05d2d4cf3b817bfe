package integration

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/contstore/contstore/internal/redistest"
)

// TestClusterScriptCrossSlotRefused checks the test environment itself,
// which no other test does: the cluster started by scripts/redis-env.sh
// refuses a script whose keys lie in different slots, so the cluster tests
// would catch a key layout that splits one operation's keys. The servers'
// shape is checked by the tests that rely on it (TestSaveDurableWaitsForReplicas:
// the replicated server has a replica and the standalone one none;
// TestDefaultPartitionsLandOnEveryMaster: the cluster has three masters).

func testContext(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

const setBothScript = `
redis.call('SET', KEYS[1], ARGV[1])
redis.call('SET', KEYS[2], ARGV[2])
return redis.call('MGET', KEYS[1], KEYS[2])
`

func TestClusterScriptCrossSlotRefused(t *testing.T) {
	c := redistest.Cluster(t)
	ns := redistest.Namespace(t)
	redistest.CleanupNamespace(t, c, ns)
	ctx := testContext(t)

	// Two keys that the server itself places in different slots.
	first := ns + ":a"
	s0, err := c.ClusterKeySlot(ctx, first).Result()
	require.NoError(t, err)
	var second string
	for i := 0; second == ""; i++ {
		require.Less(t, i, 100, "no key in another slot found")
		k := fmt.Sprintf("%s:b%d", ns, i)
		s, err := c.ClusterKeySlot(ctx, k).Result()
		require.NoError(t, err)
		if s != s0 {
			second = k
		}
	}
	keys := []string{first, second}
	script := redis.NewScript(setBothScript)

	// Through the cluster client: it routes EVALSHA/EVAL by the first key
	// and the owning node refuses the request. The servers' error counters
	// show that the refusal is theirs, not the client's.
	before := crossSlotErrors(t, ctx, c)
	err = script.Run(ctx, c, keys, "x", "y").Err()
	require.Error(t, err)
	assert.Contains(t, err.Error(), "CROSSSLOT")
	assert.Greater(t, crossSlotErrors(t, ctx, c), before, "no server counted a CROSSSLOT error")

	// Directly on the node owning the first key, bypassing any client-side
	// routing: the refusal comes from the server.
	node, err := c.MasterForKey(ctx, first)
	require.NoError(t, err)
	err = node.Do(ctx, "EVAL", setBothScript, 2, first, second, "x", "y").Err()
	require.Error(t, err)
	assert.Contains(t, err.Error(), "CROSSSLOT")
	var rerr redis.Error
	require.ErrorAs(t, err, &rerr, "want a server error reply, got %T", err)

	// The script never ran.
	n, err := c.Exists(ctx, first).Result()
	require.NoError(t, err)
	assert.Zero(t, n)
	n, err = c.Exists(ctx, second).Result()
	require.NoError(t, err)
	assert.Zero(t, n)
}

// crossSlotErrors sums the CROSSSLOT error replies counted by all masters
// (INFO errorstats).
func crossSlotErrors(t *testing.T, ctx context.Context, c *redis.ClusterClient) int {
	t.Helper()
	var (
		mu    sync.Mutex
		total int
	)
	err := c.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error {
		info, err := n.Info(ctx, "errorstats").Result()
		if err != nil {
			return err
		}
		for _, line := range strings.Split(info, "\n") {
			v, ok := strings.CutPrefix(strings.TrimSpace(line), "errorstat_CROSSSLOT:count=")
			if !ok {
				continue
			}
			k, err := strconv.Atoi(v)
			if err != nil {
				return fmt.Errorf("parsing %q: %w", line, err)
			}
			mu.Lock()
			total += k
			mu.Unlock()
		}
		return nil
	})
	require.NoError(t, err)
	return total
}
