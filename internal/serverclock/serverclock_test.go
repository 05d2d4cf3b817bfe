package serverclock

import (
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
	c.Observe(0, base+ms(5*time.Second)-3, now)
	c.Observe(0, base+ms(5*time.Second)-1, now)
	assert.Equal(t, base+ms(5*time.Second)-1+200, c.At(0, now.Add(200*time.Millisecond)), "the closest observation")
	assert.Equal(t, base+200, c.At(1, now.Add(200*time.Millisecond)), "servers apart")

	// Its clock steps back by 4 s: the old observations count for two windows.
	now = now.Add(1500 * time.Millisecond)
	at := now.UnixMilli() - EpochMillis
	c.Observe(0, at+ms(time.Second), now)
	assert.Equal(t, at+ms(5*time.Second)-1+200, c.At(0, now.Add(200*time.Millisecond)), "the window before still counts")
	now = now.Add(2100 * time.Millisecond)
	at = now.UnixMilli() - EpochMillis
	c.Observe(0, at+ms(time.Second), now)
	assert.Equal(t, at+ms(time.Second)+200, c.At(0, now.Add(200*time.Millisecond)), "followed")

	// A seed sets the servers not heard from yet.
	c.Seed(at+ms(time.Minute), now)
	assert.Equal(t, at+ms(time.Second)+200, c.At(0, now.Add(200*time.Millisecond)), "known already")
	assert.Equal(t, at+ms(time.Minute)+200, c.At(1, now.Add(200*time.Millisecond)), "seeded")
	assert.Equal(t, at+ms(time.Minute)-5000, c.At(1, now.Add(-5*time.Second)), "any instant")
}
