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

func sessionOpener(newClient func(t testing.TB) redis.UniversalClient) sessiontest.Opener {
	return func(t *testing.T, opts session.StoreOptions) session.Store {
		c := newClient(t)
		redistest.CleanupNamespace(t, c, opts.Namespace)
		st, err := session.NewRedisStore(c, opts)
		require.NoError(t, err)
		return st
	}
}

func TestSessionRedisConformance(t *testing.T)   { sessiontest.Run(t, sessionOpener(standalone)) }
func TestSessionClusterConformance(t *testing.T) { sessiontest.Run(t, sessionOpener(cluster)) }

// Without a replica, a durable save publishes and then says it is not
// durable; with one, it succeeds.
func TestSaveDurableWaitsForReplicas(t *testing.T) {
	ctx := context.Background()
	for _, c := range []struct {
		name   string
		client func(testing.TB) *redis.Client
		want   error
	}{
		{"no replica", redistest.Standalone, session.ErrNotDurable},
		{"one replica", redistest.Replicated, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			client := c.client(t)
			ns := redistest.Namespace(t)
			redistest.CleanupNamespace(t, client, ns)
			st, err := session.NewRedisStore(client, session.StoreOptions{Namespace: ns, MinReplicas: 1, DurableTimeout: 300 * time.Millisecond})
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
		st, err := session.NewRedisStore(c, session.StoreOptions{Namespace: ns, Mode: mode})
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
