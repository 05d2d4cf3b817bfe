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

// These tests check the test environment itself: that the servers started
// by scripts/redis-env.sh have the shape the other tests rely on.

func testContext(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// infoField returns the value of field in the output of INFO or CLUSTER INFO.
func infoField(t *testing.T, info, field string) string {
	t.Helper()
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), field+":"); ok {
			return v
		}
	}
	t.Fatalf("field %q not found in:\n%s", field, info)
	return ""
}

const setBothScript = `
redis.call('SET', KEYS[1], ARGV[1])
redis.call('SET', KEYS[2], ARGV[2])
return redis.call('MGET', KEYS[1], KEYS[2])
`

func TestStandalonePingAndScript(t *testing.T) {
	c := redistest.Standalone(t)
	ns := redistest.Namespace(t)
	redistest.CleanupNamespace(t, c, ns)
	ctx := testContext(t)

	require.Equal(t, "PONG", c.Ping(ctx).Val())

	incr := redis.NewScript(`return redis.call('INCRBY', KEYS[1], ARGV[1])`)
	key := ns + ":counter"
	n, err := incr.Run(ctx, c, []string{key}, 5).Int64()
	require.NoError(t, err)
	assert.Equal(t, int64(5), n)
	n, err = incr.Run(ctx, c, []string{key}, 2).Int64()
	require.NoError(t, err)
	assert.Equal(t, int64(7), n)
}

func TestStandaloneWithoutReplicaWaitReturnsZero(t *testing.T) {
	c := redistest.Standalone(t)
	ns := redistest.Namespace(t)
	redistest.CleanupNamespace(t, c, ns)
	ctx := testContext(t)

	info, err := c.Info(ctx, "replication").Result()
	require.NoError(t, err)
	assert.Equal(t, "master", infoField(t, info, "role"))
	assert.Equal(t, "0", infoField(t, info, "connected_slaves"))

	require.NoError(t, c.Set(ctx, ns+":k", "v", 0).Err())
	acked, err := c.Wait(ctx, 1, 100*time.Millisecond).Result()
	require.NoError(t, err)
	assert.Equal(t, int64(0), acked)
}

func TestReplicatedWaitReturnsOne(t *testing.T) {
	c := redistest.Replicated(t)
	ns := redistest.Namespace(t)
	redistest.CleanupNamespace(t, c, ns)
	ctx := testContext(t)

	info, err := c.Info(ctx, "replication").Result()
	require.NoError(t, err)
	assert.Equal(t, "master", infoField(t, info, "role"))
	replicas, err := strconv.Atoi(infoField(t, info, "connected_slaves"))
	require.NoError(t, err)
	require.GreaterOrEqual(t, replicas, 1)

	require.NoError(t, c.Set(ctx, ns+":k", "v", 0).Err())
	acked, err := c.Wait(ctx, 1, time.Second).Result()
	require.NoError(t, err)
	assert.Equal(t, int64(1), acked)
}

func TestClusterTopology(t *testing.T) {
	c := redistest.Cluster(t)
	ctx := testContext(t)

	var (
		mu      sync.Mutex
		masters = map[string]string{} // node address -> CLUSTER INFO
	)
	err := c.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error {
		info, err := n.ClusterInfo(ctx).Result()
		if err != nil {
			return fmt.Errorf("%s: %w", n.Options().Addr, err)
		}
		mu.Lock()
		masters[n.Options().Addr] = info
		mu.Unlock()
		return nil
	})
	require.NoError(t, err)
	require.Len(t, masters, 3, "masters: %v", masters)
	for addr, info := range masters {
		assert.Equal(t, "ok", infoField(t, info, "cluster_state"), addr)
		assert.Equal(t, "16384", infoField(t, info, "cluster_slots_ok"), addr)
		assert.Equal(t, "3", infoField(t, info, "cluster_known_nodes"), addr)
		assert.Equal(t, "3", infoField(t, info, "cluster_size"), addr)
	}
}

func TestClusterScriptSameHashTag(t *testing.T) {
	c := redistest.Cluster(t)
	ns := redistest.Namespace(t)
	redistest.CleanupNamespace(t, c, ns)
	ctx := testContext(t)

	tag := "{" + ns + ":1}"
	keys := []string{ns + ":" + tag + ":a", ns + ":" + tag + ":b"}
	s0, err := c.ClusterKeySlot(ctx, keys[0]).Result()
	require.NoError(t, err)
	s1, err := c.ClusterKeySlot(ctx, keys[1]).Result()
	require.NoError(t, err)
	require.Equal(t, s0, s1, "keys sharing a hash tag must share a slot")

	res, err := redis.NewScript(setBothScript).Run(ctx, c, keys, "x", "y").StringSlice()
	require.NoError(t, err)
	assert.Equal(t, []string{"x", "y"}, res)
}

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
