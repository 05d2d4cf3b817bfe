package session_test

import (
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/contstore/contstore/internal/redistest"
	"github.com/contstore/contstore/session"
	"github.com/contstore/contstore/session/sessiontest"
)

func TestMemoryConformance(t *testing.T) {
	shared := map[string]session.Store{}
	sessiontest.Run(t, func(t *testing.T, opts session.StoreOptions) session.Store {
		key := opts.Namespace + opts.Mode.String() + opts.TTL.String()
		if st, ok := shared[key]; ok {
			return st
		}
		st, err := session.NewMemoryStore(opts)
		require.NoError(t, err)
		shared[key] = st
		return st
	})
}

func TestMiniredisConformance(t *testing.T) {
	mr, _ := redistest.Miniredis(t)
	redistest.FollowRealTime(t, mr)
	sessiontest.Run(t, func(t *testing.T, opts session.StoreOptions) session.Store {
		c := redis.NewClient(&redis.Options{Addr: mr.Addr()})
		t.Cleanup(func() { _ = c.Close() })
		st, err := session.NewRedisStore(c, opts)
		require.NoError(t, err)
		return st
	})
}
