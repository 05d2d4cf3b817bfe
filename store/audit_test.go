package store

import (
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/contstore/contstore/identity"
	"github.com/contstore/contstore/internal/redistest"
)

// A state filed under a partition other than its owner's, with its LRU
// entry and accounting moved along so that everything else adds up, is
// found by the audit.
func TestAuditFindsAStateInTheWrongPartition(t *testing.T) {
	_, c := redistest.Miniredis(t)
	s, b := openRedis(t, c)
	owner, _ := identity.Main("misfiled")
	publishedTurn(t, s, owner, `{"input":["a"]}`, "resp_1")
	a, err := s.Audit(ctx)
	require.NoError(t, err)
	require.Empty(t, a.Problems, "sound before the move")

	p, keys := b.ownerKeys(owner)
	q := 1 - p // openRedis has 2 partitions
	score, err := c.ZScore(ctx, keys[1], owner.Key()).Result()
	require.NoError(t, err)
	acct, err := c.HGetAll(ctx, keys[2]).Result()
	require.NoError(t, err)
	require.NoError(t, c.Rename(ctx, keys[0], b.keys.owner(q, owner)).Err())
	require.NoError(t, c.ZRem(ctx, keys[1], owner.Key()).Err())
	require.NoError(t, c.ZAdd(ctx, b.keys.lru(q), redis.Z{Score: score, Member: owner.Key()}).Err())
	require.NoError(t, c.HSet(ctx, b.keys.part(q), "bytes", acct["bytes"], "published", acct["published"]).Err())
	require.NoError(t, c.HSet(ctx, keys[2], "bytes", 0, "published", 0).Err())

	a, err = s.Audit(ctx)
	require.NoError(t, err)
	assert.Equal(t, int64(1), a.Owners)
	require.Len(t, a.Problems, 1, "%q", a.Problems)
	assert.Contains(t, a.Problems[0], "does not belong to this partition")
}
