package rediskeys_test

import (
	"context"
	"testing"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/contstore/contstore/internal/rediskeys"
)

func TestEscapeGlob(t *testing.T) {
	assert.Equal(t, `a\*b\?c\[d\]e\\f`, rediskeys.EscapeGlob(`a*b?c[d]e\f`))
	assert.Equal(t, "plain:{x}", rediskeys.EscapeGlob("plain:{x}"))
}

func TestDeletePrefixDeletesOnlyThePrefix(t *testing.T) {
	mr := miniredis.RunT(t)
	c := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer c.Close()
	for _, k := range []string{"ns:a", "ns:{ns:01}:b", "ns*:c", "other:a", "nsx"} {
		require.NoError(t, mr.Set(k, "1"))
	}
	require.NoError(t, rediskeys.DeletePrefix(context.Background(), c, "ns:"))
	assert.ElementsMatch(t, []string{"ns*:c", "other:a", "nsx"}, mr.Keys())
	require.NoError(t, rediskeys.DeletePrefix(context.Background(), c, "ns*"))
	assert.ElementsMatch(t, []string{"other:a", "nsx"}, mr.Keys(), "glob characters match themselves")
	assert.Error(t, rediskeys.DeletePrefix(context.Background(), c, ""))
}
