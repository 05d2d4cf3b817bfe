package embedded_test

import (
	"context"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/contstore/contstore/internal/embedded"
	"github.com/contstore/contstore/internal/redistest"
)

func TestKeysExpireWithTheWallClock(t *testing.T) {
	mr := miniredis.RunT(t)
	stop := embedded.FollowRealTime(mr)
	defer stop()
	require.NoError(t, mr.Set("k", "v"))
	mr.SetTTL("k", 50*time.Millisecond)
	assert.True(t, mr.Exists("k"))
	assert.Eventually(t, func() bool { return !mr.Exists("k") }, 2*time.Second, 10*time.Millisecond)
}

// A starved process (one P, busy goroutines beside the server's) runs
// commands late; TIME, in a command or in a script, still reads no earlier
// than the moment the command was sent.
func TestTimeNeverLagsInAStarvedProcess(t *testing.T) {
	mr := miniredis.RunT(t)
	t.Cleanup(embedded.FollowRealTime(mr))
	c := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { _ = c.Close() })

	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	stop := redistest.Burn(3)
	defer stop()

	ctx := context.Background()
	script := redis.NewScript(`return redis.call('TIME')`)
	for i := range 60 {
		sent := time.Now().Truncate(time.Microsecond)
		var got []any
		var err error
		if i%2 == 0 {
			got, err = c.Do(ctx, "TIME").Slice()
		} else {
			got, err = script.Run(ctx, c, nil).Slice()
		}
		require.NoError(t, err)
		server := serverTime(t, got)
		require.False(t, server.Before(sent), "call %d: the server read %s for a command sent at %s",
			i, server.Format(time.StampMicro), sent.Format(time.StampMicro))
	}
}

// serverTime reads a TIME reply (seconds and microseconds, as strings in a
// command's reply and as integers in a script's).
func serverTime(t *testing.T, reply []any) time.Time {
	t.Helper()
	require.Len(t, reply, 2)
	var v [2]int64
	for i, x := range reply {
		switch x := x.(type) {
		case string:
			n, err := strconv.ParseInt(x, 10, 64)
			require.NoError(t, err)
			v[i] = n
		case int64:
			v[i] = x
		default:
			t.Fatalf("TIME answered %T", x)
		}
	}
	return time.Unix(v[0], v[1]*1000)
}
