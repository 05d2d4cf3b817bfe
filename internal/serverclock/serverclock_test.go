package serverclock

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// A server's clock is taken from the closest observation of the last two
// windows, and a clock that steps back is followed once the older
// observations have aged out.
func TestClockFollowsTheServer(t *testing.T) {
	local := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	now := local
	c := New(2, func() time.Time { return now })
	ms := func(d time.Duration) int64 { return d.Milliseconds() }
	base := local.UnixMilli() - EpochMillis

	assert.Equal(t, base+200, c.At(0, now.Add(200*time.Millisecond)), "unknown: this process's clock")

	// Server 0 runs 5 s ahead; replies take 3 ms and 1 ms to arrive.
	c.Observe(0, base+ms(5*time.Second)-3)
	c.Observe(0, base+ms(5*time.Second)-1)
	assert.Equal(t, base+ms(5*time.Second)-1+200, c.At(0, now.Add(200*time.Millisecond)), "the closest observation")
	assert.Equal(t, base+200, c.At(1, now.Add(200*time.Millisecond)), "servers apart")

	// Its clock steps back by 4 s: the old observations count for two windows.
	now = now.Add(1500 * time.Millisecond)
	at := now.UnixMilli() - EpochMillis
	c.Observe(0, at+ms(time.Second))
	assert.Equal(t, at+ms(5*time.Second)-1+200, c.At(0, now.Add(200*time.Millisecond)), "the window before still counts")
	now = now.Add(2100 * time.Millisecond)
	at = now.UnixMilli() - EpochMillis
	c.Observe(0, at+ms(time.Second))
	assert.Equal(t, at+ms(time.Second)+200, c.At(0, now.Add(200*time.Millisecond)), "followed")

	// A seed sets the servers not heard from yet.
	c.Seed(at + ms(time.Minute))
	assert.Equal(t, at+ms(time.Second)+200, c.At(0, now.Add(200*time.Millisecond)), "known already")
	assert.Equal(t, at+ms(time.Minute)+200, c.At(1, now.Add(200*time.Millisecond)), "seeded")
	assert.Equal(t, at+ms(time.Minute)-5000, c.At(1, now.Add(-5*time.Second)), "any instant")
}

// A call's deadline is its context's, at most the limit away; a refusal
// allows a new call only when it came the limit or more after the deadline,
// and sets the server's clock either way.
func TestDeadlinesAndRefusals(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	c := New(1, func() time.Time { return now })
	at := now.UnixMilli() - EpochMillis
	assert.Equal(t, at+200, c.Deadline(context.Background(), 0, 200*time.Millisecond), "no deadline of its own")
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	assert.Equal(t, at+200, c.Deadline(ctx, 0, 200*time.Millisecond), "a later one")
	ctx, cancel = context.WithTimeout(context.Background(), -time.Second)
	defer cancel()
	assert.LessOrEqual(t, c.Deadline(ctx, 0, 200*time.Millisecond), at-1000, "an earlier one")

	assert.False(t, c.Refused(0, at+399, at+200, 200*time.Millisecond), "199 ms past: a copy may have run")
	assert.True(t, c.Refused(0, at+400, at+200, 200*time.Millisecond), "200 ms past: none can have")
	assert.Equal(t, at+400+200, c.Deadline(context.Background(), 0, 200*time.Millisecond), "the refusal's clock")
}
