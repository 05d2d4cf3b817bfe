package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/contstore/contstore/internal/redistest"
	"github.com/contstore/contstore/session"
	"github.com/contstore/contstore/session/sessiontest"
)

// sessionOpener returns a conformance opener whose stores each get a client
// of their own from newClient, as separate replicas would; with rueidis, a
// rueidis client of the same servers.
func sessionOpener(newClient func(t testing.TB) redis.UniversalClient, viaRueidis bool) sessiontest.Opener {
	return func(t *testing.T, opts session.Options) *session.Store {
		c := newClient(t)
		redistest.CleanupNamespace(t, c, opts.Namespace)
		st, err := openSessions(t, c, viaRueidis, opts)
		require.NoError(t, err)
		return st
	}
}

// openSessions opens a session store on c, or on a rueidis client of c's
// servers.
func openSessions(t testing.TB, c redis.UniversalClient, viaRueidis bool, opts session.Options) (*session.Store, error) {
	if !viaRueidis {
		return session.NewRedis(c, opts)
	}
	return session.NewRueidis(rueidisOf(t, c), opts)
}

// The real servers' clocks cannot be moved: the conformance tests that
// need it run on miniredis (package session).
func TestSessionRedisConformance(t *testing.T) {
	sessiontest.Run(t, sessionOpener(standalone, false), nil)
}

func TestSessionClusterConformance(t *testing.T) {
	sessiontest.Run(t, sessionOpener(cluster, false), nil)
}

func TestSessionRueidisConformance(t *testing.T) {
	sessiontest.Run(t, sessionOpener(standalone, true), nil)
}

func TestSessionRueidisClusterConformance(t *testing.T) {
	sessiontest.Run(t, sessionOpener(cluster, true), nil)
}

// Without a replica, a durable save publishes and then says it is not
// durable; with one, it succeeds. The save and WAIT go on one connection to
// the session's master, on either client library and on a cluster.
func TestSaveDurableWaitsForReplicas(t *testing.T) {
	ctx := context.Background()
	replicated := func(t testing.TB) redis.UniversalClient { return redistest.Replicated(t) }
	for _, c := range []struct {
		name   string
		client func(testing.TB) redis.UniversalClient
		want   error
	}{
		{"no replica", standalone, session.ErrNotDurable},
		{"one replica", replicated, nil},
		{"cluster without replicas", cluster, session.ErrNotDurable},
	} {
		for _, viaRueidis := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/rueidis=%v", c.name, viaRueidis), func(t *testing.T) {
				client := c.client(t)
				ns := redistest.Namespace(t)
				redistest.CleanupNamespace(t, client, ns)
				st, err := openSessions(t, client, viaRueidis, session.Options{Namespace: ns, MinReplicas: 1, DurableTimeout: 300 * time.Millisecond})
				require.NoError(t, err)
				s := session.New("m", "", "")
				s.Messages = []json.RawMessage{json.RawMessage(`{"role":"user","content":"hi"}`)}
				err = st.SaveDurable(ctx, s)
				if c.want == nil {
					require.NoError(t, err)
				} else {
					require.ErrorIs(t, err, c.want)
					assert.Contains(t, err.Error(), "0 of 1 replicas")
				}
				assert.Equal(t, uint64(1), s.Version, "the head was published either way")
				got, err := st.Load(ctx, s.ID)
				require.NoError(t, err)
				assert.Equal(t, s.Messages, got.Messages)
			})
		}
	}
}

// BenchmarkSession10kMessages saves (appending one message, or rewriting
// after an edit of the first) and loads a 10,000-message session in both modes on the
// standalone server.
func BenchmarkSession10kMessages(b *testing.B) {
	ctx := context.Background()
	c := redistest.Standalone(b)
	base := session.New("m", "", "")
	for i := range 10_000 {
		base.Messages = append(base.Messages, json.RawMessage(fmt.Sprintf(
			`{"role":"user","content":[{"type":"input_text","text":"message %d of a long conversation, about a hundred bytes long"}]}`, i)))
	}
	for _, mode := range []session.Mode{session.Snapshot, session.Journal} {
		ns := redistest.Namespace(b)
		redistest.CleanupNamespace(b, c, ns)
		st, err := session.NewRedis(c, session.Options{Namespace: ns, Mode: mode})
		require.NoError(b, err)
		s := base.Clone()
		require.NoError(b, st.Save(ctx, s))
		b.Run(mode.String()+"/save-append-1", func(b *testing.B) {
			for b.Loop() {
				s.Messages = append(s.Messages, json.RawMessage(`{"role":"assistant","content":"ok"}`))
				if err := st.Save(ctx, s); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(mode.String()+"/save-rewrite", func(b *testing.B) {
			for i := 0; b.Loop(); i++ {
				s.Messages[0] = json.RawMessage(fmt.Sprintf(`{"role":"user","content":"edit %d"}`, i))
				if err := st.Save(ctx, s); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(mode.String()+"/load", func(b *testing.B) {
			for b.Loop() {
				if _, err := st.Load(ctx, s.ID); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// A real server expires an idle session on its own clock: the conformance
// suite moves miniredis's clock instead, which a real server's does not
// allow. The TTL is short and the margin wide, for a loaded machine.
func TestRealServersExpireIdleSessions(t *testing.T) {
	onRealServers(t, func(t *testing.T, c redis.UniversalClient, ns string) {
		const ttl = 2 * time.Second
		st, err := session.NewRedis(c, session.Options{Namespace: ns, TTL: ttl, OpTimeout: redistest.PatientOpTimeout})
		require.NoError(t, err)
		ctx := context.Background()
		s := session.New("m", "", "")
		require.NoError(t, st.Save(ctx, s))
		_, err = st.Load(ctx, s.ID)
		require.NoError(t, err, "a session lives while younger than its TTL")
		time.Sleep(ttl + 500*time.Millisecond)
		_, err = st.Load(ctx, s.ID)
		assert.ErrorIs(t, err, session.ErrNotFound, "an idle session is gone after its TTL")
	})
}
