package redisconn

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

type ctxKey struct{}

// A call's context under a parent without deadline or cancellation ends at
// its deadline, at most its timeout and less than a tick short of it, and
// carries the parent's values; the calls of one tick share its channel.
func TestSharedDeadlines(t *testing.T) {
	g := NewGuard(1, true, Breakers{Now: time.Now})
	parent := context.WithValue(context.Background(), ctxKey{}, "v")
	const timeout = 30 * time.Millisecond
	start := time.Now()
	ctx, cancel := g.withTimeout(parent, timeout)
	assert.Nil(t, cancel, "nothing to cancel")
	deadline, ok := ctx.Deadline()
	require.True(t, ok)
	assert.False(t, deadline.After(time.Now().Add(timeout)), "at most the timeout")
	assert.True(t, deadline.After(start.Add(timeout-time.Millisecond)), "less than a tick short")
	assert.Equal(t, "v", ctx.Value(ctxKey{}))
	assert.NoError(t, ctx.Err())

	select {
	case <-ctx.Done():
	case <-time.After(time.Second):
		t.Fatal("not done after its deadline")
	}
	assert.False(t, time.Now().Before(deadline), "done at its deadline, not before")
	assert.ErrorIs(t, ctx.Err(), context.DeadlineExceeded)

	a, _ := g.withTimeout(parent, time.Second)
	for {
		b, _ := g.withTimeout(parent, time.Second)
		da, _ := a.Deadline()
		if db, _ := b.Deadline(); db.Equal(da) {
			assert.Equal(t, a.Done(), b.Done(), "one channel per tick")
			break
		}
		a = b // a tick went by between the two
	}
}

// A parent that can end, or a timeout beyond the ticks' span, gets a
// context of its own.
func TestDeadlinesOfTheirOwn(t *testing.T) {
	g := NewGuard(1, true, Breakers{Now: time.Now})
	parent, stop := context.WithCancel(context.Background())
	ctx, cancel := g.withTimeout(parent, time.Minute)
	require.NotNil(t, cancel)
	defer cancel()
	stop()
	<-ctx.Done()
	assert.ErrorIs(t, ctx.Err(), context.Canceled)

	long, cancel := g.withTimeout(context.Background(), g.ticks.span()+time.Millisecond)
	require.NotNil(t, cancel)
	cancel()
	assert.ErrorIs(t, long.Err(), context.Canceled)
}

// A call that runs on a goroutine of its own returns at its timeout,
// whatever the call does, and the calls after it run.
func TestCallsOffTheCallersGoroutine(t *testing.T) {
	g := NewGuard(1, false, Breakers{Now: time.Now})
	release := make(chan struct{})
	start := time.Now()
	_, err := Call(context.Background(), g, 0, 20*time.Millisecond, func(ctx context.Context) (int, error) {
		<-release // ignores ctx
		return 1, nil
	})
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	assert.Less(t, time.Since(start), time.Second)
	close(release)
	for range 3 {
		v, err := Call(context.Background(), g, 0, time.Second, func(ctx context.Context) (int, error) { return 2, nil })
		require.NoError(t, err)
		assert.Equal(t, 2, v)
	}
}
