package session_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/contstore/contstore/internal/lua"
	"github.com/contstore/contstore/internal/redistest"
	"github.com/contstore/contstore/session"
)

var ctx = context.Background()

func TestCorruptSessionIsReportedByName(t *testing.T) {
	mr, c := redistest.Miniredis(t)
	st, err := session.NewRedis(c, session.Options{Namespace: "ns"})
	require.NoError(t, err)
	for name, fields := range map[string][]string{
		"bad-json":      {"v", "3", "d", `{"id":`},
		"wrong-id":      {"v", "1", "d", `{"id":"someone-else"}`},
		"bad-version":   {"v", "x", "d", `{"id":"bad-version"}`},
		"short-journal": {"v", "1", "h", `{"id":"short-journal"}`, "n", "4"},
		"no-document":   {"v", "1"},
	} {
		t.Run(name, func(t *testing.T) {
			mr.HSet("ns:{ns:"+name+"}:head", fields...)
			_, err := st.Load(ctx, name)
			require.ErrorIs(t, err, session.ErrCorrupt)
			assert.Contains(t, err.Error(), fmt.Sprintf("%q", name))
		})
	}
}

// argumentBytes returns a hook that adds the bytes of the arguments of
// every command to n.
func argumentBytes(n *atomic.Int64) redistest.CommandHook {
	return func(cmd redis.Cmder) {
		for _, a := range cmd.Args() {
			switch v := a.(type) {
			case string:
				n.Add(int64(len(v)))
			case []byte:
				n.Add(int64(len(v)))
			}
		}
	}
}

// A journal save of a long session sends the new messages, not the history.
func TestJournalSavesWriteOnlyNewMessages(t *testing.T) {
	_, c := redistest.Miniredis(t)
	var sent atomic.Int64
	c.AddHook(argumentBytes(&sent))
	st, err := session.NewRedis(c, session.Options{Namespace: "j", Mode: session.Journal})
	require.NoError(t, err)
	s := session.New("m", "", "")
	for i := range 2000 {
		s.Messages = append(s.Messages, json.RawMessage(fmt.Sprintf(`{"role":"user","content":"message %d of a long history, padded to look like a real one"}`, i)))
	}
	history := int64(0)
	for _, m := range s.Messages {
		history += int64(len(m))
	}
	require.NoError(t, st.Save(ctx, s))
	first := sent.Swap(0) // EVALSHA, then EVAL after NOSCRIPT

	perSave := make([]int64, 5)
	for i := range perSave {
		s.Messages = append(s.Messages, json.RawMessage(fmt.Sprintf(`{"role":"assistant","content":"reply %d"}`, i)))
		require.NoError(t, st.Save(ctx, s))
		perSave[i] = sent.Swap(0)
	}
	t.Logf("history %d bytes; first save sent %d, appends %v", history, first, perSave)
	for _, n := range perSave {
		assert.Less(t, n, history/100, "an append sends a small fraction of the history")
	}
	got, err := st.Load(ctx, s.ID)
	require.NoError(t, err)
	assert.Equal(t, 2005, len(got.Messages), "messages loaded")

	// An edit of history rewrites: it sends everything again.
	s.Messages[0] = json.RawMessage(`{"role":"user","content":"edited"}`)
	require.NoError(t, st.Save(ctx, s))
	assert.Greater(t, sent.Swap(0), history)
	got, err = st.Load(ctx, s.ID)
	require.NoError(t, err)
	assert.Equal(t, `{"role":"user","content":"edited"}`, string(got.Messages[0]))
}

func TestOptionsAreValidated(t *testing.T) {
	for _, o := range []session.Options{
		{Namespace: "a{b"}, {Mode: 7}, {TTL: -1}, {MinReplicas: -1}, {OpTimeout: -1}, {OpTimeout: 2 * time.Hour},
		{BreakerFailures: -2}, {BreakerCooldown: -1},
	} {
		_, err := session.NewMemory(o)
		assert.ErrorIs(t, err, session.ErrInvalid, "%+v", o)
		_, err = session.NewRedis(redis.NewClient(&redis.Options{}), o)
		assert.ErrorIs(t, err, session.ErrInvalid, "%+v", o)
	}
	_, err := session.NewRedis(nil, session.Options{})
	assert.ErrorIs(t, err, session.ErrInvalid)
	_, err = session.NewRueidis(nil, session.Options{})
	assert.ErrorIs(t, err, session.ErrInvalid)
}

// A save whose reply is lost after it wrote, re-sent by the client after
// another writer saved on top, answers the version it wrote instead of a
// conflict: a writer that reloaded and applied its change again would apply
// it twice.
func TestLostSaveReplyAnswersTheVersionWritten(t *testing.T) {
	for _, mode := range []session.Mode{session.Snapshot, session.Journal} {
		t.Run(fmt.Sprint(mode), func(t *testing.T) {
			mr, plain := redistest.Miniredis(t)
			for _, s := range lua.All() {
				require.NoError(t, plain.ScriptLoad(ctx, s.Source).Err())
			}
			loss := &redistest.ReplyLoss{}
			lossy := redis.NewClient(&redis.Options{Addr: mr.Addr(), MaxRetries: 1, Dialer: loss.Dial})
			t.Cleanup(func() { _ = lossy.Close() })
			opts := session.Options{Namespace: "lost", Mode: mode}
			a, err := session.NewRedis(lossy, opts)
			require.NoError(t, err)
			b, err := session.NewRedis(plain, opts)
			require.NoError(t, err)

			s := session.New("m", "", "")
			s.Messages = append(s.Messages, json.RawMessage(`{"role":"user","content":"one"}`))
			require.NoError(t, a.Save(ctx, s))
			s.Messages = append(s.Messages, json.RawMessage(`{"role":"user","content":"two"}`))
			loss.Lose(1, redistest.Calling(lua.SessionSave), func() {
				other, err := b.Load(ctx, s.ID)
				require.NoError(t, err)
				other.Messages = append(other.Messages, json.RawMessage(`{"role":"user","content":"three"}`))
				require.NoError(t, b.Save(ctx, other))
			})
			require.NoError(t, a.Save(ctx, s), "the re-sent save answers as its first run did")
			require.Equal(t, int64(1), loss.Lost())
			assert.Equal(t, uint64(2), s.Version)
			got, err := b.Load(ctx, s.ID)
			require.NoError(t, err)
			assert.Equal(t, uint64(3), got.Version, "the other writer's save stands")
			assert.Len(t, got.Messages, 3)
		})
	}
}

// Redis expires a session with its keys' TTL on the server's clock: every
// save sets head and log to the TTL (and a store without one keeps them),
// and nothing stores an expiry of its own.
func TestServerClockExpiresSessionsWithTheKeysTTL(t *testing.T) {
	mr, c := redistest.Miniredis(t)
	clock := redistest.ServerClock(mr, time.Now())
	const ttl = time.Hour
	for _, mode := range []session.Mode{session.Snapshot, session.Journal} {
		t.Run(mode.String(), func(t *testing.T) {
			ns := "ns-" + mode.String()
			st, err := session.NewRedis(c, session.Options{Namespace: ns, Mode: mode, TTL: ttl})
			require.NoError(t, err)
			s := session.New("m", "", "")
			s.Messages = []json.RawMessage{json.RawMessage(`{"role":"user","content":"hi"}`)}
			require.NoError(t, st.Save(ctx, s))
			head := ns + ":{" + ns + ":" + s.ID + "}:head"
			keys := []string{head}
			if mode == session.Journal {
				keys = append(keys, ns+":{"+ns+":"+s.ID+"}:log")
			}
			for _, k := range keys {
				require.True(t, mr.Exists(k), k)
				assert.Equal(t, ttl, mr.TTL(k), k)
			}
			fields, err := c.HKeys(ctx, head).Result()
			require.NoError(t, err)
			want := []string{"v", "d"}
			if mode == session.Journal {
				want = []string{"v", "h", "n"}
			}
			assert.ElementsMatch(t, want, fields, "no expiry field")

			clock.Add(ttl - time.Millisecond)
			_, err = st.Load(ctx, s.ID)
			require.NoError(t, err, "a millisecond before the TTL")
			clock.Add(time.Millisecond)
			_, err = st.Load(ctx, s.ID)
			require.ErrorIs(t, err, session.ErrNotFound, "at the TTL")

			forever, err := session.NewRedis(c, session.Options{Namespace: ns, Mode: mode})
			require.NoError(t, err)
			s.Version = 0
			require.NoError(t, forever.Save(ctx, s))
			for _, k := range keys {
				require.True(t, mr.Exists(k), k)
				assert.Zero(t, mr.TTL(k), "%s is kept", k)
			}
		})
	}
}

// A save that reaches Redis after its deadline writes nothing. When the
// refusal comes OpTimeout or more after the deadline (the store's estimate
// of the server's clock was that far behind, so no copy of the save can
// have run in time), the store learns the server's clock and sends the save
// once more as a new call, which publishes; a refusal closer to the
// deadline is an error.
func TestASaveRefusedForItsDeadline(t *testing.T) {
	for _, c := range []struct {
		name   string
		ahead  time.Duration // how far the server's clock is ahead of this process's, fixed
		sends  int
		stored bool
	}{
		{"less than OpTimeout past it: an error", 15 * time.Second, 1, false},
		{"an hour past it: sent once more", time.Hour, 2, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			mr, client := redistest.Miniredis(t)
			mr.SetTime(time.Now().Add(c.ahead))
			var sends atomic.Int64
			client.AddHook(redistest.CommandHook(func(cmd redis.Cmder) {
				if args := cmd.Args(); len(args) > 1 && args[1] == lua.SessionSave.Hash() {
					sends.Add(1)
				}
			}))
			// A deadline is OpTimeout after the save starts: in the first
			// case the save reaches the server up to 5 s past it (less as
			// this process is slower), less than OpTimeout.
			st, err := session.NewRedis(client, session.Options{Namespace: "late", OpTimeout: 10 * time.Second})
			require.NoError(t, err)
			s := session.New("m", "", "")
			err = st.Save(ctx, s)
			assert.Equal(t, int64(c.sends), sends.Load(), "saves sent")
			_, loadErr := st.Load(ctx, s.ID)
			if c.stored {
				require.NoError(t, err)
				require.NoError(t, loadErr)
				assert.Equal(t, uint64(1), s.Version)
				return
			}
			require.ErrorIs(t, err, session.ErrUnavailable)
			assert.Contains(t, err.Error(), "after its deadline")
			assert.Zero(t, s.Version)
			require.ErrorIs(t, loadErr, session.ErrNotFound, "the refused save wrote nothing")
		})
	}
}
