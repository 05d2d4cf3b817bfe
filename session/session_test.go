package session_test

import (
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"
	"github.com/stretchr/testify/require"

	"github.com/contstore/contstore/internal/redistest"
	"github.com/contstore/contstore/session"
	"github.com/contstore/contstore/session/sessiontest"
)

// memoryOpener returns an opener of in-process stores on clock, one per
// namespace, mode and TTL: the stores a test opens in one namespace share
// their sessions, as Redis stores do.
func memoryOpener(clock *redistest.Clock, observer session.Observer) sessiontest.Opener {
	shared := map[string]*session.Store{}
	return func(t *testing.T, opts session.Options) *session.Store {
		key := opts.Namespace + opts.Mode.String() + opts.TTL.String()
		if st, ok := shared[key]; ok {
			return st
		}
		opts.Observer = observer
		st, err := session.NewMemoryOnClock(opts, clock.Now)
		require.NoError(t, err)
		shared[key] = st
		return st
	}
}

func TestMemoryConformance(t *testing.T) {
	clock := redistest.NewClock(time.Now())
	sessiontest.Run(t, memoryOpener(clock, nil), clock.Add)
}

// TestMiniredisConformance moves the server's clock: TIME and the keys'
// TTLs.
func TestMiniredisConformance(t *testing.T) {
	mr, _ := redistest.Miniredis(t)
	clock := redistest.ServerClock(mr, time.Now())
	sessiontest.Run(t, func(t *testing.T, opts session.Options) *session.Store {
		c := redis.NewClient(&redis.Options{Addr: mr.Addr()})
		t.Cleanup(func() { _ = c.Close() })
		st, err := session.NewRedis(c, opts)
		require.NoError(t, err)
		return st
	}, clock.Add)
}

func TestMiniredisRueidisConformance(t *testing.T) {
	mr, _ := redistest.Miniredis(t)
	clock := redistest.ServerClock(mr, time.Now())
	sessiontest.Run(t, func(t *testing.T, opts session.Options) *session.Store {
		c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{mr.Addr()}, DisableCache: true})
		require.NoError(t, err)
		t.Cleanup(c.Close)
		st, err := session.NewRueidis(c, opts)
		require.NoError(t, err)
		return st
	}, clock.Add)
}
